"""One decoding of a command's output bytes (`sandbox.types.output_text`): UTF-8 with U+FFFD
for bytes that are not, NULs dropped. A step's text (`agent.render`), a stored row's text
(`storage.sanitize`) and a verifier's output (`tasks.verify`) all read bytes through it,
so they never disagree about the same bytes."""

from __future__ import annotations

import pytest

from agent.render import decode_step_text
from sandbox.types import output_text
from storage.sanitize import decode_row_text

SAMPLES = [b"", b"plain\n", b"nul\x00inside", b"bad \xff\xfe utf-8", "é ✓".encode(), b"\x00"]


@pytest.mark.parametrize("data", SAMPLES)
def test_every_reader_decodes_alike(data: bytes) -> None:
    text = output_text(data)
    assert "\x00" not in text
    assert decode_step_text(data, 1_000) == (text, False)
    row_text, truncated, _ = decode_row_text(data, 1_000)
    assert (row_text, truncated) == (text, False)


def test_bad_bytes_become_replacement_characters() -> None:
    assert output_text(b"a\xffb\x00c") == "a\ufffdbc"
