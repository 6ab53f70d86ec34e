"""Storage errors. Each names the setting to fix, so the CLI can print one line and exit 2.

StorageError
├── DatabaseError
│   ├── DatabaseUnavailable     cannot connect / authenticate (EPIFLOW_DATABASE_URL)
│   └── SchemaOutdated          the database is behind the code (run `epiflow db upgrade`)
├── ObjectStoreError
│   ├── ObjectStoreUnavailable  endpoint unreachable, bad credentials, directory unwritable
│   ├── BucketMissing           the configured bucket does not exist
│   └── ObjectNotFound          a key that should exist does not
└── IngestError                 a batch could not be written; nothing of it was committed
"""

from __future__ import annotations


class StorageError(Exception):
    """Base of every storage failure.

    `setting` names the environment variable a user should look at, when one is at fault.
    Messages never contain secrets (URLs are redacted before they get here).
    """

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting

    def user_message(self) -> str:
        """One line for the CLI: the problem and the setting to fix."""
        text = str(self).splitlines()[0] if str(self) else type(self).__name__
        if self.setting and self.setting not in text:
            text = f"{text} (check {self.setting})"
        return text


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
