"""`Trajectory` ↔ ATIF v1.0–v1.8 document, lossless both ways.

Rendering (`to_atif`): epiflow's fields become the ATIF core. An episode epiflow ran gets
a `system` step (the system prompt rendered from its tools), a `user` step (the task),
then one `agent` step per epiflow step; `agent` is epiflow with its tool definitions. An
imported episode gets back its own agent identity and its non-agent steps
(`Trajectory.context_steps`) in their places.

Import (`from_atif`): the core becomes epiflow's fields (message → `raw_output`, the call,
the observation, token counts, cost, reasoning, token ids, log probabilities); what
epiflow has no field for stays in `atif_remainder` (per step, per context step, and at
the root) as the difference between the document and the rendering of what was imported.
Rendering then applies the remainder, so `to_atif(from_atif(doc))` is `doc` again: its
`schema_version`, content parts (a `message` or result `content` given as parts becomes
epiflow's text from the `text` parts; the parts themselves, images and audio with their
metadata, stay in the remainder), `trajectory_id`, embedded `subagent_trajectories`,
`llm_call_count`, `extra.context_management` and every other field as written.

The other direction rides in `extra["epiflow"]`: the root carries the trajectory fields
and each agent step the step fields that importing the rendered core would not give back
(exit codes, rewards, outputs, …), as a difference again. So
`from_atif(to_atif(t)) == t` for every trajectory, and a foreign document's export holds
nothing but the document and one root `extra.epiflow` object.

Episode ids of foreign documents come from their content (sha256 of the document) and
the run key, never from `session_id` alone (producers reuse session ids).
"""

from __future__ import annotations

import copy
import hashlib
import json
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from agent.atif import ATIF_SCHEMA_VERSION, AtifTrajectory, content_text
from agent.errors import ProtocolError
from agent.prompt import render_system_prompt
from agent.protocol import parse_message
from agent.trajectory import (
    EPISODE_NAMESPACE,
    AgentIdentity,
    AtifRemainder,
    ContextStep,
    EpisodeStatus,
    FailureCategory,
    HistoryHash,
    ParseKind,
    Step,
    Trajectory,
)
from sandbox.tool_specs import BUILTIN_TOOLS, ToolSpec

__all__ = [
    "AGENT_NAME",
    "AGENT_VERSION",
    "ATIF_IMPORT_RUN_KEY",
    "OBSERVATION_INLINE_CAP",
    "from_atif",
    "parsed_step",
    "to_atif",
]

AGENT_NAME = "epiflow"
"""`agent.name` of the documents epiflow writes for the episodes it ran."""
AGENT_VERSION = "1"
"""`agent.version` of those documents."""
ATIF_IMPORT_RUN_KEY = "import:atif"
"""Run key of imported foreign ATIF episodes when none is given."""

OBSERVATION_INLINE_CAP = 65_536
"""Characters of an imported observation kept in `Step.observation` (and so in SQL); a
longer one is cut there with a note, and the whole stays in the stored trajectory (the
step's ATIF remainder), so export still gives the document back."""

_EPIFLOW = "epiflow"
_ROOT_IGNORED = ("steps",)
"""Root keys never kept as a remainder: the steps are handled one by one."""


# --- shared helpers -----------------------------------------------------------------


def _canonical(value: Any) -> str:
    """A JSON spelling that tells 1 from 1.0 and ignores key order (remainder comparisons)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _pointer_token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _diff(raw: Any, rendered: Any, path: str, values: dict[str, Any], missing: list[str]) -> None:
    """Patches that turn `rendered` into `raw`, as deep as both have the same shape (so a
    differing flag does not copy its whole object)."""
    if isinstance(raw, dict) and isinstance(rendered, dict):
        for key, value in raw.items():
            at = f"{path}/{_pointer_token(key)}"
            if key in rendered:
                _diff(value, rendered[key], at, values, missing)
            else:
                values[at] = copy.deepcopy(value)
        missing.extend(f"{path}/{_pointer_token(k)}" for k in rendered if k not in raw)
    elif isinstance(raw, list) and isinstance(rendered, list) and len(raw) == len(rendered):
        for i, (a, b) in enumerate(zip(raw, rendered, strict=True)):
            _diff(a, b, f"{path}/{i}", values, missing)
    elif isinstance(raw, str) and isinstance(rendered, str):
        if raw != rendered:  # two strings: no JSON spelling needed (nor its copies)
            values[path] = raw
    elif _canonical(raw) != _canonical(rendered):
        values[path] = copy.deepcopy(raw)


def _remainder(
    raw: Mapping[str, Any], rendered: Mapping[str, Any], *, ignored: tuple[str, ...] = ()
) -> AtifRemainder | None:
    values: dict[str, Any] = {}
    missing: list[str] = []
    _diff(
        {k: v for k, v in raw.items() if k not in ignored},
        {k: v for k, v in rendered.items() if k not in ignored},
        "",
        values,
        missing,
    )
    return AtifRemainder(values=values, missing=missing) if values or missing else None


def _locate(root: Any, pointer: str) -> tuple[Any, str | int]:
    """The container holding the last token of `pointer`, and that token."""
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]
    node = root
    for token in tokens[:-1]:
        node = node[int(token)] if isinstance(node, list) else node[token]
    last = tokens[-1]
    return node, (int(last) if isinstance(node, list) else last)


def _apply(rendered: dict[str, Any], remainder: AtifRemainder | None) -> dict[str, Any]:
    if remainder is None:
        return rendered
    for pointer, value in remainder.values.items():
        node, key = _locate(rendered, pointer)
        node[key] = copy.deepcopy(value)
    for pointer in remainder.missing:
        node, key = _locate(rendered, pointer)
        del node[key]
    return rendered


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _parse_time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _tools_of(traj: Trajectory) -> list[ToolSpec]:
    return [BUILTIN_TOOLS[name] for name in traj.tool_versions if name in BUILTIN_TOOLS]


def _inline(observation: str) -> str:
    if len(observation) <= OBSERVATION_INLINE_CAP:
        return observation
    return (
        observation[:OBSERVATION_INLINE_CAP]
        + f"\n[observation cut at {OBSERVATION_INLINE_CAP} of {len(observation)} characters "
        "on import; the whole is in the stored trajectory]"
    )


# --- rendering ------------------------------------------------------------------------


def _metrics(step: Step) -> dict[str, Any] | None:
    fields = {
        "prompt_tokens": step.prompt_tokens,
        "completion_tokens": step.completion_tokens,
        "cached_tokens": step.cached_tokens,
        "cost_usd": step.cost_usd,
        "prompt_token_ids": step.prompt_token_ids,
        "completion_token_ids": step.completion_token_ids,
        "logprobs": step.logprobs,
    }
    present = {k: v for k, v in fields.items() if v is not None}
    return present or None


def _render_agent_step(traj: Trajectory, step: Step, step_id: int) -> dict[str, Any]:
    out: dict[str, Any] = {"step_id": step_id}
    if step.started_at is not None:
        out["timestamp"] = _iso(step.started_at)
    out["source"] = "agent"
    model = traj.policy if traj.agent is None else traj.agent.model_name
    if model is not None:
        out["model_name"] = model
    out["message"] = step.raw_output
    if step.reasoning_content is not None:
        out["reasoning_content"] = step.reasoning_content
    calls = step.parse_kind == ParseKind.TOOL_CALL and step.tool is not None
    if calls and step.call_id is not None:
        out["tool_calls"] = [
            {"tool_call_id": step.call_id, "function_name": step.tool, "arguments": step.args or {}}
        ]
    if step.observation is not None:
        result: dict[str, Any] = {}
        if "tool_calls" in out:
            result["source_call_id"] = step.call_id
        result["content"] = step.observation
        out["observation"] = {"results": [result]}
    metrics = _metrics(step)
    if metrics is not None:
        out["metrics"] = metrics
    return out


def _render_context_step(c: ContextStep, step_id: int) -> dict[str, Any]:
    return {"step_id": step_id, "source": c.source, "message": c.message}


def _render_agent(traj: Trajectory) -> dict[str, Any]:
    if traj.agent is not None:
        return traj.agent.model_dump(mode="json", exclude_none=True)
    agent: dict[str, Any] = {
        "name": AGENT_NAME,
        "version": AGENT_VERSION,
        "model_name": traj.policy,
    }
    tools = _tools_of(traj)
    if tools:
        agent["tool_definitions"] = [spec.openai_tool() for spec in tools]
    return agent


def _render_final_metrics(traj: Trajectory, n_steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for total, name in (
        ("total_prompt_tokens", "prompt_tokens"),
        ("total_completion_tokens", "completion_tokens"),
        ("total_cached_tokens", "cached_tokens"),
        ("total_cost_usd", "cost_usd"),
    ):
        reported = [getattr(s, name) for s in traj.steps if getattr(s, name) is not None]
        if reported:
            out[total] = sum(reported)
    out["total_steps"] = n_steps
    return out


def _core(traj: Trajectory, *, system_prompt: str | None = None) -> dict[str, Any]:
    """The ATIF core of `traj`, remainders applied, without epiflow's `extra` entries."""
    steps: list[dict[str, Any]] = []
    if traj.agent is None:
        prompt = (
            system_prompt if system_prompt is not None else render_system_prompt(_tools_of(traj))
        )
        moment = {} if traj.started_at is None else {"timestamp": _iso(traj.started_at)}
        steps.append({"step_id": 1, **moment, "source": "system", "message": prompt})
        steps.append({"step_id": 2, **moment, "source": "user", "message": traj.prompt})
        for step in traj.steps:
            steps.append(_render_agent_step(traj, step, len(steps) + 1))
    else:
        context = sorted(traj.context_steps, key=lambda c: c.before_step)
        position = 0
        for index in range(len(traj.steps) + 1):
            while position < len(context) and context[position].before_step <= index:
                c = context[position]
                steps.append(_apply(_render_context_step(c, len(steps) + 1), c.atif_remainder))
                position += 1
            if index < len(traj.steps):
                step = traj.steps[index]
                rendered = _render_agent_step(traj, step, len(steps) + 1)
                steps.append(_apply(rendered, step.atif_remainder))
    root: dict[str, Any] = {
        "schema_version": ATIF_SCHEMA_VERSION,
        "session_id": str(traj.episode_id),
        "agent": _render_agent(traj),
        "steps": steps,
        "final_metrics": _render_final_metrics(traj, len(steps)),
    }
    return _apply(root, traj.atif_remainder)


def _difference(actual: Mapping[str, Any], derived: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in actual.items()
        if k not in derived or _canonical(v) != _canonical(derived[k])
    }


def to_atif(
    traj: Trajectory, *, system_prompt: str | None = None, schema_version: str | None = None
) -> dict[str, Any]:
    """The trajectory as an ATIF document (a JSON-ready dict): an imported one in the
    version it had, an episode epiflow ran in `ATIF_SCHEMA_VERSION`.

    `schema_version`: write this version instead (e.g. the newest, `ATIF_VERSIONS[-1]`);
    every 1.x version only adds optional fields, so a newer label is the whole upgrade.
    `extra.epiflow` at the root (and on an agent step, where needed) holds what importing
    the core alone would not give back, so `from_atif(to_atif(t)) == t`.

    Raises:
        pydantic.ValidationError: the document is not valid in `schema_version` (an older
            version than its content parts or embedded sub-agents need).
    """
    document = _core(traj, system_prompt=system_prompt)
    derived = _derive(
        copy.deepcopy(document), run_key=None, tools=BUILTIN_TOOLS, started=traj.started_at
    )
    mine = traj.model_dump(mode="json", by_alias=True)
    theirs = derived.model_dump(mode="json", by_alias=True)
    meta = _difference(
        {k: v for k, v in mine.items() if k != "steps"},
        {k: v for k, v in theirs.items() if k != "steps"},
    )
    # Always carried: steps without a timestamp start when the episode did.
    meta["started_at"] = mine["started_at"]
    document["extra"] = {**(document.get("extra") or {}), _EPIFLOW: meta}
    agent_steps = [s for s in document["steps"] if s["source"] == "agent"]
    for atif_step, step, derived_step in zip(
        agent_steps, mine["steps"], theirs["steps"], strict=True
    ):
        delta = _difference(step, derived_step)
        if delta:
            atif_step["extra"] = {**(atif_step.get("extra") or {}), _EPIFLOW: delta}
    if schema_version is not None and schema_version != document["schema_version"]:
        document["schema_version"] = schema_version
        AtifTrajectory.model_validate(document)
    return document


# --- import ---------------------------------------------------------------------------


def _pop_epiflow(obj: dict[str, Any]) -> dict[str, Any] | None:
    """Remove and return `extra.epiflow`; an `extra` left empty goes too (epiflow made it)."""
    extra = obj.get("extra")
    if not isinstance(extra, dict) or _EPIFLOW not in extra:
        return None
    value = extra.pop(_EPIFLOW)
    if not extra:
        del obj["extra"]
    return value if isinstance(value, dict) else None


_HASH_CHUNK = 1 << 20
"""Characters of one string hashed at a time (`_hash_canonical`)."""


def _hash_canonical(h: Any, value: Any) -> None:
    """Feed `h` the bytes of `_canonical(value)` without building that text: containers
    piece by piece, a long string in chunks (JSON escapes one character at a time, so the
    chunks' escapes joined are the whole string's). The same digest as hashing the whole
    text (episode ids on disk depend on it), at a cost that does not grow with the file."""
    if isinstance(value, dict):
        h.update(b"{")
        for i, key in enumerate(sorted(value)):
            if i:
                h.update(b",")
            h.update(_canonical(key).encode("utf-8", "surrogatepass") + b":")
            _hash_canonical(h, value[key])
        h.update(b"}")
    elif isinstance(value, list):
        h.update(b"[")
        for i, item in enumerate(value):
            if i:
                h.update(b",")
            _hash_canonical(h, item)
        h.update(b"]")
    elif isinstance(value, str) and len(value) > _HASH_CHUNK:
        h.update(b'"')
        for start in range(0, len(value), _HASH_CHUNK):
            piece = _canonical(value[start : start + _HASH_CHUNK])
            h.update(piece[1:-1].encode("utf-8", "surrogatepass"))
        h.update(b'"')
    else:
        h.update(_canonical(value).encode("utf-8", "surrogatepass"))


def _content_id(run_key: str, document: Mapping[str, Any]) -> uuid.UUID:
    h = hashlib.sha256()
    _hash_canonical(h, document)
    return uuid.uuid5(EPISODE_NAMESPACE, f"{run_key}\x1fatif\x1f{h.hexdigest()}")


def _policy_of(agent: AgentIdentity) -> str:
    spec = f"atif:{agent.name}@{agent.version}"
    return spec + (f"#{agent.model_name}" if agent.model_name else "")


def parsed_step(index: int, text: str, history: str, tools: Mapping[str, ToolSpec]) -> Step:
    """A step from an assistant message without structured calls, parsed with the protocol
    parser (`history`: the step's `history_hash`)."""
    step = Step(index=index, history_hash=history, raw_output=text)
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


def _derive(
    document: dict[str, Any],
    *,
    run_key: str | None,
    tools: Mapping[str, ToolSpec],
    started: datetime | None = None,
) -> Trajectory:
    """A `Trajectory` from an ATIF document's core (epiflow's `extra` entries already
    removed), with remainders so that rendering it gives the document back.

    `started`: when the episode started if no step has a timestamp (default: unknown, None)."""
    doc = AtifTrajectory.model_validate(document)
    agent = AgentIdentity.model_validate(doc.agent.model_dump(exclude_none=True))
    history = HistoryHash()
    prompt: str | None = None
    context: list[ContextStep] = []
    steps: list[Step] = []
    raw_agent_steps: list[dict[str, Any]] = []
    for raw, atif_step in zip(document["steps"], doc.steps, strict=True):
        message = content_text(atif_step.message)
        if atif_step.source != "agent":
            if atif_step.source == "user" and prompt is None:
                prompt = message
            context.append(
                ContextStep(before_step=len(steps), source=atif_step.source, message=message)
            )
            history.extend([{"role": atif_step.source, "content": message}])
            continue
        index = len(steps)
        calls = atif_step.tool_calls or []
        if calls:
            step = Step(index=index, history_hash=history.hexdigest(), raw_output=message)
            first = calls[0]
            step.parse_kind, step.call_id = ParseKind.TOOL_CALL, first.tool_call_id
            step.tool, step.args = first.function_name, dict(first.arguments)
            if len(calls) > 1:
                step.parse_kind, step.parse_error_code = ParseKind.ERROR, "two_blocks"
                step.parse_error = (
                    f"{len(calls)} tool calls in one ATIF step; epiflow's fields hold the first"
                )
        else:
            step = parsed_step(index, message, history.hexdigest(), tools)
        step.reasoning_content = atif_step.reasoning_content
        metrics = atif_step.metrics
        if metrics is not None:
            step.prompt_tokens = metrics.prompt_tokens
            step.completion_tokens = metrics.completion_tokens
            step.cached_tokens = metrics.cached_tokens
            step.cost_usd = metrics.cost_usd
            step.prompt_token_ids = metrics.prompt_token_ids
            step.completion_token_ids = metrics.completion_token_ids
            step.logprobs = metrics.logprobs
        if atif_step.observation is not None:
            whole = "\n".join(content_text(r.content) for r in atif_step.observation.results)
            step.observation = _inline(whole)
            if step.observation is not whole:  # cut: the whole goes to an object of its own
                step.observation_whole = whole
        history.extend([{"role": "assistant", "content": step.raw_output}])
        if step.observation is not None:
            history.extend([{"role": "user", "content": step.observation}])
        steps.append(step)
        raw_agent_steps.append(raw)
    if steps and steps[-1].parse_kind == ParseKind.NONE and not steps[-1].observation:
        # A foreign agent's last plain message is its answer.
        steps[-1].parse_kind, steps[-1].final_answer = ParseKind.FINAL, steps[-1].raw_output
    # Times come from the document only: none there, none here (never the import time).
    times = [t for t in (_parse_time(s.timestamp) for s in doc.steps) if t is not None]
    if times:
        started = times[0]
    for step, atif_step in zip(steps, (s for s in doc.steps if s.source == "agent"), strict=True):
        step.started_at = _parse_time(atif_step.timestamp)
    text = prompt or ""
    key = run_key if run_key is not None else ATIF_IMPORT_RUN_KEY
    traj = Trajectory(
        episode_id=_content_id(key, document),
        run_key=key,
        task_id=f"imported/atif#{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}",
        suite="imported",
        suite_version="",
        template="",
        prompt=text,
        policy=_policy_of(agent),
        agent=agent,
        tool_versions={
            str(d.get("function", {}).get("name")): ""
            for d in agent.tool_definitions or []
            if isinstance(d.get("function"), dict) and d["function"].get("name")
        },
        context_steps=context,
        steps=steps,
        started_at=started,
        ended_at=times[-1] if len(times) > 1 else None,
        # ATIF records no outcome: unknown, not a default (an epiflow export's own outcome
        # comes back from its `extra.epiflow`).
        status=EpisodeStatus.IMPORTED,
        failure_category=FailureCategory.IMPORTED,
        final_answer=next(
            (s.final_answer for s in reversed(steps) if s.final_answer is not None), None
        ),
    )
    # What rendering `traj` would not give back stays as remainders.
    rendered = _core(traj)
    for c, raw, out in zip(
        (c for c in context),
        (r for r in document["steps"] if r["source"] != "agent"),
        (r for r in rendered["steps"] if r["source"] != "agent"),
        strict=True,
    ):
        c.atif_remainder = _remainder(raw, out)
    for step, raw, out in zip(
        steps,
        raw_agent_steps,
        (r for r in rendered["steps"] if r["source"] == "agent"),
        strict=True,
    ):
        step.atif_remainder = _remainder(raw, out)
    traj.atif_remainder = _remainder(document, rendered, ignored=_ROOT_IGNORED)
    return traj


def from_atif(
    document: Mapping[str, Any],
    *,
    run_key: str | None = None,
    tools: Mapping[str, ToolSpec] | None = None,
) -> Trajectory:
    """An ATIF document as a `Trajectory`: exactly the exported one for an epiflow export,
    every field kept for a foreign document.

    `run_key`: the run the episode joins. None keeps an epiflow export's own run (and
    episode id) and puts a foreign document in `import:atif`; a key that differs from the
    export's moves the episode to that run under an id derived from the run key and the
    document's content.

    Raises:
        pydantic.ValidationError: the document is not valid ATIF (every error has its path).
    """
    AtifTrajectory.model_validate(document)  # errors name the path in the document as given
    raw = copy.deepcopy(dict(document))
    meta = _pop_epiflow(raw)
    deltas = [_pop_epiflow(s) if s.get("source") == "agent" else None for s in raw["steps"]]
    specs = tools if tools is not None else BUILTIN_TOOLS
    started = (
        _parse_time(meta.get("started_at"))
        if meta and isinstance(meta.get("started_at"), str)
        else None
    )
    derived = _derive(raw, run_key=run_key, tools=specs, started=started)
    if meta is None:
        return derived
    dumped = derived.model_dump(mode="json", by_alias=True)
    agent_deltas = [d for d, s in zip(deltas, raw["steps"], strict=True) if s["source"] == "agent"]
    steps = [
        {**step, **(delta or {})} for step, delta in zip(dumped["steps"], agent_deltas, strict=True)
    ]
    traj = Trajectory.model_validate({**dumped, **meta, "steps": steps})
    for step, whole in zip(traj.steps, derived.steps, strict=True):
        step.observation_whole = whole.observation_whole  # in memory only: not in a dump
    if run_key is not None and run_key != traj.run_key:
        traj = traj.model_copy(update={"run_key": run_key, "episode_id": derived.episode_id})
    return traj
