"""Imported outcomes are honest (SQLite and PostgreSQL): what a file did not record is
unknown — status `imported`, no reward, no times — never a default; `epiflow show` invents
nothing; importing a file again changes no row of any table; the consumers (success
rates, QC features, DPO/KTO builders) leave unknown outcomes out."""

from __future__ import annotations

import copy
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from sqlalchemy import Engine, select, text
from sqlmodel import SQLModel, col

from agent.trajectory import (
    EpisodeStatus,
    FailureCategory,
    Trajectory,
    success_rate,
)
from cli.show import render_trajectory
from models import Artifact, Episode, Step
from storage.episodes import load_trajectory, persist_episodes
from storage.exchange import import_file
from storage.objects import LocalObjectStore
from tests.interop import ATIF_NAMES, atif_file, interop_dir, load
from tests.storage.builders import make_trajectory


def _store(tmp_path: Path) -> LocalObjectStore:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    return store


def _without_timestamps(document: dict[str, Any]) -> dict[str, Any]:
    bare = copy.deepcopy(document)
    for step in bare["steps"]:
        step.pop("timestamp", None)
    return bare


def _foreign_files(tmp_path: Path) -> list[tuple[Path, str]]:
    """One file of each import format, with no times anywhere (an ATIF file stripped of
    its timestamps, OpenAI messages, Harbor traces)."""
    atif = tmp_path / "no-times.trajectory.json"
    atif.write_text(json.dumps(_without_timestamps(load(atif_file(ATIF_NAMES[0])))))
    chat = tmp_path / "chat.json"
    chat.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "List the files."},
                    {
                        "role": "assistant",
                        "content": '<tool_call id="c1" name="run_command">'
                        '<arg name="command">ls</arg></tool_call>',
                    },
                    {"role": "user", "content": "a.txt"},
                    {"role": "assistant", "content": "<final>a.txt</final>"},
                ]
            }
        )
    )
    traces = sorted((interop_dir() / "traces").glob("*.traces.json"))[0]
    return [(atif, "atif"), (chat, "openai"), (traces, "harbor-traces")]


def _snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, sorted: two snapshots are equal when no row changed."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for table in SQLModel.metadata.sorted_tables:
            rows = conn.execute(text(f"SELECT * FROM {table.name}")).all()
            out[table.name] = sorted((tuple(r) for r in rows), key=repr)
    return out


def test_unrecorded_outcomes_and_times_are_unknown_not_defaults(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = _store(tmp_path)
    ids = []
    for path, fmt in _foreign_files(tmp_path):
        report = import_file(migrated_engine, store, path, fmt)
        assert report.inserted, (fmt, report)
        ids.extend(report.inserted)
    with migrated_engine.connect() as conn:
        episodes = conn.execute(
            select(
                col(Episode.status),
                col(Episode.failure_category),
                col(Episode.started_at),
                col(Episode.ended_at),
                col(Episode.duration_ms),
                col(Episode.final_reward),
                col(Episode.total_reward),
                col(Episode.created_at),
            ).where(col(Episode.id).in_(ids))
        ).all()
        step_times = conn.execute(
            select(col(Step.started_at)).where(col(Step.episode_id).in_(ids))
        ).scalars()
        assert set(step_times) == {None}
        summary = conn.execute(
            text("SELECT DISTINCT status, started_at FROM episode_summary")
        ).all()
    assert len(episodes) == len(ids)
    for status, category, started, ended, duration, final, total, created in episodes:
        assert (status, category) == ("imported", "imported")
        assert (started, ended, duration, final, total) == (None,) * 5
        assert created is not None  # when the row was written: the file has no times
    assert summary == [("imported", None)]
    for episode_id in ids:
        t = load_trajectory(migrated_engine, store, episode_id)
        assert t.status == EpisodeStatus.IMPORTED
        assert t.failure_category == FailureCategory.IMPORTED
        assert t.started_at is None and all(s.started_at is None for s in t.steps)
        sink = io.StringIO()
        render_trajectory(t, Console(file=sink, width=120), max_chars=None)
        shown = sink.getvalue()
        assert "reward +0.000" not in shown and "return +0.000" not in shown
        assert "no exit code recorded" not in shown and "→ ok" not in shown
        assert "not recorded (imported, no outcome in the file)" in shown


def test_times_come_from_the_file(migrated_engine: Engine, tmp_path: Path) -> None:
    store = _store(tmp_path)
    document = load(atif_file(ATIF_NAMES[0]))
    for i, step in enumerate(document["steps"]):
        step["timestamp"] = f"2025-01-02T03:04:{i:02d}Z"
    path = tmp_path / "timed.trajectory.json"
    path.write_text(json.dumps(document))
    report = import_file(migrated_engine, store, path, "atif")
    t = load_trajectory(migrated_engine, store, report.inserted[0])
    assert t.started_at is not None and t.ended_at is not None
    last = len(document["steps"]) - 1
    assert (t.started_at.isoformat(), t.ended_at.isoformat()) == (
        "2025-01-02T03:04:00+00:00",
        f"2025-01-02T03:04:{last:02d}+00:00",
    )
    assert all(s.started_at is not None for s in t.steps)
    assert t.status == EpisodeStatus.IMPORTED  # times, but still no outcome


def test_a_reimport_changes_no_row_of_any_table(migrated_engine: Engine, tmp_path: Path) -> None:
    store = _store(tmp_path)
    files = [*_foreign_files(tmp_path), (atif_file(ATIF_NAMES[1]), "atif")]
    for path, fmt in files:
        import_file(migrated_engine, store, path, fmt)
    before = _snapshot(migrated_engine)
    objects = {k: store.get(k) for k in store.list("episodes/")}
    for path, fmt in files:
        again = import_file(migrated_engine, store, path, fmt)
        assert again.inserted == [] and again.skipped_existing, (fmt, again)
    assert _snapshot(migrated_engine) == before  # the import runs' ended_at included
    assert {k: store.get(k) for k in store.list("episodes/")} == objects


def test_success_rate_and_training_leave_unknown_outcomes_out() -> None:
    assert success_rate({"success": 1, "failed": 1, "imported": 5}) == 0.5
    assert success_rate({"imported": 3}) == 0.0

    from training.builders import SourceEpisode, dpo_rows, kto_rows

    win = make_trajectory("w", n_steps=1)
    win.status = EpisodeStatus.SUCCESS
    unknown = make_trajectory("u", n_steps=1)
    unknown.status, unknown.failure_category = EpisodeStatus.IMPORTED, FailureCategory.IMPORTED
    sources = [SourceEpisode(trajectory=t, verdict="keep") for t in (win, unknown)]
    assert dpo_rows(sources).rows == []  # an unknown outcome is no loss to pair with
    kto = kto_rows(sources)
    assert {e.episode_id for e in kto.lineage} == {win.episode_id}


def test_an_id_twice_in_one_batch_gives_sql_object_and_show_the_same_steps(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = _store(tmp_path)
    short = make_trajectory("dup-run", n_steps=1)
    long = make_trajectory("dup-run", n_steps=3)
    assert short.episode_id == long.episode_id
    persist_episodes(migrated_engine, store, [short, long])
    with migrated_engine.connect() as conn:
        n_steps = conn.execute(
            select(col(Episode.n_steps)).where(col(Episode.id) == short.episode_id)
        ).scalar_one()
        step_rows = len(
            conn.execute(
                select(col(Step.step_index)).where(col(Step.episode_id) == short.episode_id)
            ).all()
        )
        artifacts = conn.execute(
            select(col(Artifact.key), col(Artifact.sha256), col(Artifact.size))
        ).all()
    stored: Trajectory = load_trajectory(migrated_engine, store, short.episode_id)
    sink = io.StringIO()
    render_trajectory(stored, Console(file=sink, width=120), max_chars=None)
    shown_steps = sum(1 for line in sink.getvalue().splitlines() if "step " in line and "·" in line)
    assert n_steps == step_rows == len(stored.steps) == shown_steps == 1
    for key, sha, size in artifacts:
        body = store.get(key)
        assert (hashlib.sha256(body).hexdigest(), len(body)) == (sha, size), key


def test_the_trajectory_object_is_written_in_pieces_with_the_same_bytes(
    migrated_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage import episodes

    for n in (0, 1, 4):
        t = make_trajectory(f"pieces-{n}", n_steps=n, stdout=b"out\x00put" * 10)
        assert (
            b"".join(episodes.trajectory_json_chunks(t))
            == t.model_dump_json(by_alias=True).encode()
        )
    # Past the spool size the object goes through a temporary file, streamed, and a step
    # with more text than that is written piece by piece, a long string in chunks.
    monkeypatch.setattr(episodes, "TRAJECTORY_SPOOL_BYTES", 100)
    monkeypatch.setattr(episodes, "_STRING_CHUNK", 7)
    store = _store(tmp_path)
    t = make_trajectory("spooled", n_steps=3)
    t.steps[1].observation = 'a "quoted" \\ line\n\u00e9\u2603 ' * 20
    persist_episodes(migrated_engine, store, [t])
    with migrated_engine.connect() as conn:
        key, sha, size = conn.execute(
            select(col(Artifact.key), col(Artifact.sha256), col(Artifact.size)).where(
                col(Artifact.kind) == "trajectory"
            )
        ).one()
    body = store.get(key)
    assert json.loads(body) == json.loads(t.model_dump_json(by_alias=True))
    loaded = load_trajectory(migrated_engine, store, t.episode_id)
    assert loaded.model_dump(mode="json") == t.model_dump(mode="json")  # raw bytes stay out
    assert (hashlib.sha256(body).hexdigest(), len(body)) == (sha, size)


def test_an_observation_past_the_inline_cap_is_an_object_of_its_own(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    from agent.atif_convert import OBSERVATION_INLINE_CAP

    store = _store(tmp_path)
    document = load(atif_file(ATIF_NAMES[0]))
    whole = "é line\n" * (OBSERVATION_INLINE_CAP // 4)
    document["steps"][4]["observation"]["results"][0]["content"] = whole
    path = tmp_path / "long-observation.json"
    path.write_text(json.dumps(document))
    (episode_id,) = import_file(migrated_engine, store, path, "atif").inserted
    with migrated_engine.connect() as conn:
        observation, key = conn.execute(
            select(col(Step.observation), col(Step.observation_key)).where(
                col(Step.episode_id) == episode_id, col(Step.observation_key).is_not(None)
            )
        ).one()
        sha, size = conn.execute(
            select(col(Artifact.sha256), col(Artifact.size)).where(col(Artifact.key) == key)
        ).one()
    assert key is not None and observation is not None
    body = store.get(key)
    assert body.decode() == whole and key.endswith(".observation")
    assert (hashlib.sha256(body).hexdigest(), len(body)) == (sha, size)
    assert observation.startswith(whole[:OBSERVATION_INLINE_CAP]) and len(observation) < len(whole)
    # The stored trajectory still exports the document back as it was.
    from agent.export import to_atif

    exported = to_atif(load_trajectory(migrated_engine, store, episode_id))
    assert exported["steps"][4]["observation"] == document["steps"][4]["observation"]
