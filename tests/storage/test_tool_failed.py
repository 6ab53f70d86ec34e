"""One definition of a failed tool call: `Step.tool_failed` in Python, `tool_failed_sql` in
SQL and the `tool_failure_rates` view agree on every edge, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from agent.trajectory import InjectedFault, ParseKind, Step
from models.step import tool_failed_sql
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from storage.run_reads import resolve_run, tool_call_counts
from tests.storage.builders import make_trajectory

EDGES: dict[str, dict[str, Any]] = {
    "exit 0": {"exit_code": 0},
    "exit 2": {"exit_code": 2},
    "exit unknown (imported)": {"exit_code": None},
    "timed out": {"exit_code": None, "timed_out": True, "error_type": "timeout"},
    "timed out, exit 0": {"exit_code": 0, "timed_out": True},
    "killed by a signal": {"exit_code": None, "signal": 9},
    "typed error, exit 0": {"exit_code": 0, "error_type": "not_found"},
    "injected fault": {
        "exit_code": None,
        "error_type": "permission_denied",
        "injected_fault": InjectedFault(kind="permission_denied", detail={}),
    },
    "injected latency, exit 0": {
        "exit_code": 0,
        "injected_fault": InjectedFault(kind="latency", detail={"latency_ms": 1000}),
    },
    "sandbox crashed": {"exit_code": None, "error_type": "sandbox_crashed"},
}
"""Tool-call steps on every edge of the rule, by name."""
EXPECTED = {
    "exit 0": False,
    "exit 2": True,
    "exit unknown (imported)": False,
    "timed out": True,
    "timed out, exit 0": True,
    "killed by a signal": True,
    "typed error, exit 0": True,
    "injected fault": True,
    "injected latency, exit 0": False,
    "sandbox crashed": True,
}


def _steps() -> list[Step]:
    steps = [
        Step(
            index=i,
            history_hash=f"{i:064x}",
            parse_kind=ParseKind.TOOL_CALL,
            call_id=f"c{i}",
            tool=f"t{i}",
            args={},
            **fields,
        )
        for i, fields in enumerate(EDGES.values())
    ]
    n = len(steps)
    # Turns that made no call never count, whatever their other columns say.
    steps.append(
        Step(
            index=n, history_hash="e" * 64, parse_kind=ParseKind.ERROR, parse_error="x", exit_code=1
        )
    )
    steps.append(Step(index=n + 1, history_hash="f" * 64, parse_kind=ParseKind.FINAL))
    return steps


def test_python_sql_and_view_agree_on_every_edge(migrated_engine: Engine, tmp_path: Path) -> None:
    trajectory = make_trajectory(run_key="edges").model_copy(update={"steps": _steps()})
    persist_episodes(migrated_engine, LocalObjectStore(tmp_path / "objects"), [trajectory])

    python = {s.index: s.tool_failed for s in trajectory.steps}
    names = list(EDGES)
    assert {names[i]: python[i] for i in range(len(names))} == EXPECTED
    assert not python[len(names)] and not python[len(names) + 1]

    with migrated_engine.connect() as conn:
        sql = {
            int(i): bool(failed)
            for i, failed in conn.execute(
                text(
                    f"SELECT step_index, CASE WHEN {tool_failed_sql('s')} THEN 1 ELSE 0 END "
                    "FROM step s"
                )
            ).all()
        }
        view = {
            tool: (int(calls), int(failures))
            for tool, calls, failures in conn.execute(
                text("SELECT tool, calls, failures FROM tool_failure_rates")
            ).all()
        }
        n_tool_errors = conn.execute(text("SELECT n_tool_errors FROM episode")).scalar_one()
    assert sql == python
    assert view == {f"t{i}": (1, int(python[i])) for i in range(len(names))}
    assert n_tool_errors == sum(python.values())
    counts = tool_call_counts(migrated_engine, resolve_run(migrated_engine, "edges"))
    assert {c.tool: (c.calls, c.failed) for c in counts} == view
