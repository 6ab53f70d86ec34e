"""`storage.sanitize`: text and JSON made safe for SQL (pure functions, no database)."""

from __future__ import annotations

import json

import pytest

from storage.sanitize import clean_json, clean_text, json_text


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("plain", "plain"),
        ("nul\x00s\x00", "nuls"),
        ("é and ✓", "é and ✓"),
        ("lone \ud800 surrogate\x00", "lone \ufffd surrogate"),
        ("", ""),
    ],
)
def test_clean_text(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1, "b": [1.5, None, True, "x"]},
        {"nul\x00key": "nul\x00value", "list": ["\x00", {"deep": "\ud800"}]},
        {1: "int key", "t": ("a", "b")},
        ["é", {"✓": 2**70}],  # an int orjson cannot hold takes the slow path
        [],
    ],
)
def test_json_text_is_clean_json_serialized(value: object) -> None:
    text = json_text(value)
    assert "\\u0000" not in text and "\ud800" not in text
    assert json.loads(text) == json.loads(json.dumps(clean_json(value), ensure_ascii=False))
