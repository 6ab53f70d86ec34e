"""Harbor's v1.5 sub-agent and continuation files (`shared/interop/atif-linked/`, read in
place), and the documents Harbor's models refuse: refused here too, with the field path.

Step `is_copied_context` and root `continued_trajectory_ref` import and export back as
they were; dangling `source_call_id`s, duplicate or 0-based step ids and agent-only fields
on other steps are refused as Harbor's validator refuses them.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from agent.atif import AtifTrajectory
from agent.export import from_atif, to_atif
from tests.agent.test_atif_interop import without_epiflow
from tests.interop import ATIF_NAMES, LINKED_NAMES, atif_file, linked_file, linked_files, load


@pytest.mark.parametrize("name", LINKED_NAMES)
def test_linked_files_import_and_export_back(name: str) -> None:
    document = load(linked_file(name))
    t = from_atif(document)
    assert without_epiflow(to_atif(t)) == document
    assert from_atif(to_atif(t)) == t


def test_the_linked_files_carry_the_v15_fields() -> None:
    documents = [load(p) for p in linked_files()]
    assert any(d.get("continued_trajectory_ref") for d in documents)
    assert any(s.get("is_copied_context") for d in documents for s in d["steps"])


def _valid() -> dict[str, Any]:
    document: dict[str, Any] = load(atif_file(ATIF_NAMES[0]))
    return document


def _with_call(document: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return next(
        (i, s)
        for i, s in enumerate(document["steps"])
        if s.get("tool_calls") and s.get("observation")
    )


def _refusal(document: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        from_atif(document)
    return str(info.value)


def test_a_dangling_source_call_id_is_refused_with_its_path() -> None:
    document = copy.deepcopy(_valid())
    i, step = _with_call(document)
    step["observation"]["results"][0]["source_call_id"] = "no-such-call"
    message = _refusal(document)
    assert f"steps.{i}.observation.results.0.source_call_id" in message
    assert "no-such-call" in message


def test_duplicate_step_ids_are_refused() -> None:
    document = copy.deepcopy(_valid())
    document["steps"][1]["step_id"] = 1
    assert "steps.1.step_id: expected 2" in _refusal(document)


def test_zero_based_step_ids_are_refused() -> None:
    document = copy.deepcopy(_valid())
    for i, step in enumerate(document["steps"]):
        step["step_id"] = i
    assert "steps.0.step_id: expected 1" in _refusal(document)


def test_agent_only_fields_on_a_user_step_are_refused() -> None:
    document = copy.deepcopy(_valid())
    user = next(s for s in document["steps"] if s["source"] == "user")
    user["metrics"] = {"prompt_tokens": 1}
    assert "only allowed on agent steps" in _refusal(document)


def test_a_timestamp_that_is_not_iso_8601_is_refused() -> None:
    document = copy.deepcopy(_valid())
    document["steps"][0]["timestamp"] = "yesterday"
    assert "not an ISO 8601 timestamp" in _refusal(document)


def test_harbors_files_all_pass_the_strict_models() -> None:
    for path in [*linked_files(), *(atif_file(n) for n in ATIF_NAMES)]:
        AtifTrajectory.model_validate(load(path))
