"""The settings, database engine and object store a CLI command uses, opened and checked
in one place. Imported by every command module, so it imports none of them at load
(`epiflow --help` lists the commands without importing SQLAlchemy or the settings)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from config.settings import Settings
    from storage.objects import ObjectStore


def load_settings() -> Settings:
    """`config.settings.load_settings`, imported when a command runs."""
    from config.settings import load_settings as load

    return load()


@contextmanager
def stores(
    settings: Settings, *, check_objects: bool = False
) -> Iterator[tuple[Engine, ObjectStore]]:
    """An engine on a database whose schema is current, and the object store (checked
    reachable and writable with `check_objects`); the engine is disposed on exit.

    Raises:
        StorageError: the database is unreachable or behind the code, or the store unusable.
    """
    from storage.db import make_engine
    from storage.migrate import ensure_current
    from storage.objects import make_object_store

    engine = make_engine(settings.database)
    try:
        ensure_current(engine)
        store = make_object_store(settings.objects)
        if check_objects:
            store.check()
        yield engine, store
    finally:
        engine.dispose()
