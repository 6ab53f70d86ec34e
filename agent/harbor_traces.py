"""Harbor's `*.traces.json` as trajectories: one episode per trial.

Harbor's trace export writes one row per LLM call, each row the whole conversation so
far (`conversations`: OpenAI-style `role`/`content` messages) with the call's context
(`agent`, `model`, `task`, `episode`, `run_id`, `trial_name`, `result`). A trial's last
row (in file order) is therefore its whole conversation: that row becomes the episode,
converted like an OpenAI chat import (`agent.export.from_openai_messages`), with the task
id `harbor/<task>` and the policy `harbor:<agent>#<model>`. The earlier rows are
prefixes of it and add nothing. `result` is not read as an outcome: the import records
none it was not given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.export import from_openai_messages
from agent.trajectory import Trajectory

__all__ = ["HARBOR_TRACES_RUN_KEY", "from_harbor_traces"]

HARBOR_TRACES_RUN_KEY = "import:harbor-traces"
"""Run key of imported Harbor traces when none is given."""

_REQUIRED = ("conversations", "task", "trial_name")


def _row_problem(row: Any) -> str | None:
    if not isinstance(row, dict):
        return "a trace row is a JSON object"
    for key in _REQUIRED:
        if key not in row:
            return f"{key}: Field required"
    if not isinstance(row["conversations"], list) or not all(
        isinstance(m, dict) for m in row["conversations"]
    ):
        return "conversations: a list of chat messages (objects)"
    for key in ("task", "trial_name"):
        if not isinstance(row[key], str) or not row[key]:
            return f"{key}: a non-empty string"
    for key in ("agent", "model", "run_id"):
        if row.get(key) is not None and not isinstance(row[key], str):
            return f"{key}: a string"
    return None


def from_harbor_traces(
    rows: Sequence[Any], *, run_key: str | None = None
) -> list[tuple[int, Trajectory]]:
    """One trajectory per trial of `rows`, each with the 1-based number of the row it
    came from (its trial's last), in the order the trials first appear.

    Raises:
        ValueError: a row is not a trace row; the message starts with `row N: ` and names
            the field.
    """
    last: dict[tuple[str | None, str], int] = {}  # insertion order: first appearance
    for n, row in enumerate(rows, start=1):
        problem = _row_problem(row)
        if problem is not None:
            raise ValueError(f"row {n}: {problem}")
        last[(row.get("run_id"), row["trial_name"])] = n
    out: list[tuple[int, Trajectory]] = []
    for n in last.values():
        row = rows[n - 1]
        agent, model = row.get("agent") or "unknown", row.get("model")
        try:
            traj = from_openai_messages(
                row["conversations"],
                run_key=run_key or HARBOR_TRACES_RUN_KEY,
                task_id=f"harbor/{row['task']}",
                policy=f"harbor:{agent}" + (f"#{model}" if model else ""),
            )
        except ValueError as e:
            raise ValueError(f"row {n}: {str(e).replace('messages.', 'conversations.', 1)}") from e
        out.append((n, traj))
    return out
