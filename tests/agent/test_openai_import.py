"""OpenAI chat import: keyed by the whole conversation, content given as a list of parts,
the file's own system prompt kept through an export, bad content refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.export import from_openai_messages, to_openai_messages
from storage.errors import ImportFormatError
from storage.exchange import parse_file

SYSTEM = {"role": "system", "content": "You are a careful shell agent. Answer in <final>."}
USER = {"role": "user", "content": "How many files are in data/?"}


def _rollout(answer: str) -> list[dict[str, Any]]:
    return [SYSTEM, USER, {"role": "assistant", "content": f"<final>{answer}</final>"}]


def test_two_rollouts_of_one_prompt_are_two_episodes_of_one_task() -> None:
    a, b = from_openai_messages(_rollout("3")), from_openai_messages(_rollout("4"))
    assert a.episode_id != b.episode_id
    assert a.task_id == b.task_id
    assert from_openai_messages(_rollout("3")).episode_id == a.episode_id  # same file, same id


def test_content_parts_import_as_their_text() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM["content"]}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look at this."},
                {"type": "image_url", "image_url": {"url": "https://example.org/a.png"}},
                {"type": "text", "text": USER["content"]},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "<final>3</final>"}]},
    ]
    t = from_openai_messages(messages)
    assert t.prompt == "Look at this.\n" + USER["content"]
    assert t.steps[0].raw_output == "<final>3</final>" and t.final_answer == "3"


def test_the_files_own_system_prompt_survives_an_export() -> None:
    messages = _rollout("3")
    t = from_openai_messages(messages)
    exported = to_openai_messages(t)
    assert exported == messages
    again = from_openai_messages(exported)
    assert [s.history_hash for s in again.steps] == [s.history_hash for s in t.steps]
    assert again.episode_id == t.episode_id


def test_a_conversation_without_a_system_message_exports_without_one() -> None:
    messages = _rollout("3")[1:]
    assert to_openai_messages(from_openai_messages(messages)) == messages


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (42, "messages.1.content: expected a string or a list of content parts"),
        (["x"], "messages.1.content.0: a content part is an object"),
        ([{"type": "text"}], "messages.1.content.0.text: a 'text' part needs a string 'text'"),
    ],
)
def test_bad_content_is_refused_naming_the_message(
    content: Any, expected: str, tmp_path: Path
) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps({"messages": [SYSTEM, {"role": "user", "content": content}]}))
    with pytest.raises(ImportFormatError) as info:
        parse_file(path, "openai")
    message = str(info.value)
    assert "document 1 is not valid openai" in message and expected in message
    assert "\n" not in message
