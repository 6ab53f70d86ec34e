"""`epiflow demo`: the main job on embedded defaults (SQLite, a local object directory).

Today it migrates a fresh database, writes an episode through storage (objects first,
then rows), reads it back and checks the round trip, then prints where to look.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import text

from agent.trajectory import (
    EpisodeStatus,
    FailureCategory,
    ParseKind,
    Step,
    Trajectory,
    episode_id_for,
    history_hash,
    utcnow,
)
from flows.settings import Settings
from sandbox.tool_specs import tool_versions
from storage import migrate
from storage.db import make_engine
from storage.episodes import load_trajectory, persist_episodes
from storage.objects import make_object_store


def _sample_trajectory(run_key: str) -> Trajectory:
    started = utcnow()
    messages = [{"role": "user", "content": "List /workspace/data."}]
    steps = [
        Step(
            index=0,
            history_hash=history_hash(messages),
            raw_output=(
                'I will list the data directory first.\n<tool_call id="c1" name="list_dir">\n'
                '<arg name="path">/workspace/data</arg>\n</tool_call>'
            ),
            parse_kind=ParseKind.TOOL_CALL,
            call_id="c1",
            tool="list_dir",
            args={"path": "/workspace/data"},
            exit_code=0,
            stdout="a.csv\nb.csv\n",
            stdout_bytes=b"a.csv\nb.csv\n",
        ),
        Step(
            index=1,
            history_hash=history_hash([*messages, {"role": "assistant", "content": "…"}]),
            raw_output="<final>Two files: a.csv and b.csv.</final>",
            parse_kind=ParseKind.FINAL,
            final_answer="Two files: a.csv and b.csv.",
        ),
    ]
    return Trajectory(
        episode_id=episode_id_for(run_key, "demo/list_dir@1#0", 0),
        run_key=run_key,
        task_id="demo/list_dir@1#0",
        suite="demo",
        suite_version="1",
        template="list_dir",
        prompt="List /workspace/data.",
        policy="scripted:demo",
        tool_versions=tool_versions(),
        started_at=started,
        ended_at=utcnow(),
        status=EpisodeStatus.SUCCESS,
        failure_category=FailureCategory.SUCCESS,
        verifier_score=1.0,
        final_answer="Two files: a.csv and b.csv.",
        steps=steps,
    )


def run_demo(settings: Settings, *, console: Console) -> dict[str, Any]:
    """Run the demo; returns the JSON summary."""
    # Check both stores before writing anything, so a bad setting leaves nothing half-done.
    engine = make_engine(settings.database)
    store = make_object_store(settings.objects)
    store.check()
    before = migrate.current_revision(engine)
    revision = migrate.upgrade(engine)
    console.print(
        f"[bold]1. database[/] {settings.database.redacted_url()}: {before or 'empty'} -> {revision}"
    )

    trajectory = _sample_trajectory(f"demo-{utcnow():%Y%m%dT%H%M%S}")
    report = persist_episodes(engine, store, [trajectory])
    console.print(f"[bold]2. storage[/] {report.summary()} (objects in {store.location})")

    loaded = load_trajectory(engine, store, trajectory.episode_id)
    round_trip = loaded.model_dump(mode="json") == trajectory.model_dump(mode="json")
    with engine.connect() as conn:
        summary_row = conn.execute(
            text(
                "SELECT status, n_steps, verifier_score FROM episode_summary WHERE episode_id = :id"
            ),
            {
                "id": trajectory.episode_id.hex
                if settings.database.is_sqlite
                else trajectory.episode_id
            },
        ).one()
    console.print(
        f"[bold]3. read back[/] episode {trajectory.episode_id}: round trip "
        f"{'identical' if round_trip else 'DIFFERENT'}; episode_summary says "
        f"status={summary_row.status}, steps={summary_row.n_steps}"
    )
    db_path = settings.database.redacted_url()
    console.print(
        "\n[bold]Where to look[/]\n"
        f"  SQL:      {db_path}  (views: episode_summary, tool_failure_rates, quality_by_suite, training_lineage)\n"
        f"  objects:  {store.location}\n"
    )
    return {
        "episodes": 1,
        "schema_revision": revision,
        "ingest": report.model_dump(mode="json"),
        "round_trip_identical": round_trip,
        "paths": {
            "database": db_path,
            "objects": store.location,
            "episode": str(trajectory.episode_id),
        },
        "objects_dir_exists": Path(store.location).exists() if not settings.objects.is_s3 else None,
    }
