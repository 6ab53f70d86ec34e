"""Where the interop files written by other tools live: `../shared/interop` beside the
checkout (CI clones main next to `shared/`). In a git worktree the checkout's parent is
not the main checkout's, so the folder beside the main checkout is looked at too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _main_checkout() -> Path | None:
    git = REPO / ".git"
    if not git.is_file():  # a plain clone: .git is a directory
        return None
    gitdir = Path(git.read_text(encoding="utf-8").split(":", 1)[1].strip())
    common = gitdir / "commondir"
    root = (gitdir / common.read_text(encoding="utf-8").strip()) if common.exists() else gitdir
    return root.resolve().parent


def interop_dir() -> Path:
    """`shared/interop`, or a loud skip when it is absent."""
    candidates = [REPO.parent / "shared" / "interop"]
    main = _main_checkout()
    if main is not None:
        candidates.append(main.parent / "shared" / "interop")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    pytest.skip(
        "interop files NOT FOUND (looked in "
        + ", ".join(str(c) for c in candidates)
        + "): the ATIF interop tests are NOT running"
    )


def atif_files() -> list[Path]:
    """The Harbor ATIF files, sorted by name."""
    files = sorted((interop_dir() / "atif").glob("*.json"))
    assert len(files) == 3, files
    return files


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


ATIF_NAMES = [
    "openhands__hello-world.trajectory.json",
    "terminus_2__hello-world-invalid-json.trajectory.json",
    "terminus_2__hello-world-timeout.trajectory.json",
]
"""The files `shared/interop/README.md` lists (parametrisation ids; read with `atif_file`)."""


def atif_file(name: str) -> Path:
    path = interop_dir() / "atif" / name
    assert path.is_file(), f"{path} is listed in shared/interop/README.md but missing"
    return path


def linked_files() -> list[Path]:
    """The Harbor sub-agent and continuation files (`atif-linked/`), sorted by name."""
    files = sorted((interop_dir() / "atif-linked").glob("*.json"))
    assert len(files) == 5, files
    return files
