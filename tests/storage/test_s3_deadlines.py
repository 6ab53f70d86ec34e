"""Every S3 operation has a deadline: an endpoint that accepts connections and never
answers fails the startup check and each call with one typed line, instead of waiting
forever; a listing whose answer is not XML is retried like any other transient fault.
Real S3 server (moto, loopback) behind the fault proxy; a bare listening socket that
never answers."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest

from storage.errors import ObjectStoreUnavailable
from storage.objects import S3ObjectStore, make_object_store
from storage.settings import ObjectStoreSettings
from tests.services.s3_fault_proxy import S3FaultProxy, always, first_n

pytestmark = pytest.mark.s3

FAST = {
    "backoff_s": 0.01,
    "backoff_max_s": 0.05,
    "read_timeout_s": 0.5,
    "deadline_s": 2.0,
    "check_deadline_s": 1.0,
}
"""Short waits, so that a hang shows in seconds; the retries (8) outnumber what fits."""


@pytest.fixture
def proxy(s3_fault_proxy: S3FaultProxy) -> S3FaultProxy:
    return s3_fault_proxy


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def store_at(endpoint: str, settings: ObjectStoreSettings, **update: object) -> S3ObjectStore:
    store = make_object_store(settings.model_copy(update={"endpoint": endpoint, **FAST, **update}))
    assert isinstance(store, S3ObjectStore)
    return store


def test_a_silent_endpoint_fails_the_check_and_each_call_in_one_line(
    silent_endpoint: str, s3_settings: ObjectStoreSettings
) -> None:
    store = store_at(silent_endpoint, s3_settings)
    with pytest.raises(ObjectStoreUnavailable, match=r"bucket check failed after \d+ attempt") as e:
        store.check()
    message = e.value.user_message()
    assert "\n" not in message and "deadline 1 s" in message
    assert "EPIFLOW_OBJECTS_ENDPOINT" in message
    for call in (lambda: store.put("k", b"v"), lambda: store.get("k"), lambda: list(store.list())):
        with pytest.raises(ObjectStoreUnavailable, match=r"deadline 2 s") as e:
            call()
        assert "\n" not in e.value.user_message()


def test_a_request_that_is_never_answered_is_retried_then_answered(
    proxy: S3FaultProxy, s3_settings: ObjectStoreSettings, caplog: pytest.LogCaptureFixture
) -> None:
    store = store_at(proxy.endpoint, s3_settings, deadline_s=60.0, read_timeout_s=1.0)
    store.put("warm/up", b"w")
    caplog.set_level(logging.WARNING, logger="storage.objects")
    proxy.schedule = first_n(proxy.requests + 1, "hang")
    store.put("k/obj", b"payload")  # the hung attempt times out; the retry lands
    assert store.get("k/obj") == b"payload"
    assert proxy.counts["hang"] == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "storage.objects"]
    assert len(lines) == 1 and "upload of k/obj failed" in lines[0]


def test_an_unparseable_listing_is_retried_or_fails_in_one_line(
    proxy: S3FaultProxy, s3_settings: ObjectStoreSettings, caplog: pytest.LogCaptureFixture
) -> None:
    store = store_at(proxy.endpoint, s3_settings, deadline_s=60.0, retries=3)
    store.put("episodes/a", b"1")
    store.put("qc/b", b"2")
    caplog.set_level(logging.WARNING, logger="storage.objects")
    proxy.schedule = first_n(proxy.requests + 2, "garbled")
    assert list(store.list()) == ["episodes/a", "qc/b"]
    lines = [r.getMessage() for r in caplog.records if r.name == "storage.objects"]
    assert len(lines) == 2 and all("ParseError" in line for line in lines), lines
    proxy.schedule = always("garbled")
    with pytest.raises(ObjectStoreUnavailable, match="listing of / failed after 4 attempts") as e:
        list(store.list())
    assert "\n" not in e.value.user_message()
