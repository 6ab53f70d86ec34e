"""Trajectory export/import: ATIF and OpenAI chat messages (episodes from the loop on the sandbox double)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import ValidationError

from agent.export import (
    ATIF_SCHEMA_VERSION,
    AtifTrajectory,
    from_atif,
    from_openai_messages,
    to_atif,
    to_openai_messages,
)
from agent.loop import run_episode
from agent.policies import make_policy
from agent.settings import LoopSettings, PolicySettings
from agent.trajectory import ParseKind, Trajectory
from tests.agent.chat_server import ChatServer
from tests.agent.conftest import MemoryOpener, memory_verify


def collect(
    task,
    spec,
    policy_spec: str = "scripted:noisy?malformed=0.4&fabricated_claim=0.2",
    policy_settings: PolicySettings | None = None,
) -> Trajectory:
    policy = make_policy(policy_spec, settings=policy_settings or PolicySettings())
    settings = LoopSettings(max_steps=30, max_consecutive_parse_failures=30)
    return asyncio.run(
        run_episode(
            task,
            policy,
            spec=spec,
            run_key="export",
            settings=settings,
            open_sandbox=MemoryOpener(),
            verify=memory_verify,
            policy_seed=2,
        )
    )


def test_atif_round_trip_is_exact(task, spec) -> None:
    traj = collect(task, spec)
    assert any(s.parse_kind == ParseKind.ERROR for s in traj.steps)
    document = json.loads(json.dumps(to_atif(traj)))
    # Raw stdout/stderr bytes are not part of the serialised trajectory (storage uploads them).
    assert from_atif(document).model_dump() == traj.model_dump()


def test_atif_document_links_observations_to_calls(task, spec) -> None:
    traj = collect(task, spec)
    document = to_atif(traj)
    AtifTrajectory.model_validate(document)
    assert document["schema_version"] == ATIF_SCHEMA_VERSION
    assert document["session_id"] == str(traj.episode_id)
    assert [s["step_id"] for s in document["steps"]] == list(range(1, len(traj.steps) + 3))
    assert [s["source"] for s in document["steps"][:2]] == ["system", "user"]
    for atif_step, step in zip(document["steps"][2:], traj.steps, strict=True):
        assert atif_step["source"] == "agent" and atif_step["message"] == step.raw_output
        if step.parse_kind == ParseKind.TOOL_CALL:
            (call,) = atif_step["tool_calls"]
            assert (call["tool_call_id"], call["function_name"], call["arguments"]) == (
                step.call_id,
                step.tool,
                step.args,
            )
            (result,) = atif_step["observation"]["results"]
            assert (
                result["source_call_id"] == call["tool_call_id"]
                and result["content"] == step.observation
            )
        elif step.parse_kind == ParseKind.ERROR:
            assert "tool_calls" not in atif_step
            assert "source_call_id" not in atif_step["observation"]["results"][0]


def test_foreign_atif_imports_from_core_fields() -> None:
    document = {
        "schema_version": "ATIF-v1.4",
        "session_id": "abc-123",
        "agent": {"name": "other-agent", "version": "2", "model_name": "m-1"},
        "steps": [
            {
                "step_id": 1,
                "source": "user",
                "message": "List the files.",
                "timestamp": "2025-10-11T10:30:00Z",
            },
            {
                "step_id": 2,
                "source": "agent",
                "message": "Listing.",
                "tool_calls": [
                    {"tool_call_id": "t1", "function_name": "list_dir", "arguments": {"path": "."}}
                ],
                "observation": {"results": [{"source_call_id": "t1", "content": "a.txt"}]},
                "metrics": {"prompt_tokens": 10, "completion_tokens": 3},
            },
            {"step_id": 3, "source": "agent", "message": "There is a.txt."},
        ],
    }
    traj = from_atif(document)
    assert traj.prompt == "List the files." and traj.policy == "atif:other-agent@2#m-1"
    assert traj.agent is not None and (traj.agent.name, traj.agent.model_name) == (
        "other-agent",
        "m-1",
    )
    assert traj.run_key == "import:atif" and traj.task_id.startswith("imported/atif#")
    first, last = traj.steps
    assert (first.call_id, first.tool, first.args, first.observation) == (
        "t1",
        "list_dir",
        {"path": "."},
        "a.txt",
    )
    assert (first.prompt_tokens, first.completion_tokens) == (10, 3)
    assert last.parse_kind == ParseKind.FINAL and traj.final_answer == "There is a.txt."
    with pytest.raises(ValidationError):
        from_atif({"schema_version": "ATIF-v1.4", "steps": []})


def test_openai_text_export_is_the_history_the_model_saw(task, spec) -> None:
    traj = collect(task, spec)
    messages = to_openai_messages(traj)
    imported = from_openai_messages(messages, task_id=traj.task_id)
    assert [s.history_hash for s in imported.steps] == [s.history_hash for s in traj.steps]
    for mine, theirs in zip(traj.steps, imported.steps, strict=True):
        assert (
            theirs.raw_output,
            theirs.parse_kind,
            theirs.call_id,
            theirs.tool,
            theirs.args,
            theirs.observation,
            theirs.final_answer,
        ) == (
            mine.raw_output,
            mine.parse_kind,
            mine.call_id,
            mine.tool,
            mine.args,
            mine.observation,
            mine.final_answer,
        )
        assert theirs.parse_error_code == mine.parse_error_code
    assert to_openai_messages(imported) == messages


def test_openai_native_export(task, spec) -> None:
    traj = collect(task, spec, "scripted:oracle")
    messages = to_openai_messages(traj, style="native")
    calls = [m for m in messages if m["role"] == "assistant" and "tool_calls" in m]
    assert len(calls) == len(task.reference_solution)
    for message, ref in zip(calls, task.reference_solution, strict=True):
        (call,) = message["tool_calls"]
        assert (
            call["function"]["name"] == ref.tool
            and json.loads(call["function"]["arguments"]) == ref.args
        )
        assert "<tool_call" not in message["content"]
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [c["tool_calls"][0]["id"] for c in calls]
    imported = from_openai_messages(messages)
    assert [(s.tool, s.args) for s in imported.steps if s.tool] == [
        (r.tool, r.args) for r in task.reference_solution
    ]


def test_native_episode_round_trips_through_openai_messages(task, spec) -> None:
    native = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "list_dir", "arguments": '{"path": "data"}'},
        }
    ]
    actions: list[dict[str, Any]] = [
        {"kind": "ok", "text": None, "tool_calls": native},
        {"kind": "ok", "text": "<final>done</final>"},
    ]
    with ChatServer(actions) as server:
        traj = collect(
            task,
            spec,
            f"openai:{server.base_url}#m?native_tools=true",
            policy_settings=PolicySettings(backoff_initial_s=0.01),
        )
    imported = from_openai_messages(to_openai_messages(traj))
    assert [s.history_hash for s in imported.steps] == [s.history_hash for s in traj.steps]
    assert imported.steps[0].native_tool_calls == native and imported.steps[0].tool == "list_dir"
    assert from_atif(to_atif(traj)).model_dump() == traj.model_dump()
