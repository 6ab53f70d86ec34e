"""`storage.documents`: the nesting-depth check is a linear scan that builds nothing the
size of the file, and it reads strings (escapes included) the way a JSON parser does."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from storage.documents import MAX_DEPTH, _check_depth, read_documents
from storage.errors import ImportFormatError

PATH = Path("doc.json")


def _depth_of(text: str) -> int:
    """The deepest nesting of a JSON value, by walking the parsed value (the reference)."""

    def walk(value: object) -> int:
        if isinstance(value, dict):
            return 1 + max((walk(v) for v in value.values()), default=0)
        if isinstance(value, list):
            return 1 + max((walk(v) for v in value), default=0)
        return 0

    return walk(json.loads(text))


@pytest.mark.parametrize(
    "value",
    [
        {"a": "[[[[", "b": ["]]]]"]},
        {"quote": 'say "[" then \\', "list": [[["x"]]]},
        ["\\\\", ['\\"[', [{"k": '\\\\\\"{{{'}]]],
        {"": "", "e": [], "o": {}},
    ],
)
def test_brackets_inside_strings_do_not_count(value: object) -> None:
    text = json.dumps(value)
    depth = _depth_of(text)
    assert depth < MAX_DEPTH
    _check_depth(text, PATH)  # accepted
    # The same value wrapped to one level past the limit is refused: the count is exact.
    deeper = "[" * (MAX_DEPTH - depth + 1) + text + "]" * (MAX_DEPTH - depth + 1)
    with pytest.raises(ImportFormatError, match="nested deeper than"):
        _check_depth(deeper, PATH)
    exact = "[" * (MAX_DEPTH - depth) + text + "]" * (MAX_DEPTH - depth)
    _check_depth(exact, PATH)


def test_one_long_string_costs_no_copy_of_the_file() -> None:
    text = json.dumps({"observation": 'x\\"[{\n' * 2_000_000 + "y" * 10_000_000})
    assert len(text) > 20_000_000
    tracemalloc.start()
    try:
        _check_depth(text, PATH)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak  # the old regex built a rewritten copy (and ~120x in stack)


def test_a_file_with_one_long_string_reads(tmp_path: Path) -> None:
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"s": "\\" * 1000 + '"' * 10 + "z" * 100_000}), encoding="utf-8")
    [document] = read_documents(path)
    assert document["s"].endswith("z" * 100_000)


def test_a_truncated_string_full_of_escaped_quotes_is_scanned_once() -> None:
    # A file cut inside a string: every escaped quote would otherwise start a new attempt
    # at a string running to the end of the file (quadratic in the file size).
    truncated = '{"a": [[1]], "s": "' + 'x\\"[' * 200_000
    _check_depth(truncated, PATH)  # nothing nested too deep outside the string
    deep = "[" * (MAX_DEPTH + 1) + '"' + '\\"{' * 200_000
    with pytest.raises(ImportFormatError, match="nested deeper than"):
        _check_depth(deep, PATH)
    _check_depth('["ends with a backslash\\', PATH)


def test_a_truncated_file_is_refused_as_not_json(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text('{"schema_version": "ATIF-v1.5", "s": "' + 'x\\"' * 1000, encoding="utf-8")
    with pytest.raises(ImportFormatError, match="not JSON"):
        read_documents(path)
