"""Storage errors. Each names the setting to fix, so the CLI can print one line and exit 2.

StorageError
├── DatabaseError
│   ├── DatabaseUnavailable     cannot connect / authenticate (EPIFLOW_DATABASE_URL)
│   └── SchemaOutdated          the database is behind the code (run `epiflow db upgrade`)
├── ObjectStoreError
│   ├── ObjectStoreUnavailable  endpoint unreachable, bad credentials, directory unwritable
│   ├── BucketMissing           the configured bucket does not exist
│   └── ObjectNotFound          a key that should exist does not
├── IngestError                 a batch could not be written; nothing of it was committed
├── RunNotFound                 no collection run has that key or id
├── RunKeyBusy                  another process is collecting the same run key right now
└── ImportFormatError           a file to import is not the format it claims
"""

from __future__ import annotations

from core.errors import EpiflowError


class StorageError(EpiflowError):
    """Base of every storage failure; `setting` names the variable to look at."""


class DatabaseError(StorageError):
    """The SQL database cannot be used."""


class DatabaseUnavailable(DatabaseError):
    """Connecting or authenticating to the database failed."""


class SchemaOutdated(DatabaseError):
    """The database schema revision is not the one this code expects."""


class ObjectStoreError(StorageError):
    """The object store cannot be used."""


class ObjectStoreUnavailable(ObjectStoreError):
    """The object store endpoint or directory cannot be reached or written."""


class BucketMissing(ObjectStoreError):
    """The configured S3 bucket does not exist."""


class ObjectNotFound(ObjectStoreError):
    """A key that was expected in the object store is not there."""


class IngestError(StorageError):
    """A batch of episodes could not be written; the transaction was rolled back."""


class RunNotFound(StorageError):
    """No collection run has the given key or id."""


class RunKeyBusy(StorageError):
    """Another process holds the run key's lock: it is collecting the same run now."""


class ImportFormatError(StorageError):
    """A file to import is not valid in the format it was imported as."""
