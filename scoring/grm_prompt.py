"""The LLM judge's prompt (rubric + rendered trajectory) and the strict parser of its answer.

The answer must be exactly one JSON object, optionally inside a single ```json fence,
with exactly the keys `scores`, `deductions`, `suggestion`:

    {"scores": {"completion": 0-5, "tool_correctness": 0-5, "reliability": 0-5,
                "cost": 0-5, "safety": 0-5},
     "deductions": [{"dimension": "...", "points": >0, "steps": [i, ...], "reason": "..."}],
     "suggestion": "one line"}

Anything else — prose around the JSON, a missing or extra key, a score outside 0–5, a
deduction citing no step or a step the trajectory does not have, a multi-line
suggestion — raises `AnswerUnparseable`, which the judge records as an unparsed
judgement; it is never turned into a score.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from agent.trajectory import Trajectory
from scoring.rubric import MAX_SCORE, RUBRIC_TEXT, Deduction, Dimension, RubricScore

__all__ = [
    "ANSWER_JSON_SCHEMA",
    "AnswerUnparseable",
    "build_messages",
    "parse_answer",
    "render_trajectory",
]

ANSWER_SCHEMA = """\
Answer with exactly one JSON object and nothing else:
{"scores": {"completion": <0-5>, "tool_correctness": <0-5>, "reliability": <0-5>, "cost": <0-5>, "safety": <0-5>},
 "deductions": [{"dimension": "<one of the five>", "points": <number > 0>, "steps": [<step index>, ...], "reason": "<one line>"}],
 "suggestion": "<one line>"}
"""

_SCORE: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": MAX_SCORE}

ANSWER_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["scores", "deductions", "suggestion"],
    "properties": {
        "scores": {
            "type": "object",
            "additionalProperties": False,
            "required": [d.value for d in Dimension],
            "properties": {d.value: _SCORE for d in Dimension},
        },
        "deductions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["dimension", "points", "steps", "reason"],
                "properties": {
                    "dimension": {"type": "string", "enum": [d.value for d in Dimension]},
                    "points": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SCORE},
                    "steps": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    "reason": {"type": "string"},
                },
            },
        },
        "suggestion": {"type": "string"},
    },
}
"""The answer schema as JSON schema, for endpoints that take `response_format` with
`json_schema` (structured output); `parse_answer` still checks what the schema cannot
(step indices within the trajectory, one-line suggestion)."""

SYSTEM_PROMPT = (
    "You are a trajectory auditor for a tool-using agent.\n\n" + RUBRIC_TEXT + "\n" + ANSWER_SCHEMA
)


class AnswerUnparseable(ValueError):
    """The judge's answer does not follow the answer schema; the message says where."""


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"… [{len(text) - limit} more chars]"


def render_trajectory(trajectory: Trajectory, max_chars: int) -> str:
    """The task, every step (agent text and observation, capped) and the verifier's outcome."""
    lines = [f"TASK ({trajectory.suite}/{trajectory.template}):", trajectory.prompt.strip(), ""]
    for step in trajectory.steps:
        lines.append(f"[step {step.index}] agent:")
        lines.append(_cap(step.raw_output, max_chars))
        if step.parse_error is not None:
            lines.append(f"[step {step.index}] protocol error: {_cap(step.parse_error, max_chars)}")
        if step.observation is not None:
            lines.append(f"[step {step.index}] observation:")
            lines.append(_cap(step.observation, max_chars))
        if step.duration_ms is not None:
            lines.append(f"[step {step.index}] tool time: {step.duration_ms:.0f} ms")
        lines.append("")
    score = (
        "none (the verifier did not run)"
        if trajectory.verifier_score is None
        else f"{trajectory.verifier_score:.2f}"
    )
    lines.append(f"OUTCOME: status={trajectory.status.value}, verifier score={score}")
    if trajectory.verifier_reason:
        lines.append(f"VERIFIER REASON: {trajectory.verifier_reason}")
    lines.append(f"STEPS: {trajectory.n_steps}")
    return "\n".join(lines)


def build_messages(trajectory: Trajectory, max_chars: int) -> list[dict[str, str]]:
    """Chat messages for the judge: the rubric as system prompt, the trajectory as user turn."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": render_trajectory(trajectory, max_chars)},
    ]


_FENCE = re.compile(r"\A```(?:json)?\s*\n(?P<body>.*)\n```\Z", re.DOTALL)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise AnswerUnparseable(f"{where} must be a number, got {value!r}")
    return float(value)


def _expect_keys(obj: Any, keys: set[str], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise AnswerUnparseable(f"{where} must be an object, got {type(obj).__name__}")
    missing, extra = keys - obj.keys(), obj.keys() - keys
    if missing or extra:
        raise AnswerUnparseable(
            f"{where}: missing keys {sorted(missing)}, unexpected keys {sorted(extra)}"
        )
    return obj


def parse_answer(answer: str, n_steps: int) -> RubricScore:
    """The rubric scores in a judge's answer, or `AnswerUnparseable` saying what is wrong."""
    text = answer.strip()
    fenced = _FENCE.match(text)
    if fenced is not None:
        text = fenced.group("body").strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise AnswerUnparseable(f"answer is not one JSON object: {e}") from e
    top = _expect_keys(obj, {"scores", "deductions", "suggestion"}, "answer")
    raw_scores = _expect_keys(top["scores"], {d.value for d in Dimension}, "scores")
    scores: dict[str, float] = {}
    for name, value in raw_scores.items():
        v = _number(value, f"scores.{name}")
        if not 0.0 <= v <= MAX_SCORE:
            raise AnswerUnparseable(f"scores.{name} must be within 0–5, got {v}")
        scores[name] = v
    if not isinstance(top["deductions"], list):
        raise AnswerUnparseable("deductions must be a list")
    deductions: list[Deduction] = []
    for i, raw in enumerate(top["deductions"]):
        where = f"deductions[{i}]"
        item = _expect_keys(raw, {"dimension", "points", "steps", "reason"}, where)
        if item["dimension"] not in {d.value for d in Dimension}:
            raise AnswerUnparseable(
                f"{where}.dimension {item['dimension']!r} is not a rubric dimension"
            )
        points = _number(item["points"], f"{where}.points")
        if not 0.0 < points <= MAX_SCORE:
            raise AnswerUnparseable(f"{where}.points must be within (0, 5], got {points}")
        steps = item["steps"]
        if not isinstance(steps, list) or not steps:
            raise AnswerUnparseable(f"{where}.steps must cite at least one step index")
        for s in steps:
            if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < n_steps:
                raise AnswerUnparseable(
                    f"{where}.steps: {s!r} is not a step of this trajectory (0–{n_steps - 1})"
                )
        reason = item["reason"]
        if not isinstance(reason, str) or not reason.strip():
            raise AnswerUnparseable(f"{where}.reason must be a non-empty string")
        deductions.append(
            Deduction(
                dimension=Dimension(item["dimension"]),
                points=points,
                steps=steps,
                reason=reason.strip(),
            )
        )
    suggestion = top["suggestion"]
    if not isinstance(suggestion, str) or not suggestion.strip() or "\n" in suggestion.strip():
        raise AnswerUnparseable("suggestion must be one non-empty line")
    return RubricScore(deductions=deductions, suggestion=suggestion.strip(), **scores)
