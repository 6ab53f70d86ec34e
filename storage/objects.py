"""The object store: where objects (traces, raw outputs, datasets, checkpoints, docs) live.

Two implementations pass one contract test suite: `LocalObjectStore` (a directory, the
default) and `S3ObjectStore` (any S3 through the `minio` SDK: MinIO in production).
Keys are `/`-separated relative paths: `episodes/<run>/<episode>/trajectory.json`.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import os
import shutil
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar
from xml.etree.ElementTree import ParseError

from pydantic import BaseModel, ConfigDict

from storage.errors import (
    BucketMissing,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreUnavailable,
    StorageError,
)
from storage.retry import describe, is_transient, retrying
from storage.settings import ObjectStoreSettings

SETTING = "EPIFLOW_OBJECTS_URL"
T = TypeVar("T")


class ObjectInfo(BaseModel):
    """What was written: key, size and sha256 (an episode's object: also on its `artifact` row)."""

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

    @abstractmethod
    def put_file(
        self, key: str, path: Path, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        """Upload a local file, streamed: memory stays flat whatever its size.

        Raises:
            ObjectStoreError: the upload failed after retries, or `path` cannot be read.
        """

    @abstractmethod
    def get_file(self, key: str, dest: Path) -> Path:
        """Download an object into `dest`, streamed; `dest` appears whole or not at all.

        Raises:
            ObjectNotFound: no object under `key`.
            ObjectStoreError: the download failed after retries, or `dest` cannot be written.
        """

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
            written.append(self.get_file(key, dest / key[len(base) :]))
        return written


def _info(key: str, data: bytes, content_type: str) -> ObjectInfo:
    return ObjectInfo(
        key=key, size=len(data), sha256=hashlib.sha256(data).hexdigest(), content_type=content_type
    )


def _file_info(key: str, path: Path, content_type: str) -> ObjectInfo:
    """Size and sha256 of a local file, read in chunks (never whole into memory)."""
    try:
        with path.open("rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        size = path.stat().st_size
    except OSError as e:
        raise ObjectStoreError(f"cannot read {path} to upload it as {key}: {e.strerror}") from e
    return ObjectInfo(key=key, size=size, sha256=digest, content_type=content_type)


def _temp_beside(dest: Path) -> Path:
    """A hidden temp name in `dest`'s folder, so the final rename stays on one filesystem."""
    return dest.parent / f".tmp-{dest.name}-{uuid.uuid4().hex[:8]}"


def _copy_whole(source: Path, dest: Path) -> None:
    """Copy through a temp file and a rename: readers of `dest` never see half of it.

    Raises:
        OSError: reading `source` or writing beside `dest` failed; nothing is left behind.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(dest)
    try:
        shutil.copyfile(source, tmp)
        tmp.replace(dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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

    def put_file(
        self, key: str, path: Path, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        target = self._path(key)
        info = _file_info(key, path, content_type)
        try:
            _copy_whole(path, target)
        except OSError as e:
            raise ObjectStoreUnavailable(
                f"cannot write object {key} under {self.root}: {e.strerror}", setting=SETTING
            ) from e
        return info

    def get_file(self, key: str, dest: Path) -> Path:
        source = self._path(key)
        if not source.is_file():
            raise ObjectNotFound(f"no object {key} in {self.root}")
        try:
            _copy_whole(source, dest)
        except OSError as e:
            raise ObjectStoreError(f"cannot copy object {key} to {dest}: {e.strerror}") from e
        return dest

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

    Every call (listing included) retries transient failures (dropped connections, 5xx such
    as `SlowDown`, non-XML 5xx pages from a load balancer, unparseable answers) with
    exponential backoff and jitter, logging each retry (policy in `storage.retry`), within
    the operation's deadline (`deadline_s`; `check_deadline_s` for the startup bucket
    check); each request waits at most `connect_timeout_s` to connect and `read_timeout_s`
    for each answer. After the last attempt it raises `ObjectStoreUnavailable`.
    Credentials, a missing bucket and a missing key are never retried: they need a fix.
    Files move streamed (`fput_object`, multipart past 5 MiB; `fget_object`).
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
        access_key, secret_key = settings.access_key, settings.secret_key
        has_keys = access_key is not None and secret_key is not None
        if not has_keys and not settings.anonymous:
            # Unsigned requests would reach the bucket as an anonymous user and fail later
            # with a puzzling AccessDenied, or worse, succeed against a public bucket.
            raise ObjectStoreUnavailable(
                "EPIFLOW_OBJECTS_URL is s3://… but EPIFLOW_OBJECTS_ACCESS_KEY and "
                "EPIFLOW_OBJECTS_SECRET_KEY are not both set (set EPIFLOW_OBJECTS_ANONYMOUS=true "
                "for a public bucket)",
                setting="EPIFLOW_OBJECTS_ACCESS_KEY / EPIFLOW_OBJECTS_SECRET_KEY",
            )
        self.bucket, self.prefix = settings.bucket_and_prefix()
        self.settings = settings

        def client(read_timeout_s: float) -> Minio:
            return Minio(
                str(settings.endpoint),
                access_key=access_key.get_secret_value() if access_key and has_keys else None,
                secret_key=secret_key.get_secret_value() if secret_key and has_keys else None,
                secure=settings.secure,
                region=settings.region,
                # Retries live in `_retry` (typed errors, jitter, a log line each, a
                # deadline); urllib3's own retries would multiply them and stall an outage.
                http_client=urllib3.PoolManager(
                    maxsize=32,
                    timeout=urllib3.Timeout(
                        connect=settings.connect_timeout_s, read=read_timeout_s
                    ),
                    retries=urllib3.Retry(total=0, redirect=0),
                    cert_reqs="CERT_REQUIRED",
                    ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
                ),
            )

        self.client = client(settings.read_timeout_s)
        # The startup probe answers fast or not at all: its wait is bounded by its deadline.
        self.probe_client = client(min(settings.read_timeout_s, settings.check_deadline_s))

    @property
    def location(self) -> str:
        scheme = "https" if self.settings.secure else "http"
        return f"s3://{self.bucket}/{self.prefix} at {scheme}://{self.settings.endpoint}"

    def _full(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _retry(self, what: str, fn: Callable[[], T], *, deadline_s: float | None = None) -> T:
        """`fn()` under the retry policy; every SDK failure leaves as a `StorageError`."""
        from minio.error import MinioException
        from urllib3.exceptions import HTTPError

        deadline = self.settings.deadline_s if deadline_s is None else deadline_s
        policy = retrying(
            what,
            attempts=self.settings.retries + 1,
            backoff_s=self.settings.backoff_s,
            backoff_max_s=self.settings.backoff_max_s,
            deadline_s=deadline,
        )
        try:
            return policy(fn)
        except (MinioException, HTTPError, OSError, ParseError) as e:
            if is_transient(e):
                made = int(policy.statistics.get("attempt_number", 1))
                raise ObjectStoreUnavailable(
                    f"{what} failed after {made} attempt{'s' if made != 1 else ''} "
                    f"(deadline {deadline:g} s): {self.location} answered {describe(e)}",
                    setting="EPIFLOW_OBJECTS_ENDPOINT",
                ) from e
            if isinstance(e, MinioException | HTTPError):
                raise self._s3_error(what, e) from e
            raise  # a local file error: the caller names the file

    def _s3_error(self, what: str, e: Exception) -> StorageError:
        from minio.error import S3Error

        if not isinstance(e, S3Error):
            # A TLS failure or a non-XML 4xx: nothing a retry could change.
            return ObjectStoreUnavailable(
                f"{what} failed: {self.location} answered {describe(e)}",
                setting="EPIFLOW_OBJECTS_ENDPOINT / EPIFLOW_OBJECTS_SECURE",
            )
        code = e.code or ""
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
        exists = self._retry(
            "bucket check",
            lambda: self.probe_client.bucket_exists(self.bucket),
            deadline_s=self.settings.check_deadline_s,
        )
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
        # A fresh stream per attempt: a retry must send the body from its first byte.
        self._retry(
            f"upload of {key}",
            lambda: self.client.put_object(
                self.bucket, name, io.BytesIO(data), len(data), content_type=content_type
            ),
        )
        return _info(key, data, content_type)

    def put_file(
        self, key: str, path: Path, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        name = self._full(key)
        info = _file_info(key, path, content_type)
        # fput_object reopens the file on each attempt and sends it in parts of at least
        # 5 MiB (at most 3 in flight), so memory does not grow with the file.
        try:
            self._retry(
                f"upload of {key}",
                lambda: self.client.fput_object(
                    self.bucket, name, str(path), content_type=content_type
                ),
            )
        except OSError as e:
            raise ObjectStoreError(f"cannot read {path} to upload it as {key}: {e.strerror}") from e
        return info

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

    def get_file(self, key: str, dest: Path) -> Path:
        name = self._full(key)
        tmp = _temp_beside(dest)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            # Streams in 1 MiB chunks to `tmp`, then renames it onto `dest`.
            self._retry(
                f"download of {key}",
                lambda: self.client.fget_object(
                    self.bucket, name, str(dest), tmp_file_path=str(tmp)
                ),
            )
        except OSError as e:
            raise ObjectStoreError(f"cannot write object {key} to {dest}: {e.strerror}") from e
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    def exists(self, key: str) -> bool:
        try:
            self._retry(
                f"stat of {key}", lambda: self.client.stat_object(self.bucket, self._full(key))
            )
        except ObjectNotFound:
            return False
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


def object_url(store: ObjectStore, key: str) -> str:
    """The object's address, for links (the Prefect UI's link artifacts): `file://…` in a
    local store, the bucket's HTTP(S) path (`http://endpoint/bucket/prefix/key`) in an S3
    store; opening it needs the store's access (the same machine, or S3 credentials)."""
    if isinstance(store, S3ObjectStore):
        scheme = "https" if store.settings.secure else "http"
        host = store.settings.endpoint or "s3.amazonaws.com"
        return f"{scheme}://{host}/{store.bucket}/{store._full(key)}"
    if isinstance(store, LocalObjectStore):
        return store._path(key).resolve().as_uri()
    return f"{store.location}/{key}"
