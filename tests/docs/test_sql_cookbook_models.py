"""docs/sql-cookbook.md: the queries marked `(models)` run unchanged on SQLite and
PostgreSQL (`migrated_engine`) holding two nights of the champion chain: checkpoint A
promoted, a night collected with A (episodes labelled `hf:checkpoint/<A>`, as
`hf:alias/champion` resolves), B promoted, a night collected with B, and a scripted night
beside them. Each night's run answers with the alias change current when it started, and
the scripted one is not there."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from models import run_id_for
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from storage.runs import close_run, open_run
from tests.docs.cookbook_queries import FORBIDDEN, load_queries
from tests.training.factory import episode
from tests.training.test_aliases import _checkpoint
from training.aliases import point_alias
from training.registry import link_policy_to_checkpoint

QUERIES = {q.name: q for q in load_queries() if q.data == "models"}


def _night(engine: Engine, store: LocalObjectStore, run_key: str, policy: str) -> None:
    """A collection run of two episodes played by `policy`."""
    open_run(
        engine,
        run_key=run_key,
        suite="builtin",
        policy=policy,
        parameters={},
        sandbox_spec={},
        fault_profile={},
    )
    persist_episodes(
        engine, store, [episode(run_key=run_key, task=i, policy=policy) for i in range(2)]
    )
    close_run(engine, run_id_for(run_key), status="completed")


def test_the_document_has_the_model_queries() -> None:
    assert set(QUERIES) == {"night_models"}
    for query in QUERIES.values():
        sql = " ".join(query.sql.upper().split())
        assert not [f for f in FORBIDDEN if f in sql], query.name


def test_which_model_collected_each_night_and_why(migrated_engine: Engine, tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    a, b = _checkpoint(migrated_engine, store), _checkpoint(migrated_engine, store)
    for checkpoint in (a, b):  # both evaluated: the policy rows name their checkpoints
        _night(migrated_engine, store, f"eval-{checkpoint}", f"hf:checkpoint/{checkpoint}")
        link_policy_to_checkpoint(migrated_engine, f"hf:checkpoint/{checkpoint}", checkpoint)
    point_alias(
        migrated_engine, store, "champion", a, reason="promoted: A beats the base", actor="t"
    )
    _night(migrated_engine, store, "nightly-champion-1", f"hf:checkpoint/{a}")
    _night(migrated_engine, store, "nightly-collect-1", "scripted:noisy")
    point_alias(migrated_engine, store, "champion", b, reason="promoted: B beats A", actor="t")
    _night(migrated_engine, store, "nightly-champion-2", f"hf:checkpoint/{b}")

    query = QUERIES["night_models"]
    since = "2000-01-01"
    with migrated_engine.connect() as conn:
        result = conn.execute(text(query.sql), {"since": since})
        keys = list(result.keys())
        rows: list[dict[str, Any]] = [dict(r) for r in result.mappings()]
    assert keys == query.columns
    answered = [(r["run_key"], r["seq"], r["reason"], r["episodes"]) for r in rows]
    # The evaluation runs started before any promotion: no alias change held then.
    assert answered == [
        ("nightly-champion-1", 1, "promoted: A beats the base", 2),
        ("nightly-champion-2", 2, "promoted: B beats A", 2),
    ]
    assert rows[0]["valid_to"] is not None and rows[1]["valid_to"] is None
    assert {str(uuid.UUID(str(r["checkpoint_id"]))) for r in rows} == {str(a), str(b)}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_model_queries_bind_only_since(name: str) -> None:
    assert QUERIES[name].params == {"since"}
