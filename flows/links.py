"""Addresses for the Prefect UI's link artifacts: where a stored object is."""

from __future__ import annotations

from storage.objects import LocalObjectStore, ObjectStore, S3ObjectStore


def object_url(store: ObjectStore, key: str) -> str:
    """The object's address: `file://…` in a local store, the bucket's HTTP(S) path
    (`http://endpoint/bucket/prefix/key`) in an S3 store; opening it needs the store's
    access (a browser on the same machine, or S3 credentials)."""
    if isinstance(store, S3ObjectStore):
        scheme = "https" if store.settings.secure else "http"
        host = store.settings.endpoint or "s3.amazonaws.com"
        path = f"{store.prefix}/{key}" if store.prefix else key
        return f"{scheme}://{host}/{store.bucket}/{path}"
    if isinstance(store, LocalObjectStore):
        return (store.root / key).resolve().as_uri()
    return f"{store.location}/{key}"
