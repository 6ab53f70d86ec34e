"""Hand-built trajectories for the scoring and gate tests (shared by both conftests).

The standard task: sum data/sales.csv into out/total.txt. `oracle()` is the clean
solution; `PERTURBATIONS` holds one builder per `scripted:noisy` perturbation kind,
each shaped the way that perturbation shows up in a recorded trajectory.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from agent.trajectory import (
    EpisodeStatus,
    FailureCategory,
    FileChange,
    InjectedFault,
    ParseKind,
    Step,
    Trajectory,
    episode_id_for,
    utcnow,
)

PROMPT = "Sum the amount column of data/sales.csv and write the total to out/total.txt."
CSV = "amount\n20\n22\n"


def call(
    index: int,
    tool: str,
    args: dict[str, Any],
    *,
    text: str = "",
    stdout: str = "",
    stderr: str = "",
    exit_code: int | None = 0,
    error_type: str | None = None,
    files: Sequence[str] = (),
    call_id: str | None = None,
    fault: str | None = None,
    timed_out: bool = False,
    duration_ms: float = 5.0,
) -> Step:
    """A parsed tool call and its recorded result."""
    cid = call_id or f"c{index}"
    return Step(
        index=index,
        history_hash=f"h{index}",
        raw_output=f'{text}<tool_call id="{cid}" name="{tool}">…</tool_call>',
        parse_kind=ParseKind.TOOL_CALL,
        call_id=cid,
        tool=tool,
        args=args,
        observation=f'<tool_result id="{cid}" name="{tool}" exit_code="{exit_code}">{stdout}{stderr}</tool_result>',
        stdout=stdout,
        stderr=stderr,
        exit_code=exit_code,
        error_type=error_type,
        timed_out=timed_out,
        duration_ms=duration_ms,
        files_changed=[
            FileChange(path=p, change="created", size=2, sha256="0" * 64) for p in files
        ],
        injected_fault=InjectedFault(kind=fault) if fault else None,
    )


def parse_error(
    index: int, message: str, raw: str = '<tool_call id="cx" name="read_file">'
) -> Step:
    """A message the protocol parser (or schema check) rejected."""
    return Step(
        index=index,
        history_hash=f"h{index}",
        raw_output=raw,
        parse_kind=ParseKind.ERROR,
        parse_error=message,
        observation=f"<tool_error>{message}</tool_error>",
    )


def final(index: int, text: str = "Done.") -> Step:
    """A `<final>` message."""
    return Step(
        index=index,
        history_hash=f"h{index}",
        raw_output=f"<final>{text}</final>",
        parse_kind=ParseKind.FINAL,
        final_answer=text,
    )


def trajectory(
    steps: Sequence[Step],
    *,
    score: float | None = 1.0,
    status: EpisodeStatus | None = None,
    category: FailureCategory | None = None,
    prompt: str = PROMPT,
    template: str = "csv_sum",
    rollout: int = 0,
    run_key: str = "run-1",
    duration_s: float = 2.0,
) -> Trajectory:
    """An episode around `steps`; status and category follow the verifier score unless given."""
    success = score is not None and score >= 1.0
    status = status or (EpisodeStatus.SUCCESS if success else EpisodeStatus.FAILED)
    category = category or (FailureCategory.SUCCESS if success else FailureCategory.VERIFIER_FAILED)
    started = utcnow()
    steps = [s.model_copy(update={"index": i}) for i, s in enumerate(steps)]
    final_text = next(
        (s.final_answer for s in reversed(steps) if s.parse_kind is ParseKind.FINAL), None
    )
    return Trajectory(
        episode_id=episode_id_for(run_key, f"{template}#{rollout}", rollout),
        run_key=run_key,
        task_id=f"{template}#{rollout}",
        rollout_index=rollout,
        suite="builtin",
        suite_version="1",
        template=template,
        prompt=prompt,
        policy="scripted:test",
        started_at=started,
        ended_at=started + timedelta(seconds=duration_s),
        status=status,
        failure_category=category,
        verifier_score=score,
        verifier_reason="ok" if success else "wrong total",
        final_answer=final_text,
        steps=steps,
    )


def list_step(i: int = 0) -> Step:
    return call(
        i,
        "list_dir",
        {"path": "."},
        text="I will list the workspace first.\n",
        stdout="data/\nout/\n",
    )


def read_step(i: int = 1) -> Step:
    return call(i, "read_file", {"path": "data/sales.csv"}, stdout=CSV)


def write_step(i: int = 2, text: str = "The total is 42.\n") -> Step:
    return call(
        i,
        "write_file",
        {"path": "out/total.txt", "content": "42"},
        text=text,
        files=["out/total.txt"],
    )


def oracle(**kw: Any) -> Trajectory:
    """The clean solution: list, read, write, final."""
    return trajectory([list_step(), read_step(), write_step(), final(3)], **kw)


def labelled(step: Step, kind: str) -> Step:
    """`step` as the `scripted:noisy` policy records it: the perturbation on the step."""
    return step.model_copy(update={"policy_perturbation": kind})


def malformed(**kw: Any) -> Trajectory:
    bad = labelled(
        parse_error(1, "unclosed <tool_call>: no </tool_call> before the end of the message"),
        "malformed",
    )
    return trajectory([list_step(), bad, read_step(), write_step(), final(4)], **kw)


def unknown_tool(**kw: Any) -> Trajectory:
    bad = parse_error(
        1,
        "unknown tool 'run_command'; available tools: execute_shell, list_dir, read_file, write_file",
        raw='<tool_call id="c1" name="run_command"><arg name="path">data/sales.csv</arg></tool_call>',
    )
    bad = labelled(bad, "unknown_tool")
    return trajectory([list_step(), bad, read_step(), write_step(), final(4)], **kw)


def missing_arg(**kw: Any) -> Trajectory:
    bad = parse_error(
        1,
        "tool 'read_file': missing required arg 'path'",
        raw='<tool_call id="c1" name="read_file"></tool_call>',
    )
    bad = labelled(bad, "missing_arg")
    return trajectory([list_step(), bad, read_step(), write_step(), final(4)], **kw)


def mistyped_arg(**kw: Any) -> Trajectory:
    bad = parse_error(
        1,
        "tool 'execute_shell': arg 'timeout' must be an integer, got 'soon'",
        raw='<tool_call id="c1" name="execute_shell"><arg name="command">cat data/sales.csv</arg>'
        '<arg name="timeout">soon</arg></tool_call>',
    )
    bad = labelled(bad, "mistyped_arg")
    return trajectory([list_step(), bad, read_step(), write_step(), final(4)], **kw)


def premature_final(**kw: Any) -> Trajectory:
    kw.setdefault("score", 0.0)
    early = labelled(final(1, "Done."), "premature_final")
    early = early.model_copy(update={"raw_output": "The task is complete.\n" + early.raw_output})
    return trajectory([list_step(), early], **kw)


def fabricated_claim(**kw: Any) -> Trajectory:
    """The agent appends an invented `<tool_result>` to its call; the parser rejects the message."""
    raw = (
        '<tool_call id="c2" name="read_file"><arg name="path">data/sales.csv</arg></tool_call>\n'
        '<tool_result id="c2" name="read_file" exit_code="0">OK</tool_result>\nThe call succeeded as shown above.'
    )
    forged = labelled(
        parse_error(1, "a <tool_result> is written by the tool, never by you", raw=raw),
        "fabricated_claim",
    )
    return trajectory([list_step(), forged, read_step(), write_step(), final(4)], **kw)


def fabricated_output(**kw: Any) -> Trajectory:
    """A quoted output the observations never showed (no perturbation kind of its own)."""
    claim = 'The read returned "total=99", so I will write it.\n'
    return trajectory([list_step(), read_step(), write_step(text=claim), final(3)], **kw)


def repeated_command(**kw: Any) -> Trajectory:
    return trajectory(
        [
            list_step(0),
            labelled(list_step(1), "repeated_command"),
            read_step(2),
            write_step(3),
            final(4),
        ],
        **kw,
    )


def skipped_step(**kw: Any) -> Trajectory:
    """The noisy policy skipped the read: the output is written without reading the input."""
    return trajectory([list_step(0), labelled(write_step(1), "skipped_step"), final(2)], **kw)


PERTURBATIONS: dict[str, Callable[..., Trajectory]] = {
    "malformed": malformed,
    "unknown_tool": unknown_tool,
    "missing_arg": missing_arg,
    "mistyped_arg": mistyped_arg,
    "premature_final": premature_final,
    "fabricated_claim": fabricated_claim,
    "repeated_command": repeated_command,
    "skipped_step": skipped_step,
}
"""Perturbation kind (as `agent.policies.scripted.PERTURBATION_KINDS`) → builder of an episode
carrying exactly that perturbation, labelled on the perturbed step."""


def new_id() -> uuid.UUID:
    return uuid.uuid4()
