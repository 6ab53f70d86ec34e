"""The views on PostgreSQL at a size where the planner's choices are real: their plans
use the indexes of migration 0006 (no nested loop or subplan that scans `qc_result` or
`dataset_episode` whole per row), their columns carry comments from the models'
docstrings, lineage rows name the run that made each checkpoint, and the time-zone advice
of docs/sql-cookbook.md works. The database: `tests.storage.scale_data` (real ingest of
600 episodes, copied up to 3,000 with 30,000 steps). Timings are `bench/sql_scale.py`'s,
not a test's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, Uuid, bindparam, text

from models.views import VIEW_COLUMNS, view_comments
from storage import migrate
from storage.db import make_engine
from storage.settings import DatabaseSettings
from tests.services.postgres import PostgresCluster
from tests.storage.scale_data import ScaleIds, build_scale_database

VIEW_QUERIES = {
    "episode_summary": "SELECT * FROM episode_summary",
    "episode_summary_by_verdict": "SELECT qc_verdict, count(*) FROM episode_summary GROUP BY 1",
    "episode_summary_of_run": "SELECT * FROM episode_summary WHERE run_key = 'scale-0'",
    "perturbation_verdicts": (
        "SELECT s.policy_perturbation, es.qc_verdict, count(*) FROM step s "
        "JOIN episode_summary es ON es.episode_id = s.episode_id "
        "WHERE s.policy_perturbation IS NOT NULL GROUP BY 1, 2"
    ),
    "tool_failure_rates": "SELECT * FROM tool_failure_rates",
    "quality_by_suite": "SELECT * FROM quality_by_suite",
    "quality_by_template": "SELECT * FROM quality_by_template",
    "training_lineage": "SELECT * FROM training_lineage",
    "reproducibility_by_suite": "SELECT * FROM reproducibility_by_suite",
}
SCANNED_PER_ROW = {"qc_result", "dataset_episode"}
"""Tables that must never be read whole once per outer row."""


@dataclass
class ScaleDb:
    engine: Engine
    ids: ScaleIds
    database: str


@pytest.fixture(scope="module")
def scale_db(pg_cluster: PostgresCluster) -> Iterator[ScaleDb]:
    database = pg_cluster.create_database()
    engine = make_engine(DatabaseSettings(url=pg_cluster.url(database)))
    try:
        migrate.upgrade(engine)
        ids = build_scale_database(engine, base=600, copies=5)
        yield ScaleDb(engine, ids, database)
    finally:
        engine.dispose()


def plan(
    engine: Engine,
    sql: str,
    params: dict[str, Any] | None = None,
    *,
    settings: dict[str, str] | None = None,
) -> dict[str, Any]:
    values = params or {}
    stmt = text(f"EXPLAIN (FORMAT JSON) {sql}").bindparams(
        *(bindparam(k, type_=Uuid()) for k, v in values.items() if isinstance(v, uuid.UUID))
    )
    with engine.connect() as conn:
        for name, value in (settings or {}).items():
            conn.execute(text("SELECT set_config(:n, :v, true)"), {"n": name, "v": value})
        raw = conn.execute(stmt, values).scalar_one()
    doc = raw if isinstance(raw, list) else json.loads(raw)
    top: dict[str, Any] = doc[0]["Plan"]
    return top


def nodes(node: dict[str, Any], *, repeated: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every node with whether it runs once per outer row (inner side of a nested loop, a
    correlated subplan)."""
    yield node, repeated
    children = node.get("Plans", [])
    for i, child in enumerate(children):
        inner = node["Node Type"] == "Nested Loop" and i == 1
        correlated = child.get("Parent Relationship") == "SubPlan"
        yield from nodes(child, repeated=repeated or inner or correlated)


def whole_scans_per_row(top: dict[str, Any]) -> list[str]:
    return [
        f"{n['Node Type']} on {n['Relation Name']}"
        for n, repeated in nodes(top)
        if repeated
        and n.get("Relation Name") in SCANNED_PER_ROW
        and n["Node Type"] not in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan")
    ]


def indexes_used(top: dict[str, Any]) -> set[str]:
    return {n["Index Name"] for n, _ in nodes(top) if "Index Name" in n}


@pytest.mark.parametrize("name", sorted(VIEW_QUERIES))
def test_view_plans_never_scan_qc_result_per_row(scale_db: ScaleDb, name: str) -> None:
    top = plan(scale_db.engine, VIEW_QUERIES[name])
    assert whole_scans_per_row(top) == [], json.dumps(top, indent=1)[:4000]


def test_point_lookups_use_the_indexes(scale_db: ScaleDb) -> None:
    ids = scale_db.ids
    one = plan(
        scale_db.engine,
        "SELECT * FROM episode_summary WHERE episode_id = :e",
        {"e": ids.episode_id},
    )
    assert "ix_qc_result_episode_created" in indexes_used(one)
    lineage = plan(
        scale_db.engine,
        "SELECT * FROM training_lineage WHERE episode_id = :e",
        {"e": ids.lineage_episode_id},
    )
    assert "ix_dataset_episode_episode_id" in indexes_used(lineage)
    # The whole view aggregates every tool call: whether a seq scan of `step` or an
    # index-only scan of the partial index is cheaper is the planner's call on the
    # statistics of the moment (it went both ways on one data set), so the test asserts
    # that the index answers the view (its predicate and included columns match) once seq
    # scans are priced out, and leaves the speed to bench/sql_scale.py.
    whole = plan(
        scale_db.engine, "SELECT * FROM tool_failure_rates", settings={"enable_seqscan": "off"}
    )
    assert "ix_step_tool_calls" in indexes_used(whole), json.dumps(whole, indent=1)[:3000]


def test_latest_verdict_is_the_latest_gate_run(scale_db: ScaleDb) -> None:
    """scale-0 was gated twice: its episodes show the second gate's verdicts, once each."""
    with scale_db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT es.episode_id, es.qc_verdict, q.verdict FROM episode_summary es "
                "JOIN qc_result q ON q.episode_id = es.episode_id AND q.qc_run_id = :regate "
                "WHERE es.run_key = 'scale-0'"
            ).bindparams(bindparam("regate", type_=Uuid())),
            {"regate": scale_db.ids.regate_qc_run_id},
        ).all()
        per_episode = conn.execute(
            text("SELECT count(*), count(DISTINCT episode_id) FROM episode_summary")
        ).one()
    assert rows and all(latest == second for _, latest, second in rows)
    assert per_episode[0] == per_episode[1]


def test_every_view_column_has_its_comment(scale_db: ScaleDb) -> None:
    expected = view_comments()
    with scale_db.engine.connect() as conn:
        for view, columns in VIEW_COLUMNS.items():
            got = conn.execute(
                text(
                    "SELECT a.attname, col_description(a.attrelid, a.attnum) FROM pg_attribute a "
                    "WHERE a.attrelid = CAST(:v AS regclass) AND a.attnum > 0 "
                    "AND NOT a.attisdropped ORDER BY a.attnum"
                ),
                {"v": view},
            ).all()
            assert [name for name, _ in got] == list(columns), view
            assert dict(got) == expected[view], view
    assert all(expected[v][c] for v in expected for c in expected[v])


def test_lineage_rows_name_the_run_that_made_each_checkpoint(scale_db: ScaleDb) -> None:
    ids = scale_db.ids
    with scale_db.engine.connect() as conn:
        made_by: dict[uuid.UUID, str] = dict(
            conn.execute(
                text(
                    "SELECT c.id, t.algo FROM checkpoint c JOIN training_run t "
                    "ON t.id = c.training_run_id"
                )
            ).all()
        )
        rows = conn.execute(
            text(
                "SELECT DISTINCT checkpoint_id, generations, training_run_id, algo "
                "FROM training_lineage WHERE checkpoint_id IS NOT NULL"
            )
        ).all()
    by_generation = {(c, g): algo for c, g, _, algo in rows}
    assert by_generation[(ids.checkpoint_id, 0)] == "sft"
    # The fine-tune learned the parent's snapshot at generation 1 and its own at 0; both
    # rows are the fine-tune's own run (dpo), not the parent's.
    assert by_generation[(ids.child_checkpoint_id, 1)] == "dpo"
    assert by_generation[(ids.child_checkpoint_id, 0)] == "dpo"
    assert all(made_by[c] == algo for (c, _), algo in by_generation.items())


def test_timezone_advice_of_the_cookbook(scale_db: ScaleDb, pg_cluster: PostgresCluster) -> None:
    """A server in another zone: a setting on the group role does not reach its member;
    one on the login role, or on the database, does."""
    suffix = uuid.uuid4().hex[:8]
    group, login, password = f"analysts_{suffix}", f"alice_{suffix}", "alice-pw"
    admin = psycopg.connect(
        pg_cluster.url(scale_db.database).replace("postgresql+psycopg", "postgresql"),
        autocommit=True,
    )

    def member_zone() -> str:
        url = pg_cluster.url(scale_db.database, user=login, password=password)
        with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
            zone = conn.execute("SHOW timezone").fetchone()
        assert zone is not None
        return str(zone[0])

    with admin:
        admin.execute(f"ALTER DATABASE {scale_db.database} SET timezone = 'America/New_York'")
        admin.execute(f"CREATE ROLE {group}")
        admin.execute(f"CREATE ROLE {login} LOGIN PASSWORD '{password}' IN ROLE {group}")
        admin.execute(f"ALTER ROLE {group} SET timezone = 'UTC'")
        assert member_zone() == "America/New_York"  # the old advice: no effect
        admin.execute(f"ALTER ROLE {login} SET timezone = 'UTC'")
        assert member_zone() == "UTC"
        admin.execute(f"ALTER ROLE {login} RESET timezone")
        admin.execute(f"ALTER DATABASE {scale_db.database} SET timezone = 'UTC'")
        assert member_zone() == "UTC"
