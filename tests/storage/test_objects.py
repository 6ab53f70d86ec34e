"""One contract suite, two object stores: a local directory and S3 (real server on loopback)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from storage.errors import BucketMissing, ObjectNotFound, ObjectStoreUnavailable
from storage.objects import LocalObjectStore, ObjectStore, S3ObjectStore, make_object_store
from storage.settings import ObjectStoreSettings


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        s: ObjectStore = LocalObjectStore(tmp_path / "objects")
    else:
        s = make_object_store(request.getfixturevalue("s3_settings"))
        assert isinstance(s, S3ObjectStore)
    s.check()
    return s


def test_put_get_roundtrip_is_byte_exact(store: ObjectStore) -> None:
    data = b"\x00\xff raw bytes \xfe\n" * 100
    info = store.put("episodes/run/ep/steps/0000.stdout", data)
    assert info.size == len(data)
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert store.get("episodes/run/ep/steps/0000.stdout") == data
    assert store.exists("episodes/run/ep/steps/0000.stdout")


def test_overwrite_replaces(store: ObjectStore) -> None:
    store.put("a/b.json", b"1")
    store.put("a/b.json", b"22")
    assert store.get("a/b.json") == b"22"


def test_list_by_prefix_sorted(store: ObjectStore) -> None:
    for key in ("x/2", "x/1", "y/1", "x/sub/3"):
        store.put(key, key.encode())
    assert list(store.list("x/")) == ["x/1", "x/2", "x/sub/3"]
    assert set(store.list("")) >= {"x/1", "x/2", "y/1", "x/sub/3"}
    assert list(store.list("nothing/")) == []


def test_missing_key_is_typed(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        store.get("no/such/key")
    assert not store.exists("no/such/key")


def test_delete_is_idempotent(store: ObjectStore) -> None:
    store.put("d/k", b"v")
    store.delete("d/k")
    store.delete("d/k")
    assert not store.exists("d/k")


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "a/./b", "nul\x00"])
def test_bad_keys_rejected(store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError, match="invalid object key"):
        store.put(key, b"x")


def test_put_and_get_tree(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("a")
    (src / "sub" / "b.txt").write_text("b")
    (src / "link").symlink_to(src / "a.txt")
    infos = store.put_tree("trees/t1", src)
    assert sorted(i.key for i in infos) == ["trees/t1/a.txt", "trees/t1/sub/b.txt"]
    dest = tmp_path / "dest"
    store.get_tree("trees/t1", dest)
    assert (dest / "sub" / "b.txt").read_text() == "b"
    assert not (dest / "link").exists()


def test_unwritable_directory_names_the_setting(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ObjectStoreUnavailable) as e:
        LocalObjectStore(blocker / "objects").check()
    assert "EPIFLOW_OBJECTS_URL" in e.value.user_message()


def test_missing_bucket_names_the_setting(s3_settings: ObjectStoreSettings) -> None:
    settings = s3_settings.model_copy(update={"url": "s3://no-such-bucket-here"})
    with pytest.raises(BucketMissing) as e:
        make_object_store(settings).check()
    assert "no-such-bucket-here" in str(e.value)
    assert "EPIFLOW_OBJECTS_URL" in e.value.user_message()


def test_unreachable_endpoint_retries_then_fails(s3_settings: ObjectStoreSettings) -> None:
    from tests.services.postgres import free_port

    settings = s3_settings.model_copy(update={"endpoint": f"127.0.0.1:{free_port()}", "retries": 2})
    with pytest.raises(ObjectStoreUnavailable, match="after 3 attempts") as e:
        make_object_store(settings).put("k", b"v")
    assert "EPIFLOW_OBJECTS_ENDPOINT" in e.value.user_message()
    assert s3_settings.secret_key is not None
    assert s3_settings.secret_key.get_secret_value() not in str(e.value)
