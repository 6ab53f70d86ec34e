"""ATIF v1.6–v1.8 on Harbor's own files, raised to the newer versions with their features.

The documents start from the real Harbor files in `shared/interop/` (read in place) and
gain what each version added: content parts for a message and a result's content (v1.6),
`trajectory_id`, no `session_id`, embedded `subagent_trajectories` resolved by
`trajectory_id`, `llm_call_count` and `extra.context_management` (v1.7), audio parts
(v1.8). Each imports with every field, exports back as it was (in its own version) and
re-imports to the same trajectory; each feature in a version that predates it, and each
rule Harbor's models enforce, is refused with the field path.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine

from agent.atif import ATIF_VERSIONS, AtifTrajectory, content_text
from agent.atif_convert import OBSERVATION_INLINE_CAP
from agent.export import from_atif, to_atif
from storage.exchange import export_run, import_file
from storage.objects import LocalObjectStore
from tests.agent.test_atif_interop import without_epiflow
from tests.interop import ATIF_NAMES, atif_file, interop_dir, load

PARENT = "terminus_2__hello-world-context-summarization.trajectory.json"
SUMMARY = "terminus_2__hello-world-context-summarization.trajectory.summarization-1-summary.json"
QUESTIONS = (
    "terminus_2__hello-world-context-summarization.trajectory.summarization-1-questions.json"
)

IMAGE: dict[str, Any] = {
    "type": "image",
    "source": {"media_type": "image/png", "path": "shots/screen-1.png"},
}
AUDIO: dict[str, Any] = {
    "type": "audio",
    "source": {"media_type": "audio/mp3", "path": "https://example.org/a.mp3", "duration_sec": 2.5},
}


def _linked(name: str) -> dict[str, Any]:
    return load(interop_dir() / "atif-linked" / name)


def _agent_with_call(document: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return next(
        (i, s)
        for i, s in enumerate(document["steps"])
        if s["source"] == "agent" and s.get("tool_calls") and s.get("observation")
    )


def v16() -> dict[str, Any]:
    """Harbor's OpenHands file as v1.6: a user message and a tool result given as parts."""
    document = load(atif_file(ATIF_NAMES[0]))
    document["schema_version"] = "ATIF-v1.6"
    user = next(s for s in document["steps"] if s["source"] == "user")
    user["message"] = [{"type": "text", "text": user["message"]}, IMAGE]
    _, step = _agent_with_call(document)
    result = step["observation"]["results"][0]
    result["content"] = [IMAGE, {"type": "text", "text": result["content"]}]
    return document


def v17() -> dict[str, Any]:
    """Harbor's summarising Terminus-2 parent as v1.7: its two summarisation sub-agents
    embedded and referenced by `trajectory_id`, no `session_id` anywhere."""
    document = _linked(PARENT)
    document["schema_version"] = "ATIF-v1.7"
    document["trajectory_id"] = "parent-1"
    del document["session_id"]
    children = []
    for name, tid in ((SUMMARY, "summary-1"), (QUESTIONS, "questions-1")):
        child = _linked(name)
        child["schema_version"] = "ATIF-v1.7"
        child["trajectory_id"] = tid
        children.append(child)
    document["subagent_trajectories"] = children
    system = next(s for s in document["steps"] if s["source"] == "system" and s.get("observation"))
    refs = system["observation"]["results"][0]["subagent_trajectory_ref"]
    for ref, child in zip(refs, children, strict=False):
        ref["trajectory_id"] = child["trajectory_id"]
        del ref["trajectory_path"]
    for step in document["steps"]:
        if step["source"] == "agent":
            step["llm_call_count"] = 1
    document["extra"] = {"context_management": {"strategy": "summarize", "summaries": 1}}
    return document


def v18() -> dict[str, Any]:
    """The v1.7 document as v1.8, with an audio part in a tool result."""
    document = v17()
    document["schema_version"] = "ATIF-v1.8"
    for child in document["subagent_trajectories"]:
        child["schema_version"] = "ATIF-v1.8"
    _, step = _agent_with_call(document)
    result = step["observation"]["results"][0]
    result["content"] = [{"type": "text", "text": result["content"]}, AUDIO]
    return document


BUILDERS = {"v1.6": v16, "v1.7": v17, "v1.8": v18}


@pytest.mark.parametrize("version", BUILDERS)
def test_newer_versions_import_export_back_and_reimport(version: str) -> None:
    document = BUILDERS[version]()
    AtifTrajectory.model_validate(document)
    t = from_atif(copy.deepcopy(document))
    exported = json.loads(json.dumps(to_atif(t)))
    assert exported["schema_version"] == document["schema_version"]
    assert without_epiflow(exported) == document
    assert from_atif(exported) == t


def test_content_parts_become_the_text_epiflow_reads() -> None:
    document = v16()
    t = from_atif(document)
    user = next(s for s in document["steps"] if s["source"] == "user")
    assert t.prompt == user["message"][0]["text"]
    _, step = _agent_with_call(document)
    raw = step["observation"]["results"][0]["content"]
    agent_steps = [s for s in document["steps"] if s["source"] == "agent"]
    imported = t.steps[agent_steps.index(step)]
    assert imported.observation == raw[1]["text"]
    # The parts themselves (the image and its metadata) stay in the stored trajectory.
    assert imported.atif_remainder is not None
    assert imported.atif_remainder.values["/observation/results/0/content"] == raw


def test_content_text_joins_text_parts() -> None:
    parts = AtifTrajectory.model_validate(v18()).steps
    _, step = _agent_with_call(v18())
    model_step = parts[step["step_id"] - 1]
    assert model_step.observation is not None
    content = model_step.observation.results[0].content
    assert content_text(content) == step["observation"]["results"][0]["content"][0]["text"]
    assert content_text(None) == "" and content_text("plain") == "plain"


def test_embedded_sub_agents_and_v17_fields_survive() -> None:
    document = v17()
    t = from_atif(document)
    assert t.atif_remainder is not None
    kept = t.atif_remainder.values
    assert kept["/trajectory_id"] == "parent-1"
    assert kept["/subagent_trajectories"] == document["subagent_trajectories"]
    assert kept["/extra"] == document["extra"]
    assert "/session_id" in t.atif_remainder.missing
    assert all(
        s.atif_remainder is not None and s.atif_remainder.values["/llm_call_count"] == 1
        for s in t.steps
    )


def test_export_in_the_newest_version_on_request() -> None:
    newest = ATIF_VERSIONS[-1]
    assert newest == "ATIF-v1.8"
    t = from_atif(load(atif_file(ATIF_NAMES[1])))
    upgraded = to_atif(t, schema_version=newest)
    assert upgraded["schema_version"] == newest
    AtifTrajectory.model_validate(upgraded)
    # A document with content parts cannot be written as a version before them.
    with pytest.raises(ValidationError, match=r"content parts need ATIF-v1\.6"):
        to_atif(from_atif(v16()), schema_version="ATIF-v1.5")


def _refusal(document: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        from_atif(document)
    return str(info.value)


def _set_version(document: dict[str, Any], version: str) -> dict[str, Any]:
    document["schema_version"] = version
    for child in document.get("subagent_trajectories") or []:
        child["schema_version"] = version
    return document


def test_each_feature_is_refused_before_its_version() -> None:
    assert "content parts need ATIF-v1.6" in _refusal(_set_version(v16(), "ATIF-v1.5"))
    too_early = _set_version(v17(), "ATIF-v1.6")
    too_early["session_id"] = "s"
    assert "embedded sub-agents need ATIF-v1.7" in _refusal(too_early)
    assert "audio parts need ATIF-v1.8" in _refusal(_set_version(v18(), "ATIF-v1.7"))


def test_session_id_is_required_up_to_v16() -> None:
    document = v16()
    del document["session_id"]
    assert "session_id: required up to ATIF-v1.6" in _refusal(document)


def test_a_ref_by_trajectory_id_must_name_an_embedded_sub_agent() -> None:
    document = v17()
    document["subagent_trajectories"].pop()
    message = _refusal(document)
    assert "subagent_trajectory_ref.1.trajectory_id" in message
    assert "'questions-1' names no embedded sub-agent" in message


def test_a_v17_ref_needs_an_id_or_a_path() -> None:
    document = v17()
    system = next(s for s in document["steps"] if s["source"] == "system" and s.get("observation"))
    del system["observation"]["results"][0]["subagent_trajectory_ref"][0]["trajectory_id"]
    assert "set trajectory_id or trajectory_path" in _refusal(document)


def test_embedded_sub_agents_need_unique_trajectory_ids() -> None:
    document = v17()
    document["subagent_trajectories"][1]["trajectory_id"] = "summary-1"
    assert "subagent_trajectories.1.trajectory_id: 'summary-1' is used" in _refusal(document)
    del document["subagent_trajectories"][1]["trajectory_id"]
    assert "required for an embedded sub-agent" in _refusal(document)


def test_errors_inside_an_embedded_sub_agent_name_its_path() -> None:
    document = v17()
    document["subagent_trajectories"][0]["steps"][0]["step_id"] = 7
    with pytest.raises(ValidationError) as info:
        from_atif(document)
    [error] = info.value.errors()
    assert error["loc"][:2] == ("subagent_trajectories", 0)
    assert "steps.0.step_id: expected 1" in error["msg"]


def test_duplicate_tool_call_ids_are_refused_from_v18() -> None:
    document = v18()
    calls = [
        (i, s)
        for i, s in enumerate(document["steps"])
        if s["source"] == "agent" and s.get("tool_calls")
    ]
    (_, first), (i, second) = calls[0], calls[1]
    second["tool_calls"][0]["tool_call_id"] = first["tool_calls"][0]["tool_call_id"]
    for result in second["observation"]["results"]:
        if result.get("source_call_id") is not None:
            result["source_call_id"] = first["tool_calls"][0]["tool_call_id"]
    message = _refusal(copy.deepcopy(document))
    assert f"steps.{i}.tool_calls.0.tool_call_id" in message
    assert "unique in a trajectory" in message
    # The same ids in a v1.7 document are Harbor-valid there.
    from_atif(_set_version(document, "ATIF-v1.7") | {"steps": _without_audio(document["steps"])})


def _without_audio(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(steps)
    for step in out:
        for result in (step.get("observation") or {}).get("results", []):
            if isinstance(result.get("content"), list):
                result["content"] = [p for p in result["content"] if p["type"] != "audio"]
    return out


def test_llm_call_count_zero_forbids_metrics() -> None:
    document = v17()
    step = next(s for s in document["steps"] if s["source"] == "agent" and s.get("metrics"))
    step["llm_call_count"] = 0
    assert "'metrics' is not allowed on an agent step with llm_call_count 0" in _refusal(document)


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        ({"type": "text"}, "a 'text' part needs 'text'"),
        ({"type": "text", "text": "x", "source": IMAGE["source"]}, "a 'text' part has no 'source'"),
        ({"type": "image"}, "an 'image' part needs 'source'"),
        ({**IMAGE, "text": "x"}, "an 'image' part has no 'text'"),
        ({"type": "image", "source": AUDIO["source"]}, "needs an image source"),
        ({"type": "audio", "source": IMAGE["source"]}, "needs an audio source"),
        ({"type": "image", "source": {"media_type": "image/tiff", "path": "a"}}, "image/tiff"),
        ({"type": "video", "source": IMAGE["source"]}, "type"),
        ({**IMAGE, "alt": "x"}, "alt"),
    ],
)
def test_malformed_content_parts_are_refused(part: dict[str, Any], expected: str) -> None:
    document = v18()
    user = next(s for s in document["steps"] if s["source"] == "user")
    user["message"] = [part]
    assert expected in _refusal(document)


def test_a_negative_audio_duration_is_refused() -> None:
    document = v18()
    user = next(s for s in document["steps"] if s["source"] == "user")
    user["message"] = [{"type": "audio", "source": {**AUDIO["source"], "duration_sec": -1}}]
    assert "duration_sec" in _refusal(document)


def test_a_long_observation_is_capped_inline_and_whole_in_the_object() -> None:
    document = load(atif_file(ATIF_NAMES[0]))
    i, step = _agent_with_call(document)
    long = "line of output\n" * (OBSERVATION_INLINE_CAP // 10)
    step["observation"]["results"][0]["content"] = long
    t = from_atif(copy.deepcopy(document))
    agent_steps = [s for s in document["steps"] if s["source"] == "agent"]
    imported = t.steps[agent_steps.index(step)]
    assert imported.observation is not None
    assert imported.observation.startswith(long[:OBSERVATION_INLINE_CAP])
    assert f"cut at {OBSERVATION_INLINE_CAP} of {len(long)} characters" in imported.observation
    assert len(imported.observation) < OBSERVATION_INLINE_CAP + 200
    exported = json.loads(json.dumps(to_atif(t)))
    assert exported["steps"][i]["observation"]["results"][0]["content"] == long
    assert without_epiflow(exported) == document
    assert from_atif(exported) == t


def test_a_v18_file_imports_into_sql_and_exports_back(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """The whole path on real SQLite and PostgreSQL: file → rows and object → export."""
    document = v18()
    path = tmp_path / "v18.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    report = import_file(migrated_engine, store, path, "atif")
    assert len(report.inserted) == 3  # the parent and its two embedded sub-agents
    assert import_file(migrated_engine, store, path, "atif").inserted == []
    out = tmp_path / "out.jsonl"
    assert export_run(migrated_engine, store, "import:atif", "atif", out) == 1
    [line] = out.read_text(encoding="utf-8").splitlines()
    assert without_epiflow(json.loads(line)) == document
