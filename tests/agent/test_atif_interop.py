"""ATIF v1.5 in and out on Harbor's own files (`shared/interop/atif/`, read in place).

Import keeps every field (identity, tool definitions, system steps, reasoning, token ids,
log probabilities, costs); export gives the document back field by field; import →
export → import gives the same trajectory field by field; ids come from the content.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from agent.atif import ATIF_SCHEMA_VERSION, AtifTrajectory
from agent.export import from_atif, to_atif, to_openai_messages
from agent.prompt import render_system_prompt
from agent.trajectory import ParseKind, Trajectory
from sandbox.tool_specs import BUILTIN_TOOLS
from tests.interop import ATIF_NAMES, atif_file, load
from tests.storage.builders import make_trajectory

OPENHANDS, TERMINUS_INVALID_JSON, TERMINUS_TIMEOUT = ATIF_NAMES


def agent_steps(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in document["steps"] if s["source"] == "agent"]


def without_epiflow(document: dict[str, Any]) -> dict[str, Any]:
    """An export with epiflow's own `extra` entries taken out (what the producer wrote)."""
    out = copy.deepcopy(document)
    for obj in [out, *out["steps"]]:
        extra = obj.get("extra")
        if isinstance(extra, dict) and "epiflow" in extra:
            del extra["epiflow"]
            if not extra:
                del obj["extra"]
    return out


@pytest.mark.parametrize("name", ATIF_NAMES)
def test_import_keeps_every_field(name: str) -> None:
    document = load(atif_file(name))
    t = from_atif(document)

    assert t.agent is not None
    assert t.agent.model_dump(exclude_none=True) == document["agent"]
    model = document["agent"].get("model_name")
    agent = document["agent"]
    assert t.policy == f"atif:{agent['name']}@{agent['version']}" + (f"#{model}" if model else "")
    context = [s for s in document["steps"] if s["source"] != "agent"]
    assert [(c.source, c.message) for c in t.context_steps] == [
        (s["source"], s["message"]) for s in context
    ]
    assert t.prompt == next(s["message"] for s in context if s["source"] == "user")

    steps = agent_steps(document)
    assert len(t.steps) == len(steps)
    for step, raw in zip(t.steps, steps, strict=True):
        assert step.raw_output == raw["message"]
        assert step.reasoning_content == raw.get("reasoning_content")
        metrics = raw.get("metrics", {})
        for field in (
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "cost_usd",
            "prompt_token_ids",
            "completion_token_ids",
            "logprobs",
        ):
            assert getattr(step, field) == metrics.get(field), (raw["step_id"], field)
        calls = raw.get("tool_calls") or []
        if calls:
            assert step.parse_kind == ParseKind.TOOL_CALL
            assert (step.call_id, step.tool, step.args) == (
                calls[0]["tool_call_id"],
                calls[0]["function_name"],
                calls[0]["arguments"],
            )
        observation = raw.get("observation")
        expected = (
            "\n".join(r.get("content") or "" for r in observation["results"])
            if observation
            else None
        )
        assert step.observation == expected


def test_the_files_carry_what_the_issue_names() -> None:
    """The fields Harbor's files hold that older imports lost are really there."""
    openhands = from_atif(load(atif_file(OPENHANDS)))
    assert openhands.agent is not None and openhands.agent.tool_definitions
    assert openhands.agent.extra == {"agent_class": "CodeActAgent"}
    assert [c.source for c in openhands.context_steps].count("system") == 3
    assert sum(s.cost_usd or 0 for s in openhands.steps) == pytest.approx(0.00135)
    invalid = from_atif(load(atif_file(TERMINUS_INVALID_JSON)))
    assert all(s.reasoning_content for s in invalid.steps)
    timeout = from_atif(load(atif_file(TERMINUS_TIMEOUT)))
    assert timeout.steps[0].prompt_token_ids and timeout.steps[0].completion_token_ids
    assert timeout.steps[0].logprobs is not None
    assert len(timeout.steps[0].logprobs) == len(timeout.steps[0].completion_token_ids)


@pytest.mark.parametrize("name", ATIF_NAMES)
def test_export_gives_the_document_back_field_by_field(name: str) -> None:
    document = load(atif_file(name))
    exported = json.loads(json.dumps(to_atif(from_atif(document))))
    assert exported["schema_version"] == ATIF_SCHEMA_VERSION == "ATIF-v1.5"
    AtifTrajectory.model_validate(exported)
    assert set(exported["extra"]) == {"epiflow"}  # the only thing epiflow adds
    produced = without_epiflow(exported)
    assert set(produced) == set(document)
    for key in document:
        if key != "steps":
            assert produced[key] == document[key], key
    assert len(produced["steps"]) == len(document["steps"])
    for ours, theirs in zip(produced["steps"], document["steps"], strict=True):
        assert set(ours) == set(theirs), theirs["step_id"]
        for key in theirs:
            assert ours[key] == theirs[key], (theirs["step_id"], key)


@pytest.mark.parametrize("name", ATIF_NAMES)
def test_import_export_import_is_lossless(name: str) -> None:
    first = from_atif(load(atif_file(name)))
    again = from_atif(json.loads(json.dumps(to_atif(first))))
    a = first.model_dump(mode="json", by_alias=True)
    b = again.model_dump(mode="json", by_alias=True)
    for field in Trajectory.model_fields:
        if field != "steps":
            assert a[field] == b[field], field
    for sa, sb in zip(a["steps"], b["steps"], strict=True):
        assert set(sa) == set(sb)
        for key in sa:  # every serialised step field (raw output bytes are not serialised)
            assert sa[key] == sb[key], (sa["index"], key)
    assert first == again


def test_episode_ids_come_from_the_content_and_the_run_key() -> None:
    invalid, timeout = load(atif_file(TERMINUS_INVALID_JSON)), load(atif_file(TERMINUS_TIMEOUT))
    assert invalid["session_id"] == timeout["session_id"]  # Harbor reuses session ids
    a, b = from_atif(invalid), from_atif(timeout)
    assert a.episode_id != b.episode_id
    assert from_atif(copy.deepcopy(invalid)).episode_id == a.episode_id  # same file, same id
    assert a.run_key == "import:atif"
    keyed = from_atif(invalid, run_key="harbor-nightly")
    assert keyed.run_key == "harbor-nightly" and keyed.episode_id != a.episode_id
    # Re-importing an export keeps the run it was exported from, unless told otherwise.
    exported = json.loads(json.dumps(to_atif(keyed)))
    assert from_atif(exported).episode_id == keyed.episode_id
    moved = from_atif(exported, run_key="elsewhere")
    assert moved.run_key == "elsewhere" and moved.episode_id != keyed.episode_id


def test_validation_errors_name_the_field_path() -> None:
    document = load(atif_file(OPENHANDS))
    document["agent"]["tool_definition"] = document["agent"].pop("tool_definitions")
    with pytest.raises(ValidationError) as caught:
        from_atif(document)
    assert ("agent", "tool_definition") in [e["loc"] for e in caught.value.errors()]
    newer = load(atif_file(OPENHANDS)) | {"schema_version": "ATIF-v1.9"}
    with pytest.raises(ValidationError) as caught:
        from_atif(newer)
    assert caught.value.errors()[0]["loc"] == ("schema_version",)


def test_epiflow_episodes_export_as_v15_with_their_tools() -> None:
    t = make_trajectory(n_steps=3)
    t.tool_versions = {"execute_shell": BUILTIN_TOOLS["execute_shell"].version}
    document = to_atif(t)
    AtifTrajectory.model_validate(document)
    assert document["schema_version"] == "ATIF-v1.5"
    assert document["agent"]["name"] == "epiflow"
    assert document["agent"]["tool_definitions"] == [BUILTIN_TOOLS["execute_shell"].openai_tool()]
    assert document["steps"][0]["message"] == render_system_prompt([BUILTIN_TOOLS["execute_shell"]])
    # Raw stdout/stderr bytes are not part of the serialised trajectory (storage uploads them).
    assert from_atif(json.loads(json.dumps(document))).model_dump() == t.model_dump()


def test_an_imported_episode_keeps_its_own_conversation() -> None:
    document = load(atif_file(OPENHANDS))
    messages = to_openai_messages(from_atif(document))
    context = [s for s in document["steps"] if s["source"] != "agent"]
    assert [m["content"] for m in messages if m["role"] in ("system", "user")][: len(context)] == [
        s["message"] for s in context
    ]
    assert [m["role"] for m in messages][:5] == ["system", "user", "system", "system", "assistant"]
