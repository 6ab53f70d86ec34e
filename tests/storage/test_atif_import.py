"""Importing Harbor's ATIF files into SQL and objects (SQLite and PostgreSQL): columns for
what data engineers query, a closed import run, no-op re-imports, `--run-key`, and an
export that a second database imports back to the same trajectories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from sqlmodel import col

from agent.export import from_atif
from agent.trajectory import Trajectory
from models import CollectionRun, Episode, Policy, Step, run_id_for
from storage import migrate
from storage.db import make_engine
from storage.episodes import load_trajectory
from storage.errors import ImportFormatError
from storage.exchange import export_run, import_file
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from tests.interop import ATIF_NAMES, atif_file, linked_files, load


def import_all(engine: Engine, store: LocalObjectStore, **kw: str) -> list[Trajectory]:
    ids = []
    for name in ATIF_NAMES:
        report = import_file(engine, store, atif_file(name), "atif", **kw)
        assert report.documents == 1 and len(report.inserted) == 1, report
        ids.extend(report.inserted)
    return [load_trajectory(engine, store, i) for i in ids]


def test_import_fills_the_columns_and_closes_its_run(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    trajectories = import_all(migrated_engine, store)
    with migrated_engine.connect() as conn:
        run = conn.execute(
            select(col(CollectionRun.status), col(CollectionRun.ended_at)).where(
                col(CollectionRun.id) == run_id_for("import:atif")
            )
        ).one()
        episodes = conn.execute(
            select(
                col(Episode.agent_name),
                col(Episode.agent_version),
                col(Episode.prompt_tokens),
                col(Episode.cost_usd),
                col(Episode.policy_id),
            ).order_by(col(Episode.agent_name), col(Episode.prompt_tokens))
        ).all()
        kinds = set(conn.execute(select(col(Policy.kind))).scalars())
        reasoning = conn.execute(
            select(func.count()).where(col(Step.reasoning_content).is_not(None))
        ).scalar_one()
        step_cost = conn.execute(select(func.sum(col(Step.cost_usd)))).scalar_one()
    assert run[0] == "completed" and run[1] is not None
    assert [(e[0], e[1]) for e in episodes] == [
        ("openhands", "1.0.0"),
        ("terminus-2", "2.0.0"),
        ("terminus-2", "2.0.0"),
    ]
    for document in (load(atif_file(n)) for n in ATIF_NAMES):
        steps = [s for s in document["steps"] if s["source"] == "agent"]
        tokens = sum(s["metrics"]["prompt_tokens"] for s in steps)
        assert tokens in [e[2] for e in episodes]
    assert kinds == {"atif"}
    assert reasoning == 4  # every agent step of the invalid-json file
    expected_cost = sum(
        s["metrics"]["cost_usd"]
        for n in ATIF_NAMES
        for s in load(atif_file(n))["steps"]
        if s["source"] == "agent"
    )
    assert step_cost == pytest.approx(expected_cost)
    # The objects hold the rest: token ids, log probabilities, tool definitions.
    by_agent = {t.agent.name if t.agent else "": t for t in trajectories}
    assert by_agent["openhands"].agent is not None
    assert by_agent["openhands"].agent.tool_definitions
    assert any(s.logprobs for t in trajectories for s in t.steps)


def test_reimport_is_a_no_op_and_run_key_is_honoured(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    path = atif_file(ATIF_NAMES[1])
    first = import_file(migrated_engine, store, path, "atif")
    again = import_file(migrated_engine, store, path, "atif")
    assert again.inserted == [] and again.skipped_existing == first.inserted
    assert "already imported, unchanged" in again.summary()
    keyed = import_file(migrated_engine, store, path, "atif", run_key="harbor-nightly")
    assert keyed.run_keys == ["harbor-nightly"] and keyed.inserted != first.inserted
    with migrated_engine.connect() as conn:
        runs = dict(
            conn.execute(select(col(CollectionRun.run_key), col(CollectionRun.status))).all()
        )
        n = conn.execute(select(func.count()).select_from(Episode)).scalar_one()
    assert runs == {"import:atif": "completed", "harbor-nightly": "completed"}
    assert n == 2


def test_export_then_import_elsewhere_gives_the_same_trajectories(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    original = {t.episode_id: t for t in import_all(migrated_engine, store)}
    exported = tmp_path / "import-atif.jsonl"
    assert export_run(migrated_engine, store, "import:atif", "atif", exported) == 3
    assert all(
        json.loads(line)["schema_version"] == "ATIF-v1.5"
        for line in exported.read_text().splitlines()
    )
    other = make_engine(DatabaseSettings(url=f"sqlite:///{tmp_path / 'other.db'}"))
    try:
        migrate.upgrade(other)
        other_store = LocalObjectStore(tmp_path / "other-objects")
        other_store.check()
        report = import_file(other, other_store, exported, "atif")
        assert sorted(report.inserted) == sorted(original)
        for episode_id, before in original.items():
            after = load_trajectory(other, other_store, episode_id)
            assert after.model_dump(mode="json") == before.model_dump(mode="json")
    finally:
        other.dispose()


def test_an_invalid_document_names_file_and_field_and_writes_nothing(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    good = load(atif_file(ATIF_NAMES[2]))
    bad = load(atif_file(ATIF_NAMES[0]))
    bad["agent"]["tool_definition"] = bad["agent"].pop("tool_definitions")
    path = tmp_path / "harbor.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ImportFormatError) as caught:
        import_file(migrated_engine, store, path, "atif")
    line = caught.value.user_message()
    assert str(path) in line and "document 2" in line and "agent.tool_definition" in line
    with migrated_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Episode)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(CollectionRun)).scalar_one() == 0


def test_linked_v15_files_import_and_reimport_as_no_op(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """Sub-agent and continuation files (`is_copied_context`, `continued_trajectory_ref`)
    are accepted; the stored trajectory is the imported one; a second import writes nothing."""
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    for path in linked_files():
        first = import_file(migrated_engine, store, path, "atif")
        assert len(first.inserted) == 1, first
        stored = load_trajectory(migrated_engine, store, first.inserted[0])
        assert _without_times(stored) == _without_times(from_atif(load(path)))
        again = import_file(migrated_engine, store, path, "atif")
        assert again.inserted == [] and again.skipped_existing == first.inserted


def _without_times(t: Trajectory) -> dict[str, object]:
    """The trajectory minus its start times: these files have no timestamps, and import
    still takes the import time for `started_at` (issue 25 item 3, not yet fixed)."""
    dumped = t.model_dump(mode="json")
    dumped.pop("started_at")
    for step in dumped["steps"]:
        step.pop("started_at")
    return dumped
