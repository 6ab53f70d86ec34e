"""Read a file of JSON documents for import, refusing hostile input with one line.

A file is one JSON value (an object, or an array of objects) or JSON lines. Before any
parser sees it, the bytes must be UTF-8 text without NUL bytes, and no value may nest
deeper than `MAX_DEPTH` (Python's parser would recurse until `RecursionError`). A file
with no document at all is an error too: an import that imports nothing says so.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from storage.errors import ImportFormatError

__all__ = ["MAX_DEPTH", "read_documents"]

MAX_DEPTH = 100
"""Deepest nesting of arrays and objects accepted (an ATIF document needs about 10)."""

_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"?|[\[\]{}]', re.S)
"""A whole JSON string, or a bracket. The quantifiers are possessive: the engine keeps no
backtracking state per character (the plain `(?:[^"\\]|\\.)*` of a string cost ~120x the
file size on one long string, 2.5 GB for a 20 MB observation). The closing quote is
optional, so an unterminated string (a truncated file) runs to the end once instead of
being tried again from every quote inside it (quadratic); the parser then names it."""


def _refuse(path: Path, problem: str) -> ImportFormatError:
    return ImportFormatError(f"{path}: {problem}", setting=str(path))


def _check_depth(text: str, path: Path) -> None:
    """Linear scan in constant memory: the running depth of brackets outside strings.

    The Python loop turns once per string or bracket (a string is matched in C, never
    copied: only its first character is looked at)."""
    depth = 0
    for match in _TOKEN.finditer(text):
        char = text[match.start()]
        if char == '"':
            continue
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, match.start()) + 1
                raise _refuse(
                    path,
                    f"JSON nested deeper than {MAX_DEPTH} levels (line {line}); "
                    "import refuses such input",
                )
        else:
            depth = max(depth - 1, 0)


def _decode(data: bytes, path: Path) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _refuse(
            path,
            f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
            "import reads UTF-8 JSON or JSON lines",
        ) from e
    nul = text.find("\x00")
    if nul >= 0:
        raise _refuse(path, f"binary data, not JSON (NUL byte at offset {nul})")
    return text.removeprefix("\ufeff")


def _json_value(text: str, path: Path) -> Any:
    """`json.loads`, with a number Python refuses to convert (more than
    `sys.get_int_max_str_digits()` digits: a plain `ValueError`, not a JSON error) refused
    in one line; `json.JSONDecodeError` passes through."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError as e:
        limit = sys.get_int_max_str_digits()
        raise _refuse(path, f"holds a number longer than {limit} digits") from e


def read_documents(path: Path) -> list[Any]:
    """The documents in `path`: a JSON array's items, a single JSON value, or JSON lines.

    Raises:
        ImportFormatError: unreadable, not UTF-8, binary, nested too deep, not JSON, or
            holding no document ("no trajectories found in FILE").
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise _refuse(path, f"cannot read: {e.strerror or e}") from e
    text = _decode(data, path)
    del data  # the bytes are not needed past decoding: the file is held once, as text
    # No stripped copy: the parser skips surrounding whitespace itself.
    if not text or text.isspace():
        raise ImportFormatError(f"no trajectories found in {path} (it is empty)", setting=str(path))
    _check_depth(text, path)
    docs: list[Any]
    try:
        whole = _json_value(text, path)
    except json.JSONDecodeError as whole_error:
        docs = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                docs.append(_json_value(line, path))
            except json.JSONDecodeError as e:
                if not docs:  # not JSON lines either: where the whole document breaks
                    raise _refuse(
                        path,
                        f"not JSON: {whole_error.msg} (line {whole_error.lineno}, "
                        f"column {whole_error.colno})",
                    ) from whole_error
                raise _refuse(path, f"line {n}: not JSON: {e.msg}") from e
    else:
        docs = whole if isinstance(whole, list) else [whole]
    if not docs:
        raise ImportFormatError(
            f"no trajectories found in {path} (an empty list)", setting=str(path)
        )
    return docs
