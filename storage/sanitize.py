"""Make text safe for SQL: no NUL bytes, valid UTF-8 only.

PostgreSQL `text` and `jsonb` cannot hold U+0000, and neither accepts lone surrogates
(what `surrogateescape` decoding leaves behind). Rows get cleaned text; the raw bytes
go to the object store, so nothing is lost.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from sandbox.types import output_text

_BAD = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def clean_text(value: str) -> str:
    """Drop NULs and replace lone surrogates with U+FFFD."""
    if value.isascii():  # O(1) in CPython: most text takes this path
        return value.replace("\x00", "") if "\x00" in value else value
    if not _BAD.search(value):
        return value
    return _BAD.sub(lambda m: "" if m.group() == "\x00" else REPLACEMENT, value)


def clean_json(value: Any) -> Any:
    """`clean_text` applied to every string (keys included) in a JSON-like value."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


def json_text(value: Any) -> str:
    """`clean_json(value)` serialized as JSON text for a json/jsonb column, in one step.

    orjson serializes (several times the speed of `json`); it escapes a NUL as `\\u0000`
    and refuses lone surrogates, so a value that needs cleaning shows itself and only
    then takes the slow path. Non-string keys become strings, as in `clean_json`.
    """
    try:
        data = orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS)
    except (orjson.JSONEncodeError, TypeError):  # surrogates, or an int orjson cannot hold
        return _dumps(clean_json(value))
    if b"\\u0000" in data:
        return _dumps(clean_json(value))
    return data.decode()


def _dumps(value: Any) -> str:
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(value, ensure_ascii=False, default=str)


def decode_row_text(data: bytes, cap_chars: int) -> tuple[str, bool, bool]:
    """Decode command output for a SQL row: (text, truncated, lossy).

    `lossy` is True when the bytes were not clean UTF-8 or held NULs, i.e. the row's text
    differs from the raw bytes for a reason other than truncation.
    """
    text = output_text(data)
    lossy = b"\x00" in data or (REPLACEMENT in text and REPLACEMENT.encode() not in data)
    truncated = len(text) > cap_chars
    return (text[:cap_chars] if truncated else text), truncated, lossy
