"""Scratch directories that do not outlive their process, even a killed one.

`scratch_dir(prefix)` is a `tempfile.TemporaryDirectory` (removed on any exit Python
sees: return, error, cancellation, Ctrl-C) that records its owner (`core.owner`: host name, pid and
the process's start time) in `.owner`. A process killed with SIGKILL, or lost with its
machine, cannot remove its directory; the next `scratch_dir` of the same prefix on the
same host removes every sibling whose owner is gone (`sweep_scratch`). Training copies
models into these directories, so a few killed runs would otherwise fill the disk.

Pure standard library and `core.owner` (who the owner is, whether it is gone).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.owner import owner_gone, this_process

OWNER_FILE = ".owner"


def _owner_gone(directory: Path) -> bool:
    """True when `directory`'s owner ran on this host and is no longer running. A
    directory without a readable owner (being created, or not ours) is left alone."""
    try:
        owner = (directory / OWNER_FILE).read_text()
    except OSError:
        return False
    return owner_gone(owner)


def sweep_scratch(prefix: str, root: Path | None = None) -> list[Path]:
    """Remove the `prefix*` directories under `root` (default: the temp directory) whose
    owner process is gone; returns those removed."""
    base = Path(root or tempfile.gettempdir())
    removed: list[Path] = []
    for directory in sorted(base.glob(f"{prefix}*")):
        if directory.is_dir() and not directory.is_symlink() and _owner_gone(directory):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


@contextmanager
def scratch_dir(prefix: str, root: Path | None = None) -> Iterator[Path]:
    """A fresh directory `root/prefix…`, removed when the block exits; first sweeps the
    leftovers of killed owners of the same prefix."""
    sweep_scratch(prefix, root)
    with tempfile.TemporaryDirectory(prefix=prefix, dir=root) as tmp:
        path = Path(tmp)
        (path / OWNER_FILE).write_text(this_process() + "\n")
        yield path
