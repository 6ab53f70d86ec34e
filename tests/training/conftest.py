"""Fixtures for the training tests: one tiny local base model per session, small settings.

The base model is built for real (tokenizer trained on the protocol corpus, a 2-layer
Qwen2 from a config); nothing is downloaded and nothing is mocked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import Engine

from storage import migrate
from storage.db import make_engine
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from suites.builtin import builtin_suite
from tests.training.factory import episode
from training.base_model import build_base_model, protocol_corpus
from training.settings import TrainingSettings


@pytest.fixture(scope="session")
def tiny_settings() -> TrainingSettings:
    """A few steps on short sequences: the system prompt (~700 tokens) still fits."""
    return TrainingSettings(
        vocab_size=4096,
        max_length=1024,
        max_position_embeddings=1024,
        max_steps=2,
        batch_size=2,
        rollouts_per_task=2,
        max_completion_length=12,
    )


@pytest.fixture(scope="session")
def tiny_corpus() -> list[str]:
    tasks = builtin_suite().instances(1)
    return protocol_corpus(tasks, [episode(task=i) for i in range(3)])


@pytest.fixture(scope="session")
def tiny_base_model(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_corpus: list[str],
    tiny_settings: TrainingSettings,
) -> Path:
    """The locally built base model directory (read-only for tests: copy before training in place)."""
    return build_base_model(
        tmp_path_factory.mktemp("base") / "model", tiny_corpus, settings=tiny_settings
    )


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[Engine]:
    """A migrated SQLite database (the PostgreSQL paths are covered in test_snapshots.py)."""
    eng = make_engine(DatabaseSettings(url=SecretStr(sqlite_url)))
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    s = LocalObjectStore(tmp_path / "objects")
    s.check()
    return s
