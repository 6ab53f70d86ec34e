"""Episodes through storage: objects first, rows second; idempotent; NUL-safe; round trips."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, text
from sqlmodel import col

from agent.trajectory import Trajectory
from models import Artifact, Episode, Step
from storage.episodes import load_trajectory, persist_episodes
from storage.errors import IngestError, ObjectStoreError
from storage.ingest import EpisodeBundle, ingest_episodes, rows_for
from storage.objects import LocalObjectStore, ObjectInfo, ObjectStore
from storage.orphans import list_orphans
from storage.rows import STEP_COLUMNS, EpisodeRows, mark_storage_error, prepare_rows, step_row
from tests.storage.builders import make_trajectory


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    s = LocalObjectStore(tmp_path / "objects")
    s.check()
    return s


def _count(engine: Engine, model: type) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


def test_round_trip_json_sql_objects(migrated_engine: Engine, store: LocalObjectStore) -> None:
    t = make_trajectory(n_steps=4)
    assert Trajectory.model_validate_json(t.model_dump_json(by_alias=True)).model_dump(
        mode="json"
    ) == t.model_dump(mode="json")
    report = persist_episodes(migrated_engine, store, [t])
    assert report.inserted == [t.episode_id]
    assert report.steps == 4
    loaded = load_trajectory(migrated_engine, store, t.episode_id)
    assert loaded.model_dump(mode="json") == t.model_dump(mode="json")
    with migrated_engine.connect() as conn:
        row = conn.execute(select(Episode).where(col(Episode.id) == t.episode_id)).one()
        assert row.status == "success" and row.n_steps == 4 and row.n_tool_errors == 1
        assert row.n_injected_faults == 1 and row.started_at == t.started_at
        step = conn.execute(
            select(Step).where(col(Step.episode_id) == t.episode_id, col(Step.step_index) == 0)
        ).one()
        assert step.args == {"command": "ls", "timeout": 5}
        assert step.files_changed[0]["path"] == "out.json"
        assert step.parse_tolerances == ["stripped_markdown_fence"]
        assert step.discounted_return == 0.5


def test_step_token_arrays_live_in_the_trajectory_object_not_in_sql(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    """A policy's sampled ids and logprobs (thousands of numbers a step) round-trip
    through the stored `trajectory.json`; no `step` column holds them."""
    t = make_trajectory(n_steps=3)
    for i, step in enumerate(t.steps):
        step.prompt_token_ids = list(range(4000 + i))
        step.completion_token_ids = [7, 8, 9, 2]
        step.logprobs = [-0.25, -1.5, -0.0, -3.125]
    persist_episodes(migrated_engine, store, [t])
    loaded = load_trajectory(migrated_engine, store, t.episode_id)
    assert [s.prompt_token_ids for s in loaded.steps] == [s.prompt_token_ids for s in t.steps]
    assert [(s.completion_token_ids, s.logprobs) for s in loaded.steps] == [
        ([7, 8, 9, 2], [-0.25, -1.5, -0.0, -3.125])
    ] * 3
    arrays = {"prompt_token_ids", "completion_token_ids", "logprobs"}
    assert not arrays & set(STEP_COLUMNS)
    assert not arrays & {c.name for c in Step.__table__.columns}  # type: ignore[attr-defined]


def test_second_ingest_changes_nothing_and_says_so(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    batch = [make_trajectory(task=f"t{i}") for i in range(3)]
    first = persist_episodes(migrated_engine, store, batch)
    assert len(first.inserted) == 3
    before = (
        _count(migrated_engine, Episode),
        _count(migrated_engine, Step),
        _count(migrated_engine, Artifact),
    )
    objects_before = list(store.list(""))
    second = persist_episodes(migrated_engine, store, [*batch, make_trajectory(task="t9")])
    assert sorted(second.skipped_existing, key=str) == sorted(
        (t.episode_id for t in batch), key=str
    )
    assert len(second.inserted) == 1
    assert "already present" in second.summary()
    assert _count(migrated_engine, Episode) == before[0] + 1
    assert set(objects_before) <= set(store.list(""))


def test_nul_and_invalid_utf8_are_cleaned_in_rows_and_kept_in_objects(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    raw = b"ok\x00\xff\xfebinary\n"
    t = make_trajectory(stdout=raw)
    t.steps[0].args = {"command": "printf 'a\x00b'"}
    t.steps[0].raw_output = "before\x00after"
    persist_episodes(migrated_engine, store, [t])
    with migrated_engine.connect() as conn:
        step = conn.execute(
            select(Step).where(col(Step.episode_id) == t.episode_id, col(Step.step_index) == 0)
        ).one()
    assert "\x00" not in step.stdout and "\x00" not in step.raw_output
    assert step.args == {"command": "printf 'ab'"}
    assert step.stdout_key is not None
    assert store.get(step.stdout_key) == raw


def test_no_row_points_at_a_missing_object(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    persist_episodes(
        migrated_engine, store, [make_trajectory(task=f"t{i}", stdout=b"\xff") for i in range(3)]
    )
    with migrated_engine.connect() as conn:
        keys = list(conn.execute(select(col(Artifact.key))).scalars())
        keys += [k for k in conn.execute(select(col(Step.stdout_key))).scalars() if k]
        keys += [k for k in conn.execute(select(col(Episode.trajectory_key))).scalars() if k]
    assert keys and all(store.exists(k) for k in keys)
    assert list_orphans(migrated_engine, store).keys == []


class _BrokenStore(LocalObjectStore):
    """A real local store whose uploads fail for one episode (simulates an outage mid-batch)."""

    def __init__(self, root: Path, fail_for: uuid.UUID) -> None:
        super().__init__(root)
        self.fail_for = str(fail_for)

    def put(
        self, key: str, data: bytes, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        if self.fail_for in key:
            raise ObjectStoreError("simulated outage")
        return super().put(key, data, content_type=content_type)


def test_failed_upload_is_recorded_as_storage_error(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    good, bad = make_trajectory(task="good"), make_trajectory(task="bad")
    store = _BrokenStore(tmp_path / "objects", bad.episode_id)
    persist_episodes(migrated_engine, store, [good, bad])
    with migrated_engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(select(Episode))}
    assert rows[good.episode_id].status == "success"
    assert rows[bad.episode_id].status == "storage_error"
    assert "simulated outage" in rows[bad.episode_id].failure_reason
    assert rows[bad.episode_id].trajectory_key is None


def test_failed_batch_leaves_nothing(migrated_engine: Engine, store: ObjectStore) -> None:
    t = make_trajectory()
    t.steps[1].index = 0  # duplicate step index: the primary key refuses the batch
    with pytest.raises(IngestError, match="nothing was committed"):
        ingest_episodes(
            migrated_engine,
            [EpisodeBundle(trajectory=make_trajectory(task="ok")), EpisodeBundle(trajectory=t)],
        )
    assert _count(migrated_engine, Episode) == 0
    assert _count(migrated_engine, Step) == 0


def test_postgres_ingest_uses_copy(pg_url: str, store: LocalObjectStore) -> None:
    from storage import migrate
    from storage.db import make_engine
    from storage.settings import DatabaseSettings

    engine = make_engine(DatabaseSettings(url=pg_url))
    migrate.upgrade(engine)
    statements: list[str] = []
    from sqlalchemy import event

    # COPY runs on the raw psycopg cursor, so SQLAlchemy never sees an INSERT INTO step.
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    persist_episodes(engine, store, [make_trajectory(task=f"t{i}", n_steps=5) for i in range(4)])
    assert not any("INSERT INTO step" in s for s in statements)
    assert _count(engine, Step) == 20
    with engine.connect() as conn:
        kinds = conn.execute(
            text("SELECT jsonb_typeof(args) FROM step WHERE args IS NOT NULL LIMIT 1")
        ).scalar_one()
    assert kinds == "object"
    engine.dispose()


def test_views_answer_on_ingested_data(migrated_engine: Engine, store: LocalObjectStore) -> None:
    persist_episodes(
        migrated_engine, store, [make_trajectory(task=f"t{i}", n_steps=3) for i in range(2)]
    )
    with migrated_engine.connect() as conn:
        summary = conn.execute(
            text("SELECT status, n_steps FROM episode_summary ORDER BY episode_id")
        ).all()
        rates = conn.execute(
            text(
                "SELECT tool, fault_kind, calls, failures, failure_rate FROM tool_failure_rates ORDER BY fault_kind"
            )
        ).all()
    assert [tuple(r) for r in summary] == [("success", 3), ("success", 3)]
    assert [tuple(r) for r in rates] == [
        ("execute_shell", "latency", 2, 2, 1.0),
        ("execute_shell", "none", 2, 0, 0.0),
    ]


def test_json_columns_are_cleaned_on_both_databases(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    # What jsonb cannot take as it is: NULs, in values and in keys, nested; and a parent
    # row (the task) with a NUL in its prompt. (Lone surrogates cannot reach a row: the
    # trajectory object written first refuses them; `json_text` is tested on them alone.)
    t = make_trajectory(task="odd-json")
    t.prompt = "do\x00 it"
    t.steps[0].args = {"command": "x\x00y", "k\x00": 1, "nested": [{"v": "a\x00"}]}
    t.steps[0].native_tool_calls = [{"id": 1, "function": {"name": "n\x00"}}]
    persist_episodes(migrated_engine, store, [t])
    with migrated_engine.connect() as conn:
        step = conn.execute(
            select(Step).where(col(Step.episode_id) == t.episode_id, col(Step.step_index) == 0)
        ).one()
        prompt = conn.execute(text("SELECT prompt FROM task WHERE id = :id"), {"id": t.task_id})
        assert prompt.scalar_one() == "do it"
    assert step.args == {"command": "xy", "k": 1, "nested": [{"v": "a"}]}
    assert step.native_tool_calls == [{"id": 1, "function": {"name": "n"}}]


def test_step_values_cover_the_step_table() -> None:
    # COPY names the columns of `STEP_COLUMNS`; a column added to the model but not to the
    # builder would be left to its default silently, so the two must match exactly.
    assert sorted(STEP_COLUMNS) == sorted(c.name for c in Step.__table__.columns)  # type: ignore[attr-defined]
    t = make_trajectory(n_steps=2)
    row = step_row(t.episode_id, t.steps[1], output_keys={"stdout": "k1"})
    assert row["step_index"] == 1 and row["stdout_key"] == "k1" and row["stderr_key"] is None
    assert row["discounted_return"] == t.steps[1].return_


def test_an_id_twice_in_one_batch_is_written_once_and_sql_matches_the_object(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    short = make_trajectory(n_steps=1)
    long = make_trajectory(n_steps=3)
    assert short.episode_id == long.episode_id
    report = persist_episodes(migrated_engine, store, [short, long])
    assert report.inserted == [short.episode_id] and report.steps == 1
    assert load_trajectory(migrated_engine, store, short.episode_id) == short
    with migrated_engine.connect() as conn:
        rows = conn.execute(select(col(Artifact.key), col(Artifact.sha256))).all()
    for key, sha in rows:
        assert hashlib.sha256(store.get(key)).hexdigest() == sha, key


def test_rows_built_where_episodes_finish_are_the_rows_ingest_builds(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    # A collection hands the writer each episode's rows, built when it finished
    # (`rows_for`); the writer puts the object keys in. Rows that do not fit the
    # trajectory (other steps, another outcome) or the writer (the other JSON form) are
    # built again.
    big = b"z" * 40_000  # over the SQL text cap: step 0's stdout becomes an object
    plain = make_trajectory("rows-run", stdout=big, n_steps=3)
    copies = [plain.model_copy(update={"episode_id": uuid.uuid4()}, deep=True) for _ in range(3)]
    ready, other_steps, other_form = copies
    on_postgres = migrated_engine.dialect.name == "postgresql"
    handed = {
        ready.episode_id: rows_for(migrated_engine, ready),
        other_steps.episode_id: EpisodeRows(
            other_steps.episode_id,
            rows_for(migrated_engine, other_steps).episode,
            rows_for(migrated_engine, make_trajectory(n_steps=2)).steps,
            json_text=on_postgres,
        ),
        other_form.episode_id: prepare_rows(other_form, json_text=not on_postgres),
    }
    assert not handed[other_steps.episode_id].fits(other_steps, json_text=on_postgres)
    report = persist_episodes(migrated_engine, store, [plain, *copies], rows=handed)
    assert report.steps == 12
    with migrated_engine.connect() as conn:
        rows = conn.execute(select(Step.__table__).order_by(col(Step.step_index))).all()  # type: ignore[attr-defined]
    by_episode: dict[uuid.UUID, list[dict[str, object]]] = {}
    for r in rows:
        values = dict(r._mapping)
        key = values.pop("stdout_key")
        eid = values.pop("episode_id")
        if key is not None:
            assert key == f"episodes/rows-run/{eid}/steps/{values['step_index']:04d}.stdout"
        values["has_stdout_object"] = key is not None
        by_episode.setdefault(eid, []).append(values)
    expected = by_episode[plain.episode_id]
    assert any(v["has_stdout_object"] for v in expected)
    assert expected[0]["args"] == {"command": "ls", "timeout": 5}
    for t in copies:
        assert by_episode[t.episode_id] == expected
    with migrated_engine.connect() as conn:
        episodes = {
            r.id: r
            for r in conn.execute(select(Episode.__table__)).all()  # type: ignore[attr-defined]
        }
    for t in [plain, *copies]:
        assert (
            episodes[t.episode_id].trajectory_key
            == f"episodes/rows-run/{t.episode_id}/trajectory.json"
        )
        assert episodes[t.episode_id].n_steps == 3

    # Rows built while the episode was a success; its objects then failed to store.
    late = plain.model_copy(update={"episode_id": uuid.uuid4()}, deep=True)
    ready_rows = rows_for(migrated_engine, late)
    failed = mark_storage_error(late, "object store: down")
    assert not ready_rows.fits(failed, json_text=on_postgres)
    ingest_episodes(migrated_engine, [EpisodeBundle(trajectory=failed, rows=ready_rows)])
    with migrated_engine.connect() as conn:
        table = Episode.__table__  # type: ignore[attr-defined]
        row = conn.execute(select(table).where(table.c.id == late.episode_id)).one()
    assert (row.status, row.failure_reason, row.trajectory_key) == (
        "storage_error",
        "object store: down",
        None,
    )
