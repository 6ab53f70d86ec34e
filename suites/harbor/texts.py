"""A task folder's text files, read for the up-front scans (`network.py`, `privilege.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

TEXT_CAP = 1 << 20
"""Bytes past which a file is not scanned (a data blob, not a script)."""


def folder_texts(
    folder: Path, suffixes: frozenset[str] | None = None
) -> Iterator[tuple[Path, str]]:
    """(path, text) of each UTF-8 file under `folder` (sorted; of `suffixes` only, when
    given), files over `TEXT_CAP` or unreadable left out."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if suffixes is not None and path.suffix not in suffixes:
            continue
        if path.stat().st_size > TEXT_CAP:
            continue
        try:
            yield path, path.read_text(encoding="utf-8")
        except (UnicodeError, OSError):
            continue
