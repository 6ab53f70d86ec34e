"""docs/sql-cookbook.md: the queries marked `(imports)` run unchanged on SQLite and
PostgreSQL holding Harbor's linked files (`shared/interop/atif-linked/`, imported in place),
return the documented columns and the same answers on both, and the tree's costs match the
files."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from storage import migrate
from storage.db import make_engine
from storage.exchange import import_file
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from tests.docs.cookbook_queries import FORBIDDEN, load_queries
from tests.docs.test_sql_cookbook import same
from tests.interop import linked_files, load
from tests.services.postgres import PostgresCluster

QUERIES = {q.name: q for q in load_queries() if q.data == "imports"}
PARAMS = {"session_id": "NORMALIZED_SESSION_ID"}
"""Harbor normalised the session ids of its golden parents and continuations to this."""


def _imported(url: str, root: Path) -> Engine:
    engine = make_engine(DatabaseSettings(url=url))
    migrate.upgrade(engine)
    store = LocalObjectStore(root / "objects")
    store.check()
    for path in linked_files():
        import_file(engine, store, path, "atif")
    return engine


@pytest.fixture(scope="module")
def databases(
    pg_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Engine]]:
    lite_root = tmp_path_factory.mktemp("cookbook-imports-sqlite")
    engines = {
        "sqlite": _imported(f"sqlite:///{lite_root / 'epiflow.db'}", lite_root),
        "postgres": _imported(
            pg_cluster.url(pg_cluster.create_database()),
            tmp_path_factory.mktemp("cookbook-imports-postgres"),
        ),
    }
    yield engines
    for engine in engines.values():
        engine.dispose()


def _run(engine: Engine, name: str) -> tuple[list[str], list[dict[str, Any]]]:
    query = QUERIES[name]
    assert query.params <= set(PARAMS), f"{name}: no test value for {query.params}"
    with engine.connect() as conn:
        result = conn.execute(text(query.sql), {k: PARAMS[k] for k in query.params})
        return list(result.keys()), [dict(r) for r in result.mappings()]


def test_the_document_has_the_link_queries() -> None:
    assert set(QUERIES) == {"session_tree", "unresolved_links"}
    for query in QUERIES.values():
        sql = " ".join(query.sql.upper().split())
        assert not [f for f in FORBIDDEN if f in sql], query.name


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_query_runs_with_its_columns_and_the_same_answer_on_both(
    databases: dict[str, Engine], name: str
) -> None:
    keys, lite = _run(databases["sqlite"], name)
    pg_keys, pg = _run(databases["postgres"], name)
    assert keys == pg_keys == QUERIES[name].columns
    assert lite, f"{name} returned no rows"
    assert len(lite) == len(pg)
    for a, b in zip(lite, pg, strict=True):
        assert not {k: (a[k], b[k]) for k in a if not same(a[k], b[k])}, name


def test_session_tree_costs_match_the_files(databases: dict[str, Engine]) -> None:
    docs = {p.name: load(p) for p in linked_files()}

    def own_cost(document: dict[str, Any]) -> float:
        return sum(
            (s.get("metrics") or {}).get("cost_usd") or 0.0
            for s in document["steps"]
            if s["source"] == "agent" and not s.get("is_copied_context")
        )

    for engine in databases.values():
        _, rows = _run(engine, "session_tree")
        roots = [r for r in rows if r["depth"] == 0]
        assert len(roots) == 2  # the summarising parent and the linear-history one
        # Every file but the two roots is below one of them; each root's subtree cost is
        # the sum of its tree's own costs, which together are every file's.
        assert len(rows) == len(docs)
        assert math.isclose(
            sum(r["subtree_cost_usd"] for r in roots),
            sum(own_cost(d) for d in docs.values()),
            rel_tol=1e-9,
        )
        for root in roots:
            members = [r for r in rows if r["root_episode_id"] == root["root_episode_id"]]
            assert math.isclose(
                root["subtree_cost_usd"], sum(r["cost_usd"] for r in members), rel_tol=1e-9
            )


def test_unresolved_links_name_the_files_not_imported(databases: dict[str, Engine]) -> None:
    for engine in databases.values():
        _, rows = _run(engine, "unresolved_links")
        # Each parent names an `answers` sub-agent whose file is not in the set; the
        # linear-history parent's sub-agents all have session ids no file has.
        assert sorted(r["ref_path"] for r in rows) == sorted(
            ["trajectory.summarization-1-answers.json"]
            + [f"trajectory.summarization-1-{k}.json" for k in ("summary", "questions", "answers")]
        )
        assert {r["kind"] for r in rows} == {"subagent"}
