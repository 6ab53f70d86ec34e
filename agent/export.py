"""Export and import of trajectories: ATIF (Harbor's trajectory format) and OpenAI chat messages.

ATIF (`to_atif` / `from_atif`, schema `ATIF-v1.4`): a `system` step with the system
prompt, a `user` step with the task, then one `agent` step per epiflow step with its
`tool_calls` (one, with the call id) and an `observation` whose result points back at the
call through `source_call_id` (no id for a `<tool_error>` on an unparsable message).
epiflow's own fields ride along in `extra["epiflow"]` at the root and on each step, so
`from_atif(to_atif(t)) == t`; a foreign ATIF file imports from the core fields alone.

OpenAI (`to_openai_messages` / `from_openai_messages`): the exact chat the model saw
(`style="text"`: protocol text, observations as user turns, native calls kept native),
or a native-tool-calling rendering (`style="native"`: each call as `tool_calls`, each
observation as a `tool` message) for chat templates with tool support. Import re-parses
the assistant turns with the protocol parser.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from agent.atif import (
    ATIF_SCHEMA_VERSION,
    AtifAgent,
    AtifFinalMetrics,
    AtifMetrics,
    AtifObservation,
    AtifObservationResult,
    AtifStep,
    AtifToolCall,
    AtifTrajectory,
)
from agent.errors import ProtocolError
from agent.native_calls import parse_native_tool_calls
from agent.prompt import render_system_prompt
from agent.protocol import parse_message
from agent.recording import observation_messages
from agent.trajectory import EPISODE_NAMESPACE, ParseKind, Step, Trajectory, history_hash
from sandbox.tool_specs import BUILTIN_TOOLS, ToolSpec

__all__ = [
    "ATIF_SCHEMA_VERSION",
    "AtifTrajectory",
    "from_atif",
    "from_openai_messages",
    "to_atif",
    "to_openai_messages",
]

AGENT_NAME = "epiflow"
AGENT_VERSION = "1"


def _tools_of(traj: Trajectory) -> list[ToolSpec]:
    return [BUILTIN_TOOLS[name] for name in traj.tool_versions if name in BUILTIN_TOOLS]


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def to_atif(traj: Trajectory, *, system_prompt: str | None = None) -> dict[str, Any]:
    """The trajectory as an ATIF document (a JSON-ready dict)."""
    prompt = system_prompt if system_prompt is not None else render_system_prompt(_tools_of(traj))
    steps: list[AtifStep] = [
        AtifStep(step_id=1, timestamp=_iso(traj.started_at), source="system", message=prompt),
        AtifStep(step_id=2, timestamp=_iso(traj.started_at), source="user", message=traj.prompt),
    ]
    for step in traj.steps:
        calls = None
        if (
            step.parse_kind == ParseKind.TOOL_CALL
            and step.tool is not None
            and step.call_id is not None
        ):
            calls = [
                AtifToolCall(
                    tool_call_id=step.call_id, function_name=step.tool, arguments=step.args or {}
                )
            ]
        observation = None
        if step.observation is not None:
            source = step.call_id if calls is not None else None
            observation = AtifObservation(
                results=[AtifObservationResult(source_call_id=source, content=step.observation)]
            )
        metrics = None
        if step.prompt_tokens is not None or step.completion_tokens is not None:
            metrics = AtifMetrics(
                prompt_tokens=step.prompt_tokens, completion_tokens=step.completion_tokens
            )
        steps.append(
            AtifStep(
                step_id=len(steps) + 1,
                timestamp=_iso(step.started_at),
                source="agent",
                model_name=traj.policy,
                message=step.raw_output,
                tool_calls=calls,
                observation=observation,
                metrics=metrics,
                extra={"epiflow": step.model_dump(mode="json", by_alias=True)},
            )
        )
    meta = traj.model_dump(mode="json", by_alias=True, exclude={"steps"})
    doc = AtifTrajectory(
        schema_version=ATIF_SCHEMA_VERSION,
        session_id=str(traj.episode_id),
        agent=AtifAgent(name=AGENT_NAME, version=AGENT_VERSION, model_name=traj.policy),
        steps=steps,
        final_metrics=AtifFinalMetrics(
            total_prompt_tokens=traj.prompt_tokens,
            total_completion_tokens=traj.completion_tokens,
            total_steps=len(steps),
        ),
        extra={"epiflow": meta},
    )
    return doc.model_dump(mode="json", exclude_none=True)


def _parse_time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _session_uuid(session_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(session_id)
    except ValueError:
        return uuid.uuid5(EPISODE_NAMESPACE, f"atif\x1f{session_id}")


def from_atif(
    document: Mapping[str, Any], *, tools: Mapping[str, ToolSpec] | None = None
) -> Trajectory:
    """An ATIF document as a `Trajectory` (exact for epiflow exports, best effort otherwise).

    Raises:
        pydantic.ValidationError: the document is not valid ATIF.
    """
    doc = AtifTrajectory.model_validate(document)
    meta = (doc.extra or {}).get("epiflow")
    agent_steps = [s for s in doc.steps if s.source == "agent"]
    if isinstance(meta, dict) and all(s.extra and "epiflow" in s.extra for s in agent_steps):
        return Trajectory.model_validate(
            {**meta, "steps": [s.extra["epiflow"] for s in agent_steps if s.extra]}
        )
    return _foreign_atif(doc, tools if tools is not None else BUILTIN_TOOLS)


def _step_from_text(
    index: int, text: str, messages: list[dict[str, Any]], tools: Mapping[str, ToolSpec]
) -> Step:
    step = Step(index=index, history_hash=history_hash(messages), raw_output=text)
    try:
        parsed = parse_message(text, tools)
    except ProtocolError as e:
        step.parse_kind, step.parse_error, step.parse_error_code = (
            ParseKind.ERROR,
            e.message,
            e.code,
        )
        step.tool, step.call_id = e.tool, e.call_id
        return step
    step.parse_kind = parsed.kind
    step.parse_tolerances = list(parsed.tolerances)
    if parsed.call is not None:
        step.call_id, step.tool, step.args = (
            parsed.call.call_id,
            parsed.call.tool,
            dict(parsed.call.args),
        )
    step.final_answer = parsed.final
    return step


def _foreign_atif(doc: AtifTrajectory, tools: Mapping[str, ToolSpec]) -> Trajectory:
    messages: list[dict[str, Any]] = []
    prompt = ""
    steps: list[Step] = []
    for atif_step in doc.steps:
        if atif_step.source != "agent":
            if atif_step.source == "user" and not prompt:
                prompt = atif_step.message
            messages.append({"role": atif_step.source, "content": atif_step.message})
            continue
        if atif_step.tool_calls:
            call = atif_step.tool_calls[0]
            step = Step(
                index=len(steps), history_hash=history_hash(messages), raw_output=atif_step.message
            )
            step.parse_kind, step.call_id = ParseKind.TOOL_CALL, call.tool_call_id
            step.tool, step.args = call.function_name, dict(call.arguments)
            if len(atif_step.tool_calls) > 1:
                step.parse_kind, step.parse_error_code = ParseKind.ERROR, "two_blocks"
                step.parse_error = f"{len(atif_step.tool_calls)} tool calls in one ATIF step; epiflow keeps the first"
        else:
            step = _step_from_text(len(steps), atif_step.message, messages, tools)
        moment = _parse_time(atif_step.timestamp)
        if moment is not None:
            step.started_at = moment
        if atif_step.metrics is not None:
            step.prompt_tokens = atif_step.metrics.prompt_tokens
            step.completion_tokens = atif_step.metrics.completion_tokens
        if atif_step.observation is not None:
            step.observation = "\n".join(r.content or "" for r in atif_step.observation.results)
        messages.append({"role": "assistant", "content": step.raw_output})
        if step.observation is not None:
            messages.append({"role": "user", "content": step.observation})
        steps.append(step)
    if steps and steps[-1].parse_kind == ParseKind.NONE and not steps[-1].observation:
        # A foreign agent's last plain message is its answer.
        steps[-1].parse_kind, steps[-1].final_answer = ParseKind.FINAL, steps[-1].raw_output
    started = _parse_time(doc.steps[0].timestamp) if doc.steps else None
    traj = Trajectory(
        episode_id=_session_uuid(doc.session_id),
        run_key="import:atif",
        task_id=doc.session_id,
        suite="imported",
        suite_version="",
        template="",
        prompt=prompt,
        policy=doc.agent.model_name or doc.agent.name,
        tool_versions={name: spec.version for name, spec in tools.items()},
        steps=steps,
        final_answer=next(
            (s.final_answer for s in reversed(steps) if s.final_answer is not None), None
        ),
    )
    if started is not None:
        traj.started_at = started
    return traj


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
    observations as `tool` messages; unparsable turns stay text.
    """
    prompt = system_prompt if system_prompt is not None else render_system_prompt(_tools_of(traj))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": prompt},
        {"role": "user", "content": traj.prompt},
    ]
    for step in traj.steps:
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
    return messages


def from_openai_messages(
    messages: Iterable[Mapping[str, Any]],
    *,
    tools: Mapping[str, ToolSpec] | None = None,
    run_key: str = "import:openai",
    task_id: str | None = None,
    policy: str = "imported",
) -> Trajectory:
    """OpenAI chat messages as a `Trajectory`: each assistant turn re-parsed, the next turns its observation."""
    specs = tools if tools is not None else BUILTIN_TOOLS
    history: list[dict[str, Any]] = []
    prompt = ""
    steps: list[Step] = []
    for raw in messages:
        message = dict(raw)
        role = message.get("role")
        content = message.get("content") or ""
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
        elif role == "user" and not prompt:
            prompt = content
        history.append(message)
    digest = history_hash([dict(m) for m in history[:2]])
    tid = task_id if task_id is not None else f"imported-{digest[:16]}"
    return Trajectory(
        episode_id=uuid.uuid5(EPISODE_NAMESPACE, f"{run_key}\x1f{tid}\x1f{digest}"),
        run_key=run_key,
        task_id=tid,
        suite="imported",
        suite_version="",
        template="",
        prompt=prompt,
        policy=policy,
        tool_versions={name: spec.version for name, spec in specs.items()},
        steps=steps,
        final_answer=next(
            (s.final_answer for s in reversed(steps) if s.final_answer is not None), None
        ),
    )
