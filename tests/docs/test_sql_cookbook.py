"""docs/sql-cookbook.md: every marked query runs unchanged on SQLite and PostgreSQL.

The databases hold a real collection (noisy policy with injected faults, an oracle run a
day earlier, an `openai:` policy on a real HTTP endpoint), real gate runs, a snapshot, a
training run with checkpoints and replays (`cookbook_data`). Each query must return rows
with exactly the columns the document lists; both databases must give the same answers;
key answers are checked against values computed in Python from the trajectories.
"""

from __future__ import annotations

import math
import os
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, time
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, Uuid, bindparam, select, text
from sqlalchemy.types import TypeEngine
from sqlmodel import col

from agent.trajectory import EpisodeStatus, ParseKind, Trajectory
from models import DatasetEpisode, Episode
from models.columns import UTCDateTime
from storage import migrate
from storage.db import make_engine
from storage.ingest import EpisodeBundle, ingest_episodes
from storage.objects import LocalObjectStore
from storage.rows import reported_total
from storage.settings import DatabaseSettings
from tests.conftest import KEEP_ENV
from tests.docs.cookbook_data import (
    Corpus,
    Downstream,
    collect_corpus,
    ingest_collections,
    write_downstream,
)
from tests.docs.cookbook_queries import BLOCK, DOC, FORBIDDEN, CookbookQuery, load_queries
from tests.services.postgres import PostgresCluster

QUERIES = {q.name: q for q in load_queries() if q.data == "collection"}
"""The queries this module's databases answer (the `imports` ones: test_sql_cookbook_imports.py)."""


@dataclass
class Populated:
    engine: Engine
    corpus: Corpus
    downstream: Downstream

    @property
    def dataset_id(self) -> uuid.UUID:
        return self.downstream.dataset.id

    def lineage(self, dataset: uuid.UUID) -> set[tuple[uuid.UUID, str]]:
        """(episode, role) rows of a snapshot, from `dataset_episode`."""
        with self.engine.connect() as conn:
            return {
                (eid, role)
                for eid, role in conn.execute(
                    select(col(DatasetEpisode.episode_id), col(DatasetEpisode.role)).where(
                        col(DatasetEpisode.dataset_id) == dataset
                    )
                )
            }


@pytest.fixture(scope="module")
def clean_env() -> Iterator[None]:
    """Module-scoped twin of the autouse `_isolated_env`: no developer EPIFLOW_* settings."""
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("EPIFLOW_") and name not in KEEP_ENV:
                mp.delenv(name)
        yield


@pytest.fixture(scope="module")
def sqlite_db(clean_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Populated]:
    root = tmp_path_factory.mktemp("cookbook-sqlite")
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{root / 'epiflow.db'}"))
    try:
        migrate.upgrade(engine)
        store = LocalObjectStore(root / "objects")
        store.check()
        corpus = collect_corpus(engine, store)
        yield Populated(engine, corpus, write_downstream(engine, store, corpus))
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def postgres_db(
    sqlite_db: Populated, pg_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Populated]:
    root = tmp_path_factory.mktemp("cookbook-postgres")
    engine = make_engine(DatabaseSettings(url=pg_cluster.url(pg_cluster.create_database())))
    try:
        migrate.upgrade(engine)
        store = LocalObjectStore(root / "objects")
        store.check()
        ingest_collections(engine, store, sqlite_db.corpus)
        yield Populated(engine, sqlite_db.corpus, write_downstream(engine, store, sqlite_db.corpus))
    finally:
        engine.dispose()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest) -> Populated:
    populated: Populated = request.getfixturevalue(f"{request.param}_db")
    return populated


def since_day(corpus: Corpus) -> str:
    first = min(t.started_at for t in corpus.all_trajectories() if t.started_at is not None)
    return first.astimezone(UTC).date().isoformat()


def params_for(query: CookbookQuery, populated: Populated) -> dict[str, Any]:
    corpus = populated.corpus
    values: dict[str, Any] = {
        "since": since_day(corpus),
        "checkpoint_id": corpus.checkpoint_id,
        "episode_id": corpus.trajectories["noisy"][0].episode_id,
        "qc_run_id": corpus.gate("noisy").qc_run_id,
        "lineage_episode_id": min(e for e, _ in populated.lineage(populated.dataset_id)),
        "training_run_id": populated.downstream.grpo_training_run_id,
    }
    assert query.params <= set(values), f"{query.name}: no test value for {query.params}"
    return {name: values[name] for name in query.params}


def run(
    populated: Populated, name: str, params: Mapping[str, Any] | None = None
) -> tuple[list[str], list[dict[str, Any]]]:
    """Execute a cookbook query the way the document says: `text()`, ids bound as `Uuid`."""
    query = QUERIES[name]
    values = dict(params) if params is not None else params_for(query, populated)
    typed: dict[type, TypeEngine[Any]] = {uuid.UUID: Uuid(), datetime: UTCDateTime()}
    stmt = text(query.sql).bindparams(
        *(
            bindparam(n, type_=typed[type(v)])
            for n, v in values.items()
            if type(v) in typed  # ids as `Uuid`, datetimes as `UTCDateTime`
        )
    )
    with populated.engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SET TIME ZONE 'UTC'"))  # as the document tells psql users
        result = conn.execute(stmt, values)
        keys = list(result.keys())
        rows = [dict(r) for r in result.mappings()]
    return keys, rows


def norm(value: Any) -> Any:
    """One spelling for what the two databases return differently (ids, booleans, numerics)."""
    if isinstance(value, uuid.UUID):
        return value.hex
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, Decimal):
        return float(value)
    return value


def same(a: Any, b: Any) -> bool:
    a, b = norm(a), norm(b)
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return bool(a == b)


def as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


# --- the document -------------------------------------------------------------------


def test_document_marks_enough_queries_with_their_columns() -> None:
    assert len(QUERIES) >= 12
    assert len(load_queries()) == len(BLOCK.findall(DOC.read_text(encoding="utf-8")))
    for query in QUERIES.values():
        assert query.columns, f"{query.name}: no 'Columns:' line under the query"
        assert len(set(query.columns)) == len(query.columns), query.name


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_query_avoids_dialect_specific_syntax(name: str) -> None:
    sql = " ".join(QUERIES[name].sql.upper().split())
    assert not [f for f in FORBIDDEN if f in sql], f"{name} uses {FORBIDDEN}"


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_query_runs_and_returns_the_documented_columns(db: Populated, name: str) -> None:
    keys, rows = run(db, name)
    assert keys == QUERIES[name].columns
    assert rows, f"{name} returned no rows on {db.engine.dialect.name}"


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_sqlite_and_postgres_give_the_same_answer(
    sqlite_db: Populated, postgres_db: Populated, name: str
) -> None:
    _, lite = run(sqlite_db, name)
    _, pg = run(postgres_db, name)
    assert len(lite) == len(pg)
    for a, b in zip(lite, pg, strict=True):
        differing = {k: (a[k], b[k]) for k in a if not same(a[k], b[k])}
        assert not differing, f"{name}: {differing}"


# --- answers checked against the trajectories ----------------------------------------


def test_success_by_template_by_day(db: Populated) -> None:
    corpus = db.corpus
    expected: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for t in corpus.all_trajectories():
        if t.started_at is None or t.status == EpisodeStatus.IMPORTED:
            continue  # the query leaves out unknown outcomes (and the day needs a time)
        cell = expected[(t.started_at.astimezone(UTC).date().isoformat(), t.template)]
        cell[0] += 1
        cell[1] += t.status == EpisodeStatus.SUCCESS
    _, rows = run(db, "success_by_template_by_day")
    got = {(r["day"], r["template"]): [r["episodes"], r["successes"]] for r in rows}
    assert got == dict(expected)
    assert len({day for day, _ in got}) == 2  # the oracle run is a night earlier
    for r in rows:
        assert math.isclose(r["success_rate"], r["successes"] / r["episodes"])
    assert [r["day"] for r in rows] == sorted((r["day"] for r in rows), reverse=True)

    latest = max(day for day, _ in got)
    midnight = datetime.combine(datetime.fromisoformat(latest).date(), time(), tzinfo=UTC)
    for since in (latest, midnight):  # a UTC string, or a datetime bound as UTCDateTime
        _, recent = run(db, "success_by_template_by_day", {"since": since})
        assert {(r["day"], r["template"]) for r in recent} == {k for k in got if k[0] == latest}


def test_tool_failure_rates_by_fault(db: Populated) -> None:
    expected: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for t in db.corpus.all_trajectories():
        for s in t.steps:
            if s.parse_kind != ParseKind.TOOL_CALL or s.tool is None:
                continue
            failed = (
                s.timed_out
                or s.error_type is not None
                or s.signal is not None
                or (s.exit_code is not None and s.exit_code != 0)
            )
            cell = expected[(s.tool, s.injected_fault.kind if s.injected_fault else "none")]
            cell[0] += 1
            cell[1] += failed
    _, rows = run(db, "tool_failure_rates_by_fault")
    assert {(r["tool"], r["fault_kind"]): [r["calls"], r["failures"]] for r in rows} == dict(
        expected
    )
    assert {kind for _, kind in expected} - {"none"}, "the fault profile injected nothing"


def test_claimed_success_but_failed(db: Populated) -> None:
    expected = {
        t.episode_id
        for t in db.corpus.all_trajectories()
        if t.final_answer is not None and t.status != EpisodeStatus.SUCCESS
    }
    _, rows = run(db, "claimed_success_but_failed")
    assert {as_uuid(r["episode_id"]) for r in rows} == expected
    endpoint = db.corpus.trajectories["endpoint"][0].episode_id
    assert endpoint in expected  # the endpoint said <final>done</final> and did nothing


def test_slowest_tools_nearest_rank_percentiles(db: Populated) -> None:
    durations: dict[str, list[float]] = defaultdict(list)
    for t in db.corpus.all_trajectories():
        for s in t.steps:
            if (
                s.parse_kind == ParseKind.TOOL_CALL
                and s.tool is not None
                and s.duration_ms is not None
                and s.injected_fault is None
            ):
                durations[s.tool].append(s.duration_ms)
    _, rows = run(db, "slowest_tools")
    assert {r["tool"] for r in rows} == set(durations)
    for r in rows:
        values = sorted(durations[r["tool"]])
        n = len(values)
        assert r["calls"] == n
        assert math.isclose(r["p50_ms"], values[math.ceil(0.5 * n) - 1])
        assert math.isclose(r["p90_ms"], values[math.ceil(0.9 * n) - 1])
        assert math.isclose(r["max_ms"], values[-1])
        assert math.isclose(r["avg_ms"], sum(values) / n)
    assert [r["p90_ms"] for r in rows] == sorted((r["p90_ms"] for r in rows), reverse=True)


def test_perturbation_verdicts(db: Populated) -> None:
    verdicts = db.corpus.latest_verdicts()
    steps: Counter[tuple[str, str]] = Counter()
    episodes: dict[tuple[str, str], set[str]] = defaultdict(set)
    for t in db.corpus.all_trajectories():
        for s in t.steps:
            if s.policy_perturbation is not None:
                key = (s.policy_perturbation, verdicts.get(str(t.episode_id), "not gated"))
                steps[key] += 1
                episodes[key].add(str(t.episode_id))
    _, rows = run(db, "perturbation_verdicts")
    got = {(r["perturbation"], r["verdict"]): (r["steps"], r["episodes"]) for r in rows}
    assert got == {k: (steps[k], len(episodes[k])) for k in steps}
    assert len({p for p, _ in got}) >= 3


def test_latest_qc_per_run_and_token_usage(db: Populated) -> None:
    corpus = db.corpus
    _, rows = run(db, "latest_qc_per_run")
    names = {request.run_key: name for name, request in corpus.requests.items()}
    assert {r["run_key"] for r in rows} == set(names)
    for r in rows:
        gate = corpus.gate(names[r["run_key"]])
        assert as_uuid(r["qc_run_id"]) == gate.qc_run_id
        assert r["n_episodes"] == gate.report.n_episodes
        assert r["n_episodes"] == len(corpus.trajectories[names[r["run_key"]]])
        assert bool(r["batch_passed"]) == gate.report.batch_passed

    _, usage = run(db, "token_usage_per_policy")
    by_policy: dict[str, list[Trajectory]] = defaultdict(list)
    for t in corpus.all_trajectories():
        by_policy[t.policy].append(t)
    assert {r["policy_id"] for r in usage} == set(by_policy)
    for r in usage:
        ts = by_policy[r["policy_id"]]
        assert r["episodes"] == len(ts)
        assert r["steps"] == sum(len(t.steps) for t in ts)
        for column in ("prompt_tokens", "completion_tokens"):
            # NULL, not 0, when no step of the policy's episodes reported tokens.
            assert r[column] == reported_total(getattr(s, column) for t in ts for s in t.steps)
        if r["policy_id"].startswith("scripted:"):
            assert r["prompt_tokens"] is None and r["tokens_per_episode"] is None
    assert any((r["prompt_tokens"] or 0) > 0 for r in usage)  # the endpoint reports usage


def test_episodes_for_checkpoint_follow_the_snapshots(db: Populated) -> None:
    lineage = db.lineage(db.dataset_id)
    _, rows = run(db, "episodes_for_checkpoint")
    assert {(as_uuid(r["episode_id"]), r["role"]) for r in rows} == lineage
    assert {as_uuid(r["dataset_id"]) for r in rows} == {db.dataset_id}
    assert {r["generations"] for r in rows} == {0}
    _, none = run(db, "episodes_for_checkpoint", {"checkpoint_id": db.corpus.base_checkpoint_id})
    assert none == []  # a base model has no training lineage
    # The fine-tuned checkpoint learned from its own snapshot and from its parent's.
    _, child = run(db, "episodes_for_checkpoint", {"checkpoint_id": db.corpus.child_checkpoint_id})
    own = db.downstream.child_dataset.id
    got = {(as_uuid(r["dataset_id"]), as_uuid(r["episode_id"]), r["generations"]) for r in child}
    assert got == {(own, e, 0) for e, _ in db.lineage(own)} | {
        (db.dataset_id, e, 1) for e, _ in lineage
    }


def test_lineage_of_an_episode_reaches_every_dataset_and_checkpoint(db: Populated) -> None:
    corpus, down = db.corpus, db.downstream
    in_parent = min(e for e, _ in db.lineage(down.dataset.id))
    _, rows = run(db, "lineage_of_episode", {"lineage_episode_id": in_parent})

    def maybe(value: object) -> uuid.UUID | None:
        return None if value is None else as_uuid(value)

    assert {
        (as_uuid(r["dataset_id"]), maybe(r["checkpoint_id"]), r["generations"], r["algo"])
        for r in rows
    } == {
        (down.dataset.id, corpus.checkpoint_id, 0, "sft"),
        (down.dataset.id, corpus.child_checkpoint_id, 1, "sft"),
        # The GRPO run on the same snapshot (the cookbook data's), no checkpoint registered:
        (down.dataset.id, None, None, "grpo"),
    }
    assert {maybe(r["trained_checkpoint_id"]) for r in rows} == {corpus.checkpoint_id, None}
    assert rows[-1]["algo"] == "grpo"  # a run without a checkpoint sorts last on both
    in_child = min(e for e, _ in db.lineage(down.child_dataset.id))
    _, rows = run(db, "lineage_of_episode", {"lineage_episode_id": in_child})
    assert [(as_uuid(r["checkpoint_id"]), r["generations"]) for r in rows] == [
        (corpus.child_checkpoint_id, 0)
    ]
    # A snapshot nobody trained on still shows, with no checkpoint.
    untrained = min(e for e, _ in db.lineage(down.untrained_dataset.id))
    _, rows = run(db, "lineage_of_episode", {"lineage_episode_id": untrained})
    assert [(as_uuid(r["dataset_id"]), r["checkpoint_id"], r["algo"]) for r in rows] == [
        (down.untrained_dataset.id, None, None)
    ]


def test_quality_per_template_matches_the_gate(db: Populated) -> None:
    gate = db.corpus.gate("noisy")
    template_of = {str(t.episode_id): t.template for t in db.corpus.all_trajectories()}
    expected: dict[str, Counter[str]] = defaultdict(Counter)
    scores: dict[str, list[float]] = defaultdict(list)
    for v in gate.report.episode_verdicts():
        expected[template_of[v.episode_id]][str(v.verdict)] += 1
        scores[template_of[v.episode_id]].append(v.quality_score)
    _, rows = run(db, "quality_per_template")
    assert {r["template"] for r in rows} == set(expected)
    for r in rows:
        counts = expected[r["template"]]
        assert (r["episodes"], r["keep"], r["downweight"], r["discard"]) == (
            sum(counts.values()),
            counts["keep"],
            counts["downweight"],
            counts["discard"],
        )
        assert math.isclose(
            r["mean_quality"], sum(scores[r["template"]]) / len(scores[r["template"]])
        )
        assert math.isclose(r["min_quality"], min(scores[r["template"]]))


def test_grpo_reward_by_step_follows_the_rollouts(db: Populated) -> None:
    episodes = {t.episode_id: t for t in db.corpus.trajectories["noisy"]}
    cells: dict[tuple[int, str], list[Any]] = defaultdict(list)
    for row in db.downstream.grpo_rollouts:
        cells[(row.policy_version, episodes[row.episode_id].template)].append(row)
    _, rows = run(db, "grpo_reward_by_step")
    assert [(r["policy_version"], r["template"]) for r in rows] == sorted(cells)
    for r in rows:
        cell = cells[(r["policy_version"], r["template"])]
        rewarded = [g for g in cell if g.reward is not None]
        wins = sum(episodes[g.episode_id].status == EpisodeStatus.SUCCESS for g in rewarded)
        assert (r["rollouts"], r["infrastructure"], r["trained"], r["successes"]) == (
            len(cell),
            len(cell) - len(rewarded),
            sum(g.advantage is not None for g in cell),
            wins,
        )
        if rewarded:
            assert math.isclose(
                float(r["mean_reward"]), sum(g.reward or 0.0 for g in rewarded) / len(rewarded)
            )
            assert math.isclose(r["success_rate"], wins / len(rewarded))
        else:
            assert r["mean_reward"] is None and r["success_rate"] is None
    assert {r["policy_version"] for r in rows} == {0, 1}
    _, other = run(db, "grpo_reward_by_step", {"training_run_id": uuid.uuid4()})
    assert other == []


def test_typed_columns_give_the_same_python_types_on_both(db: Populated) -> None:
    """The document's advice: `.columns(…=Uuid())` / `UTCDateTime()` give UUIDs and aware
    datetimes on SQLite too (raw `text()` gives hex strings and text there)."""
    ids = text(QUERIES["claimed_success_but_failed"].sql).columns(episode_id=Uuid())
    times = text("SELECT started_at FROM episode").columns(started_at=UTCDateTime())
    with db.engine.connect() as conn:
        episode_ids = conn.execute(ids).scalars().all()
        started = conn.execute(times).scalars().all()
    assert episode_ids and all(isinstance(i, uuid.UUID) for i in episode_ids)
    expected = sorted(t.started_at for t in db.corpus.all_trajectories() if t.started_at)
    assert sorted(started) == expected
    assert all(t.tzinfo is not None for t in started)


# --- a regression the cookbook data ran into: 32-bit fault seeds on PostgreSQL -------


def test_high_fault_seed_ingests_on_postgres(sqlite_db: Populated, pg_url: str) -> None:
    engine = make_engine(DatabaseSettings(url=pg_url))
    try:
        migrate.upgrade(engine)
        original = sqlite_db.corpus.trajectories["noisy"][0]
        faulted = original.model_copy(update={"fault_seed": 2**32 - 1})
        ingest_episodes(engine, [EpisodeBundle(trajectory=faulted)])
        with engine.connect() as conn:
            stored = conn.execute(select(col(Episode.fault_seed))).scalar_one()
        assert stored == 2**32 - 1
    finally:
        engine.dispose()
