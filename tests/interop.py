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


def _candidates() -> list[Path]:
    candidates = [REPO.parent / "shared" / "interop"]
    main = _main_checkout()
    if main is not None:
        candidates.append(main.parent / "shared" / "interop")
    return candidates


def find_interop_dir() -> Path | None:
    """`shared/interop`, or None when it is absent (for a `skipif`)."""
    return next((c for c in _candidates() if c.is_dir()), None)


HARBOR_TASKS = (find_interop_dir() or Path("shared-interop-not-found")) / "harbor-tasks"
"""`shared/interop/harbor-tasks` (absent without ../shared: use it behind a `skipif`)."""


def interop_dir() -> Path:
    """`shared/interop`, or a loud skip when it is absent (call it inside a test)."""
    candidates = _candidates()
    found = find_interop_dir()
    if found is not None:
        return found
    pytest.skip(
        "interop files NOT FOUND (looked in "
        + ", ".join(str(c) for c in candidates)
        + "): the tests that read them are NOT running"
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


LINKED_NAMES = [
    "terminus_2__hello-world-context-summarization-linear-history.trajectory.cont-1.json",
    "terminus_2__hello-world-context-summarization-linear-history.trajectory.json",
    "terminus_2__hello-world-context-summarization.trajectory.json",
    "terminus_2__hello-world-context-summarization.trajectory.summarization-1-questions.json",
    "terminus_2__hello-world-context-summarization.trajectory.summarization-1-summary.json",
]
"""The Harbor sub-agent and continuation files (`atif-linked/`), sorted: names, so a
module can parametrise over them at collection without the folder (read with
`linked_file`, which skips loudly when it is absent)."""


def linked_file(name: str) -> Path:
    path = interop_dir() / "atif-linked" / name
    assert path.is_file(), f"{path} is listed in tests/interop.py LINKED_NAMES but missing"
    return path


def linked_files() -> list[Path]:
    """The Harbor sub-agent and continuation files (`atif-linked/`), sorted by name
    (inside a test: skips loudly without the folder)."""
    files = sorted((interop_dir() / "atif-linked").glob("*.json"))
    assert [f.name for f in files] == LINKED_NAMES, files
    return files
