"""Make text safe for SQL: no NUL bytes, valid UTF-8 only.

PostgreSQL `text` and `jsonb` cannot hold U+0000, and neither accepts lone surrogates
(what `surrogateescape` decoding leaves behind). Rows get cleaned text; the raw bytes
go to the object store, so nothing is lost.
"""

from __future__ import annotations

import re
from typing import Any

_BAD = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def clean_text(value: str) -> str:
    """Drop NULs and replace lone surrogates with U+FFFD."""
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


def decode_output(data: bytes, cap_chars: int) -> tuple[str, bool, bool]:
    """Decode command output for a SQL row: (text, truncated, lossy).

    `lossy` is True when the bytes were not clean UTF-8 or held NULs, i.e. the row's text
    differs from the raw bytes for a reason other than truncation.
    """
    text = data.decode("utf-8", errors="replace")
    lossy = "\x00" in text or (REPLACEMENT in text and REPLACEMENT.encode() not in data)
    text = clean_text(text)
    truncated = len(text) > cap_chars
    return (text[:cap_chars] if truncated else text), truncated, lossy
