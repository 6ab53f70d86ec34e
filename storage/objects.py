"""The object store: where artifacts (traces, raw outputs, datasets, checkpoints, docs) live.

Two implementations pass one contract test suite: `LocalObjectStore` (a directory, the
default) and `S3ObjectStore` (any S3 through the `minio` SDK: MinIO in production).
Keys are `/`-separated relative paths: `episodes/<run>/<episode>/trajectory.json`.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from storage.errors import (
    BucketMissing,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreUnavailable,
    StorageError,
)
from storage.settings import ObjectStoreSettings

SETTING = "EPIFLOW_OBJECTS_URL"
T = TypeVar("T")


class ObjectInfo(BaseModel):
    """What was written: key, size and sha256 (stored on the `artifact` row)."""

    model_config = ConfigDict(frozen=True)

    key: str
    """The object's key."""
    size: int
    """Size in bytes."""
    sha256: str
    """sha256 of the content."""
    content_type: str = "application/octet-stream"
    """MIME type."""


def validate_key(key: str) -> str:
    """Keys are relative POSIX paths without `..`, empty parts or a leading slash."""
    parts = key.split("/")
    if (
        not key
        or "\x00" in key
        or any(p in ("..", ".", "") for p in parts[:-1])
        or parts[-1] in ("..", ".")
    ):
        raise ValueError(
            f"invalid object key {key!r}: use a relative path like 'episodes/run/x.json'"
        )
    return key


class ObjectStore(ABC):
    """Put, get, list and delete objects by key."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the store is (a directory or s3://bucket/prefix), for messages. No secrets."""

    @abstractmethod
    def check(self) -> None:
        """Verify the store is usable (reachable, bucket exists, directory writable).

        Raises:
            ObjectStoreUnavailable: unreachable, bad credentials or not writable.
            BucketMissing: the S3 bucket does not exist.
        """

    @abstractmethod
    def put(
        self, key: str, data: bytes, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        """Write `data` under `key` atomically (readers never see a partial object).

        Raises:
            ObjectStoreError: the write failed after retries.
        """

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Read an object.

        Raises:
            ObjectNotFound: no object under `key`.
            ObjectStoreError: the read failed after retries.
        """

    @abstractmethod
    def exists(self, key: str) -> bool:
        """True when an object exists under `key`."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under `prefix`, in lexical order."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete an object; deleting a missing key is not an error."""

    def put_file(
        self, key: str, path: Path, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        """Upload a local file."""
        return self.put(key, path.read_bytes(), content_type=content_type)

    def put_tree(self, prefix: str, root: Path) -> builtins.list[ObjectInfo]:
        """Upload every regular file under `root` (symlinks are skipped) below `prefix`."""
        infos = []
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink():
                rel = path.relative_to(root).as_posix()
                infos.append(self.put_file(f"{prefix.rstrip('/')}/{rel}", path))
        return infos

    def get_tree(self, prefix: str, dest: Path) -> builtins.list[Path]:
        """Download every object under `prefix` into `dest`, keeping relative paths."""
        written = []
        base = prefix.rstrip("/") + "/"
        for key in self.list(base):
            target = dest / key[len(base) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.get(key))
            written.append(target)
        return written


def _info(key: str, data: bytes, content_type: str) -> ObjectInfo:
    return ObjectInfo(
        key=key, size=len(data), sha256=hashlib.sha256(data).hexdigest(), content_type=content_type
    )


class LocalObjectStore(ObjectStore):
    """Objects as files under a directory; writes go through a temp file and a rename."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def location(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".probe-"):
                pass
        except OSError as e:
            raise ObjectStoreUnavailable(
                f"the object directory {self.root} is not writable: {e.strerror}", setting=SETTING
            ) from e

    def put(
        self, key: str, data: bytes, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                Path(tmp).replace(path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            raise ObjectStoreUnavailable(
                f"cannot write object {key} under {self.root}: {e.strerror}", setting=SETTING
            ) from e
        return _info(key, data, content_type)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as e:
            raise ObjectNotFound(f"no object {key} in {self.root}") from e
        except OSError as e:
            raise ObjectStoreUnavailable(
                f"cannot read object {key}: {e.strerror}", setting=SETTING
            ) from e

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> Iterator[str]:
        if not self.root.is_dir():
            return iter(())
        keys = []
        for path in self.root.rglob("*"):
            if path.is_file() and not path.name.startswith((".tmp-", ".probe-")):
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return iter(sorted(keys))

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class S3ObjectStore(ObjectStore):
    """Objects in an S3 bucket through the `minio` SDK (MinIO, or any S3 service).

    Transient failures (connection errors, 5xx) are retried with exponential backoff;
    credentials and the bucket are never retried: they need a settings fix.
    """

    def __init__(self, settings: ObjectStoreSettings) -> None:
        import certifi
        import urllib3
        from minio import Minio

        if not settings.endpoint:
            raise ObjectStoreUnavailable(
                "EPIFLOW_OBJECTS_URL is s3://… but no endpoint is set",
                setting="EPIFLOW_OBJECTS_ENDPOINT",
            )
        self.bucket, self.prefix = settings.bucket_and_prefix()
        self.settings = settings
        self.client = Minio(
            settings.endpoint,
            access_key=settings.access_key.get_secret_value() if settings.access_key else None,
            secret_key=settings.secret_key.get_secret_value() if settings.secret_key else None,
            secure=settings.secure,
            region=settings.region,
            # Retries live in `_retry` (typed errors, our backoff); urllib3's own retries
            # would multiply them and stall an outage for minutes.
            http_client=urllib3.PoolManager(
                maxsize=32,
                timeout=urllib3.Timeout(connect=5.0, read=120.0),
                retries=urllib3.Retry(total=0, redirect=0),
                cert_reqs="CERT_REQUIRED",
                ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
            ),
        )

    @property
    def location(self) -> str:
        scheme = "https" if self.settings.secure else "http"
        return f"s3://{self.bucket}/{self.prefix} at {scheme}://{self.settings.endpoint}"

    def _full(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        from minio.error import S3Error
        from urllib3.exceptions import HTTPError

        delay = self.settings.backoff_s
        attempts = self.settings.retries + 1
        for attempt in range(attempts):
            try:
                return fn()
            except S3Error as e:
                raise self._s3_error(what, e) from e
            except (HTTPError, OSError) as e:
                if attempt == attempts - 1:
                    raise ObjectStoreUnavailable(
                        f"{what} failed after {attempts} attempts: cannot reach {self.location} ({type(e).__name__})",
                        setting="EPIFLOW_OBJECTS_ENDPOINT",
                    ) from e
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _s3_error(self, what: str, e: Exception) -> StorageError:
        code = getattr(e, "code", "")
        if code == "NoSuchBucket":
            return BucketMissing(
                f"the bucket {self.bucket!r} does not exist at {self.settings.endpoint}",
                setting=SETTING,
            )
        if code in ("NoSuchKey", "NoSuchObject"):
            return ObjectNotFound(f"{what}: no such object")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return ObjectStoreUnavailable(
                f"{what}: the S3 credentials were refused ({code})",
                setting="EPIFLOW_OBJECTS_ACCESS_KEY / EPIFLOW_OBJECTS_SECRET_KEY",
            )
        return ObjectStoreError(f"{what} failed: S3 error {code}")

    def check(self) -> None:
        exists = self._retry("bucket check", lambda: self.client.bucket_exists(self.bucket))
        if not exists:
            raise BucketMissing(
                f"the bucket {self.bucket!r} does not exist at {self.settings.endpoint}; create it "
                f"(e.g. `mc mb`) or fix EPIFLOW_OBJECTS_URL",
                setting=SETTING,
            )

    def put(
        self, key: str, data: bytes, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        name = self._full(key)
        self._retry(
            f"upload of {key}",
            lambda: self.client.put_object(
                self.bucket, name, io.BytesIO(data), len(data), content_type=content_type
            ),
        )
        return _info(key, data, content_type)

    def get(self, key: str) -> bytes:
        name = self._full(key)

        def read() -> bytes:
            response = self.client.get_object(self.bucket, name)
            try:
                return bytes(response.read())
            finally:
                response.close()
                response.release_conn()

        return self._retry(f"download of {key}", read)

    def exists(self, key: str) -> bool:
        from minio.error import S3Error

        try:
            self.client.stat_object(self.bucket, self._full(key))
        except S3Error as e:
            if e.code in ("NoSuchKey", "NoSuchObject", "ResourceNotFound"):
                return False
            raise self._s3_error(f"stat of {key}", e) from e
        return True

    def list(self, prefix: str = "") -> Iterator[str]:
        full = self._full(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        if prefix.endswith("/") and not full.endswith("/"):
            full += "/"
        strip = len(self.prefix) + 1 if self.prefix else 0
        objects = self._retry(
            f"listing of {prefix or '/'}",
            lambda: list(self.client.list_objects(self.bucket, prefix=full, recursive=True)),
        )
        return iter(sorted(str(o.object_name)[strip:] for o in objects))

    def delete(self, key: str) -> None:
        name = self._full(key)
        self._retry(f"delete of {key}", lambda: self.client.remove_object(self.bucket, name))


def make_object_store(settings: ObjectStoreSettings) -> ObjectStore:
    """The store the settings describe (not yet checked: call `check()`)."""
    if settings.is_s3:
        return S3ObjectStore(settings)
    return LocalObjectStore(settings.local_root())
