"""S3 under stress: a fault proxy in front of the real S3 server (moto, loopback) answers
a share of the requests with `503 SlowDown`, `500 InternalError`, `503
ServiceUnavailable`, an HTML `502`, or drops the connection before or halfway through the
answer. Transient faults are retried with backoff and a log line each; permanent ones
(credentials, missing bucket) fail at once with a typed error; files stream."""

from __future__ import annotations

import hashlib
import logging
import os
import tracemalloc
from pathlib import Path

import pytest

from storage.errors import BucketMissing, ObjectNotFound, ObjectStoreUnavailable
from storage.objects import S3ObjectStore, make_object_store
from storage.settings import ObjectStoreSettings
from tests.services.s3_fault_proxy import FAULTS, S3FaultProxy, always, first_n, never

pytestmark = pytest.mark.s3

# What each fault looks like in the retry log line; an answer to HEAD has no body, so
# there only the status shows.
SEEN_AS = {
    "slowdown": ("503 SlowDown", "HTTP 503"),
    "internal": ("500 InternalError", "HTTP 500"),
    "unavailable": ("503 ServiceUnavailable", "HTTP 503"),
    "html_502": ("HTTP 502", "HTTP 502"),
    # The connection closed early: urllib3's ProtocolError, or the reset underneath it.
    "drop": ("Error", "Error"),
    "lost_answer": ("Error", "Error"),
    "truncated": ("Error", "Error"),
}


@pytest.fixture
def proxy(s3_fault_proxy: S3FaultProxy) -> S3FaultProxy:
    return s3_fault_proxy


def through(proxy: S3FaultProxy, settings: ObjectStoreSettings, **update: object) -> S3ObjectStore:
    store = make_object_store(
        settings.model_copy(
            update={"endpoint": proxy.endpoint, "backoff_s": 0.01, "backoff_max_s": 0.05, **update}
        )
    )
    assert isinstance(store, S3ObjectStore)
    return store


def retry_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "storage.objects"]


@pytest.mark.parametrize("fault", FAULTS)
def test_each_transient_fault_is_retried_and_logged(
    fault: str,
    proxy: S3FaultProxy,
    s3_settings: ObjectStoreSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = through(proxy, s3_settings, retries=3)
    store.put("warm/up", b"w")  # the region lookup and a pooled connection
    caplog.set_level(logging.WARNING, logger="storage.objects")
    for operation in ("put", "get", "exists", "list", "delete"):
        caplog.clear()
        proxy.schedule = first_n(proxy.requests + 2, fault)
        if operation == "put":
            store.put("k/obj", b"payload")
        elif operation == "get":
            assert store.get("k/obj") == b"payload"
        elif operation == "exists":
            assert store.exists("k/obj")
        elif operation == "list":
            assert list(store.list("k/")) == ["k/obj"]
        else:
            store.delete("k/obj")
        lines = retry_lines(caplog)
        assert len(lines) == 2, (operation, lines)
        seen_as = SEEN_AS[fault][operation == "exists"]
        assert all(seen_as in line for line in lines), lines
        assert "retry 1 of 3" in lines[0] and "retry 2 of 3" in lines[1]
    proxy.schedule = never
    assert not store.exists("k/obj")
    assert proxy.counts[fault] == 10


def test_persistent_fault_ends_in_a_typed_error(
    proxy: S3FaultProxy, s3_settings: ObjectStoreSettings, caplog: pytest.LogCaptureFixture
) -> None:
    store = through(proxy, s3_settings, retries=2)
    store.put("warm/up", b"w")
    caplog.set_level(logging.WARNING, logger="storage.objects")
    proxy.schedule = always("html_502")
    before = proxy.requests
    with pytest.raises(ObjectStoreUnavailable, match="after 3 attempts") as e:
        store.put("k", b"v")
    assert "502" in str(e.value)
    assert "EPIFLOW_OBJECTS_ENDPOINT" in e.value.user_message()
    assert proxy.requests - before == 3
    assert len(retry_lines(caplog)) == 2


def test_refused_credentials_are_not_retried(
    proxy: S3FaultProxy, s3_settings: ObjectStoreSettings, caplog: pytest.LogCaptureFixture
) -> None:
    store = through(proxy, s3_settings, retries=4)
    store.put("warm/up", b"w")
    caplog.set_level(logging.WARNING, logger="storage.objects")
    proxy.schedule = always("denied")
    before = proxy.requests
    with pytest.raises(ObjectStoreUnavailable, match="credentials were refused") as e:
        store.put("k", b"v")
    assert "EPIFLOW_OBJECTS_SECRET_KEY" in e.value.user_message()
    assert proxy.requests - before == 1
    assert retry_lines(caplog) == []


def test_missing_bucket_and_key_are_not_retried(
    proxy: S3FaultProxy, s3_settings: ObjectStoreSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="storage.objects")
    store = through(proxy, s3_settings, retries=4)
    store.put("warm/up", b"w")
    before = proxy.requests
    with pytest.raises(ObjectNotFound):
        store.get("no/such/key")
    assert proxy.requests - before == 1
    missing = through(proxy, s3_settings, url="s3://no-such-bucket-here", retries=4)
    with pytest.raises(BucketMissing):
        missing.put("k", b"v")
    assert retry_lines(caplog) == []


def test_no_keys_is_one_clear_line_unless_anonymous(s3_settings: ObjectStoreSettings) -> None:
    keyless = s3_settings.model_copy(update={"access_key": None, "secret_key": None})
    with pytest.raises(ObjectStoreUnavailable) as e:
        make_object_store(keyless)
    message = e.value.user_message()
    assert "\n" not in message
    assert "EPIFLOW_OBJECTS_ACCESS_KEY" in message and "EPIFLOW_OBJECTS_ANONYMOUS" in message
    half = s3_settings.model_copy(update={"secret_key": None})
    with pytest.raises(ObjectStoreUnavailable):
        make_object_store(half)
    anonymous = make_object_store(keyless.model_copy(update={"anonymous": True}))
    assert isinstance(anonymous, S3ObjectStore)
    assert anonymous.client._provider is None  # unsigned requests, as asked


def test_files_stream_with_flat_memory(s3_settings: ObjectStoreSettings, tmp_path: Path) -> None:
    """A 96 MiB file goes up as a multipart upload and comes back, while Python's own
    allocations stay within what the parts in flight need, whatever the file's size (the
    old path held the file whole, twice)."""
    store = make_object_store(s3_settings)
    size = 96 * 1024 * 1024
    src = tmp_path / "checkpoint.bin"
    with src.open("wb") as fh:
        for _ in range(size // (1024 * 1024)):
            fh.write(os.urandom(1024 * 1024))
    digest = hashlib.sha256(src.read_bytes()).hexdigest()

    tracemalloc.start()
    try:
        info = store.put_file("checkpoints/c1/model.bin", src)
        _, upload_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        dest = tmp_path / "back" / "model.bin"
        store.get_file("checkpoints/c1/model.bin", dest)
        _, download_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert info.size == size and info.sha256 == digest
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == digest
    assert list(dest.parent.iterdir()) == [dest]  # no temp file left beside it
    # minio sends parts of 5 MiB, 3 in flight while it reads the next (each briefly held
    # twice: it reads one byte more and slices); a download streams 1 MiB chunks.
    part = 5 * 1024 * 1024
    assert upload_peak < 8 * part < size / 2, upload_peak
    assert download_peak < part, download_peak


def test_file_transfers_retry_too(
    proxy: S3FaultProxy, s3_settings: ObjectStoreSettings, tmp_path: Path
) -> None:
    store = through(proxy, s3_settings, retries=4)
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(300_000))
    store.put("warm/up", b"w")
    proxy.schedule = first_n(proxy.requests + 2, "lost_answer")
    store.put_file("files/f.bin", src)
    proxy.schedule = first_n(proxy.requests + 2, "truncated")
    dest = tmp_path / "out" / "f.bin"
    store.get_file("files/f.bin", dest)
    assert dest.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["f.bin"]
    with pytest.raises(ObjectNotFound):
        store.get_file("files/missing.bin", tmp_path / "out" / "missing.bin")
    assert sorted(p.name for p in dest.parent.iterdir()) == ["f.bin"]
