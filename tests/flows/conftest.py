"""Fixtures shared by the flow tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from storage.objects import LocalObjectStore


@pytest.fixture
def gated_env(
    migrated_engine: Engine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[Engine, LocalObjectStore]:
    """A migrated database and a local object store, both named in the environment the
    flows build their settings from."""
    monkeypatch.setenv(
        "EPIFLOW_DATABASE_URL", migrated_engine.url.render_as_string(hide_password=False)
    )
    monkeypatch.setenv("EPIFLOW_OBJECTS_URL", str(tmp_path / "objects"))
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    return migrated_engine, store
