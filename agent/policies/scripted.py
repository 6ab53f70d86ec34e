"""Scripted policies: `scripted:oracle`, `scripted:noisy`, `scripted:idle`.

They speak protocol v1 like a model would, so the whole loop (parser included) runs.
They keep no state: the position in the reference solution is derived from the steps
so far (`reference_cursor`), which makes one instance safe for concurrent episodes and
a re-run byte-identical.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from typing import Any

from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from agent.render import render_final, render_tool_call
from agent.settings import NoisyRates
from agent.trajectory import ParseKind, Step
from sandbox.tool_specs import ToolSpec
from tasks.types import ReferenceCall, TaskInstance

__all__ = [
    "PERTURBATION_KINDS",
    "IdlePolicy",
    "NoisyPolicy",
    "OraclePolicy",
    "reference_cursor",
]

MAX_FAULT_RETRIES = 2
"""The oracle repeats a reference call hit by an injected fault at most this many times."""

PERTURBATION_KINDS: tuple[str, ...] = (
    "malformed",
    "unknown_tool",
    "missing_arg",
    "mistyped_arg",
    "premature_final",
    "fabricated_claim",
    "repeated_command",
    "skipped_step",
)
"""Perturbations of `scripted:noisy`, in the order they are drawn each step."""

IDLE_FINAL = "I did not do anything."


def _executed(step: Step) -> bool:
    """True when the step's call reached the sandbox and produced a `<tool_result>`."""
    return step.parse_kind == ParseKind.TOOL_CALL and (step.observation or "").startswith(
        "<tool_result"
    )


def _hit_by_fault(step: Step) -> bool:
    fault = step.injected_fault
    return fault is not None and fault.kind != "latency" and step.error_type is not None


def reference_cursor(steps: list[Step]) -> int:
    """Index of the next reference call to emit, given the steps so far.

    A step advances the cursor when it executed the reference call it carried; a
    `skipped_step` perturbation advances it by one more; other perturbations do not
    advance it; a call hit by an injected fault is retried up to `MAX_FAULT_RETRIES` times.
    """
    cursor = 0
    retries = 0
    for step in steps:
        kind = step.policy_perturbation
        if kind == "skipped_step":
            cursor += 1
        elif kind is not None:
            continue
        if not _executed(step):
            continue
        if _hit_by_fault(step) and retries < MAX_FAULT_RETRIES:
            retries += 1
            continue
        cursor += 1
        retries = 0
    return cursor


def _call_id(step_index: int) -> str:
    return f"c{step_index + 1}"


def _say(call: ReferenceCall) -> str:
    return f"Next I call {call.tool}.\n"


def _response(text: str, started: float, perturbation: str | None = None) -> PolicyResponse:
    return PolicyResponse(
        text=text,
        latency_ms=(time.perf_counter() - started) * 1000.0,
        perturbation=perturbation,
        finish_reason="stop",
    )


class OraclePolicy(Policy):
    """Replays the task's reference solution, then `<final>` with the reference final text."""

    replays_reference = True

    def __init__(self, spec: str = "scripted:oracle") -> None:
        self.spec = spec

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        started = time.perf_counter()
        reference = request.task.reference_solution
        cursor = reference_cursor(request.steps)
        if cursor >= len(reference):
            return _response(render_final(request.task.reference_final), started)
        call = reference[cursor]
        text = render_tool_call(
            _call_id(request.step_index), call.tool, call.args, preamble=_say(call)
        )
        return _response(text, started)


class IdlePolicy(Policy):
    """Does nothing: answers `<final>` at once (every task must score 0 under it)."""

    def __init__(self, spec: str = "scripted:idle") -> None:
        self.spec = spec

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        return _response(render_final(IDLE_FINAL), time.perf_counter())


def _last_executed_call(steps: list[Step]) -> tuple[str, dict[str, Any]] | None:
    for step in reversed(steps):
        if _executed(step) and step.tool is not None:
            return step.tool, dict(step.args or {})
    return None


def _non_string_arg(spec: ToolSpec) -> str | None:
    props: Mapping[str, Any] = spec.parameters.get("properties", {})
    for name, schema in props.items():
        if schema.get("type", "string") != "string":
            return name
    return None


class NoisyPolicy(Policy):
    """The oracle with seeded perturbations; the kind lands on `Step.policy_perturbation`.

    Each step draws every kind in `PERTURBATION_KINDS` order with its rate; the first
    that fires and applies wins. The draw is seeded by (episode seed, task id, step index).
    """

    def __init__(self, rates: NoisyRates, spec: str = "scripted:noisy") -> None:
        self.spec = spec
        self.rates = rates

    def _choose(self, rng: random.Random, applicable: set[str]) -> str | None:
        for kind in PERTURBATION_KINDS:
            fired = rng.random() < getattr(self.rates, kind)
            if fired and kind in applicable:
                return kind
        return None

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        started = time.perf_counter()
        task = request.task
        reference = task.reference_solution
        cursor = reference_cursor(request.steps)
        if cursor >= len(reference):
            return _response(render_final(task.reference_final), started)
        rng = random.Random(f"{request.seed}|{task.task_id}|{request.step_index}")
        tools = {t.name: t for t in request.tools}
        call = reference[cursor]
        applicable = {
            "malformed",
            "unknown_tool",
            "mistyped_arg",
            "premature_final",
            "fabricated_claim",
        }
        spec = tools.get(call.tool)
        if spec is not None and any(r in call.args for r in spec.parameters.get("required", [])):
            applicable.add("missing_arg")
        previous = _last_executed_call(request.steps)
        if previous is not None:
            applicable.add("repeated_command")
        if cursor + 1 < len(reference):
            applicable.add("skipped_step")
        kind = self._choose(rng, applicable)
        call_id = _call_id(request.step_index)
        text = render_tool_call(call_id, call.tool, call.args, preamble=_say(call))
        if kind is not None:
            text = self._perturb(kind, rng, request, task, call, call_id, spec, previous)
        return _response(text, started, kind)

    def _perturb(
        self,
        kind: str,
        rng: random.Random,
        request: PolicyRequest,
        task: TaskInstance,
        call: ReferenceCall,
        call_id: str,
        spec: ToolSpec | None,
        previous: tuple[str, dict[str, Any]] | None,
    ) -> str:
        good = render_tool_call(call_id, call.tool, call.args, preamble=_say(call))
        if kind == "malformed":
            return _malformed(rng, good, call, call_id)
        if kind == "unknown_tool":
            names = {t.name for t in request.tools}
            bogus = next(
                n
                for n in ("run_command", "shell", "open_file", "bash_exec", "tool_x")
                if n not in names
            )
            return render_tool_call(call_id, bogus, call.args, preamble=_say(call))
        if kind == "missing_arg" and spec is not None:
            required = [r for r in spec.parameters.get("required", []) if r in call.args]
            dropped = rng.choice(required)
            args = {k: v for k, v in call.args.items() if k != dropped}
            return render_tool_call(call_id, call.tool, args, preamble=_say(call))
        if kind == "mistyped_arg":
            target = _non_string_arg(spec) if spec is not None else None
            if spec is not None and target is not None:
                return _with_raw_arg(call_id, call.tool, call.args, target, "soon")
            # No typed arg on this tool: the same intent as a shell call with a bad timeout.
            return _with_raw_arg(
                call_id, "execute_shell", {"command": "ls"}, "timeout", "thirty seconds"
            )
        if kind == "premature_final":
            return render_final(task.reference_final, preamble="The task is complete.\n")
        if kind == "fabricated_claim":
            invented = (
                f'<tool_result id="{call_id}" name="{call.tool}" exit_code="0">OK</tool_result>'
            )
            return good + "\n" + invented + "\nThe call succeeded as shown above."
        if kind == "repeated_command" and previous is not None:
            tool, args = previous
            return render_tool_call(call_id, tool, args, preamble=f"Running {tool} again.\n")
        if kind == "skipped_step":
            nxt = task.reference_solution[reference_cursor(request.steps) + 1]
            return render_tool_call(call_id, nxt.tool, nxt.args, preamble=_say(nxt))
        return good


def _with_raw_arg(call_id: str, tool: str, args: Mapping[str, Any], name: str, raw: str) -> str:
    """A call whose arg `name` has the literal text `raw` (to break its type)."""
    merged: dict[str, Any] = dict(args)
    merged[name] = raw
    return render_tool_call(call_id, tool, merged, preamble=f"Next I call {tool}.\n")


def _malformed(rng: random.Random, good: str, call: ReferenceCall, call_id: str) -> str:
    """One of several structural breakages of a correct block."""
    variants = ["unclosed_block", "text_in_block", "unknown_tag", "unclosed_arg", "json_body"]
    variant = rng.choice(variants)
    broken = good
    if variant == "text_in_block":
        broken = good.replace("\n<arg ", "\nHere are the arguments:\n<arg ", 1)
    elif variant == "unknown_tag":
        broken = good.replace("<arg ", "<param ").replace("</arg>", "</param>")
    elif variant == "unclosed_arg":
        head, sep, tail = good.rpartition("</arg>")
        broken = head + tail if sep else good
    elif variant == "json_body":
        broken = f'<tool_call name="{call.tool}">{json.dumps(call.args)}</tool_call>'
    if broken == good:  # the variant did not apply (a call without args): never emit a valid block
        broken = good.removesuffix("</tool_call>")
    return broken
