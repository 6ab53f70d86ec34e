"""Export and import of trajectories: ATIF (Harbor's trajectory format) and OpenAI chat messages.

ATIF (`to_atif` / `from_atif`, schema `ATIF-v1.5`) lives in `agent.atif_convert`: lossless
both ways, for episodes epiflow ran and for foreign documents alike.

OpenAI (`to_openai_messages` / `from_openai_messages`): the exact chat the model saw
(`style="text"`: protocol text, observations as user turns, native calls kept native),
or a native-tool-calling rendering (`style="native"`: each call as `tool_calls`, each
observation as a `tool` message) for chat templates with tool support. An imported
episode keeps its own system and user turns (`Trajectory.context_steps`) instead of
epiflow's system prompt. Import re-parses the assistant turns with the protocol parser.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from agent.atif import ATIF_SCHEMA_VERSION, ATIF_VERSIONS, AtifTrajectory
from agent.atif_convert import from_atif, parsed_step, to_atif
from agent.errors import ProtocolError
from agent.native_calls import parse_native_tool_calls
from agent.prompt import render_system_prompt
from agent.recording import observation_messages
from agent.trajectory import (
    EPISODE_NAMESPACE,
    ContextStep,
    EpisodeStatus,
    FailureCategory,
    ParseKind,
    Step,
    Trajectory,
    history_hash,
)
from sandbox.tool_specs import BUILTIN_TOOLS, ToolSpec

__all__ = [
    "ATIF_SCHEMA_VERSION",
    "ATIF_VERSIONS",
    "AtifTrajectory",
    "from_atif",
    "from_openai_messages",
    "to_atif",
    "to_openai_messages",
]


def _tools_of(traj: Trajectory) -> list[ToolSpec]:
    return [BUILTIN_TOOLS[name] for name in traj.tool_versions if name in BUILTIN_TOOLS]


def _step_from_text(
    index: int, text: str, messages: list[dict[str, Any]], tools: Mapping[str, ToolSpec]
) -> Step:
    return parsed_step(index, text, history_hash(messages), tools)


def _native_call(step: Step) -> dict[str, Any]:
    return {
        "id": step.call_id,
        "type": "function",
        "function": {
            "name": step.tool,
            "arguments": json.dumps(step.args or {}, ensure_ascii=False),
        },
    }


def to_openai_messages(
    traj: Trajectory, *, style: Literal["text", "native"] = "text", system_prompt: str | None = None
) -> list[dict[str, Any]]:
    """The episode as OpenAI chat messages.

    `text`: exactly the history the model saw (so each step's `history_hash` is the hash of
    the messages before its assistant turn). `native`: parsed calls as `tool_calls` and
    observations as `tool` messages; unparsable turns stay text. An imported episode
    (ATIF: `traj.agent` set; OpenAI: its leading system and user messages kept as context
    steps) keeps its own system and user turns in their places; `system_prompt` replaces
    epiflow's rendered prompt only for episodes epiflow ran.
    """
    context: dict[int, list[dict[str, Any]]] = {}
    if traj.agent is None and not traj.context_steps:
        prompt = (
            system_prompt if system_prompt is not None else render_system_prompt(_tools_of(traj))
        )
        context[0] = [
            {"role": "system", "content": prompt},
            {"role": "user", "content": traj.prompt},
        ]
    else:
        for c in traj.context_steps:
            context.setdefault(c.before_step, []).append({"role": c.source, "content": c.message})
    messages: list[dict[str, Any]] = []
    for index, step in enumerate(traj.steps):
        messages.extend(context.get(index, []))
        native = (
            style == "native"
            and step.parse_kind == ParseKind.TOOL_CALL
            and step.call_id is not None
        )
        if native:
            # In native style the preamble is the content; the call itself becomes tool_calls.
            content = (
                step.raw_output.split("<tool_call", 1)[0]
                if not step.native_tool_calls
                else step.raw_output
            )
            messages.append(
                {"role": "assistant", "content": content, "tool_calls": [_native_call(step)]}
            )
            if step.observation is not None:
                messages.append(
                    {"role": "tool", "tool_call_id": step.call_id, "content": step.observation}
                )
            continue
        message: dict[str, Any] = {"role": "assistant", "content": step.raw_output}
        if step.native_tool_calls:
            message["tool_calls"] = step.native_tool_calls
        messages.append(message)
        messages.extend(observation_messages(step))
    messages.extend(
        m for index in sorted(context) if index >= len(traj.steps) for m in context[index]
    )
    return messages


def _openai_text(content: Any, where: str) -> str:
    """A chat message's content as text: a string, or the `text` parts of a list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}: expected a string or a list of content parts")
    texts: list[str] = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ValueError(f"{where}.{i}: a content part is an object with a string 'type'")
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                raise ValueError(f"{where}.{i}.text: a 'text' part needs a string 'text'")
            texts.append(part["text"])
    return "\n".join(texts)


def from_openai_messages(
    messages: Iterable[Mapping[str, Any]],
    *,
    tools: Mapping[str, ToolSpec] | None = None,
    run_key: str = "import:openai",
    task_id: str | None = None,
    policy: str = "imported",
) -> Trajectory:
    """OpenAI chat messages as a `Trajectory`: each assistant turn re-parsed, the next turns
    its observation. A message's content is a string or a list of parts (the `text` parts
    joined by newlines; image and audio parts carry no text). The system and user messages
    before the first assistant turn are kept as context steps, so an export gives the
    file's own system prompt back. The episode id hashes the whole conversation (two
    rollouts of one prompt are two episodes); the task id hashes its first two messages.

    Raises:
        ValueError: a message's content is neither a string nor a list of parts (the
            message says which: `messages.N.content…`).
    """
    specs = tools if tools is not None else BUILTIN_TOOLS
    history: list[dict[str, Any]] = []
    prompt = ""
    steps: list[Step] = []
    context: list[ContextStep] = []
    for n, raw in enumerate(messages):
        message = dict(raw)
        role = message.get("role")
        content = _openai_text(message.get("content"), f"messages.{n}.content")
        if role == "assistant":
            native = message.get("tool_calls")
            if native:
                step = Step(
                    index=len(steps), history_hash=history_hash(history), raw_output=content
                )
                step.native_tool_calls = list(native)
                try:
                    parsed = parse_native_tool_calls(
                        content, list(native), specs, fallback_id=f"call_{len(steps)}"
                    )
                except ProtocolError as e:
                    step.parse_kind, step.parse_error, step.parse_error_code = (
                        ParseKind.ERROR,
                        e.message,
                        e.code,
                    )
                else:
                    step.parse_kind = parsed.kind
                    if parsed.call is not None:
                        step.call_id, step.tool, step.args = (
                            parsed.call.call_id,
                            parsed.call.tool,
                            dict(parsed.call.args),
                        )
            else:
                step = _step_from_text(len(steps), content, history, specs)
            steps.append(step)
        elif role in ("user", "tool") and steps:
            observation = steps[-1].observation
            steps[-1].observation = content if observation is None else observation + "\n" + content
        elif role in ("system", "user"):
            context.append(ContextStep(before_step=len(steps), source=role, message=content))
            if role == "user" and not prompt:
                prompt = content
        history.append(message)
    for step in steps:
        step.started_at = None  # chat messages carry no times; none is invented
    digest = history_hash([dict(m) for m in history[:2]])
    tid = task_id if task_id is not None else f"imported-{digest[:16]}"
    whole = history_hash(history)
    return Trajectory(
        episode_id=uuid.uuid5(EPISODE_NAMESPACE, f"{run_key}\x1f{tid}\x1f{whole}"),
        run_key=run_key,
        task_id=tid,
        suite="imported",
        suite_version="",
        template="",
        prompt=prompt,
        policy=policy,
        tool_versions={name: spec.version for name, spec in specs.items()},
        context_steps=context,
        steps=steps,
        # Chat messages record neither times nor an outcome: both unknown, never a default.
        started_at=None,
        status=EpisodeStatus.IMPORTED,
        failure_category=FailureCategory.IMPORTED,
        final_answer=next(
            (s.final_answer for s in reversed(steps) if s.final_answer is not None), None
        ),
    )
