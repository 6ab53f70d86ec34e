"""Moving files between host directories and a jail's workspace, safely.

Into the jail: `files_from_dir` reads a host directory (regular files only, symlinks
skipped, size-capped) into the `files` mapping `open_sandbox` takes. Out of the jail:
`write_export` writes what the executor exported under a host directory, opening every
path component relative to its parent with `O_NOFOLLOW`, so neither a hostile name nor a
symlink planted on the host side can make it write outside that directory. What is not
file bytes (permission bits, folders, symlinks) travels beside them as a `WorkdirShape`:
never written on the host, only given back to a jail (`NsjailSandbox.populate`).
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, Field

from sandbox.errors import TransferError

__all__ = [
    "ExportReport",
    "TransferError",
    "WorkdirShape",
    "files_from_dir",
    "normalize_files",
    "readable",
    "safe_relative",
    "shape_from_dir",
    "write_export",
]


class WorkdirShape(BaseModel):
    """What of a workspace is not file bytes: what `files` mappings leave out and a task's
    verifier may look at (a key's mode, an executable, git's empty `refs/` folders, a link)."""

    modes: dict[str, int] = Field(default_factory=dict)
    """Permission bits of the files whose bits are not 0o644, by relative path."""
    dirs: dict[str, int] = Field(default_factory=dict)
    """Every folder (empty ones too), by relative path → its permission bits."""
    symlinks: dict[str, str] = Field(default_factory=dict)
    """Symbolic links by relative path → their target, as written (never followed)."""

    def is_empty(self) -> bool:
        return not (self.modes or self.dirs or self.symlinks)


def readable(shape: WorkdirShape) -> WorkdirShape:
    """`shape` with the owner's read bit on every file and read and search bits on every
    folder: a verifier that is not root must read what a root verifier reads regardless."""
    return shape.model_copy(
        update={
            "modes": {p: m | 0o400 for p, m in shape.modes.items()},
            "dirs": {p: m | 0o500 for p, m in shape.dirs.items()},
        }
    )


def shape_from_dir(root: Path, *, limit: int) -> WorkdirShape:
    """The shape of host directory `root` (symlinks recorded, never followed), at most
    `limit` entries of each kind."""
    shape = WorkdirShape()
    if not root.is_dir() or root.is_symlink():
        return shape
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        top = Path(dirpath)
        for name in [*dirnames, *filenames]:
            path = top / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            bits = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode) and len(shape.symlinks) < limit:
                shape.symlinks[rel] = str(path.readlink())
            elif stat.S_ISDIR(st.st_mode) and len(shape.dirs) < limit:
                shape.dirs[rel] = bits & 0o1777
            elif stat.S_ISREG(st.st_mode) and bits & 0o777 != 0o644 and len(shape.modes) < limit:
                shape.modes[rel] = bits & 0o777
        dirnames[:] = [d for d in dirnames if not (top / d).is_symlink()]
    return shape


class ExportReport(BaseModel):
    """What an export copied out of a workspace."""

    files: list[str] = Field(default_factory=list)
    """Workspace-relative paths written under the export directory."""
    bytes: int = 0
    """Total bytes written."""
    skipped: dict[str, str] = Field(default_factory=dict)
    """Workspace files not exported, with the reason (`over_size_cap`, `unsafe_path`, …)."""
    truncated: bool = False
    """True when the size cap or the file-count cap left files out."""
    left_out: int = 0
    """Workspace files past the file-count cap (`max_tracked_files`), neither exported nor
    listed in `skipped`."""
    shape: WorkdirShape = Field(default_factory=WorkdirShape)
    """The exported part's permission bits, folders and symlinks (`files` holds bytes only)."""


def safe_relative(path: str) -> PurePosixPath:
    """`path` as a workspace-relative path, or TransferError when it could leave the workspace."""
    if not path or "\x00" in path or path.startswith("/"):
        raise TransferError(f"unsafe workspace path {path!r}")
    rel = PurePosixPath(path)
    if any(part in ("", ".", "..") for part in rel.parts) or not rel.parts:
        raise TransferError(f"unsafe workspace path {path!r}")
    return rel


def normalize_files(files: Mapping[str, str | bytes], *, max_bytes: int) -> dict[str, str]:
    """`files` (workspace-relative path → content) as base64 for the executor, validated."""
    out: dict[str, str] = {}
    total = 0
    for path, content in files.items():
        rel = path[len("/workspace/") :] if path.startswith("/workspace/") else path
        safe_relative(rel)
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        total += len(data)
        if total > max_bytes:
            raise TransferError(f"workspace files exceed {max_bytes} bytes")
        out[rel] = base64.b64encode(data).decode("ascii")
    return out


def files_from_dir(root: Path, *, max_bytes: int) -> dict[str, bytes]:
    """Regular files under `root` by relative path; symlinks and special files are skipped."""
    if not root.is_dir():
        raise TransferError(f"workspace source {root} is not a directory")
    files: dict[str, bytes] = {}
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            full = Path(dirpath) / name
            st = full.lstat()
            if not stat.S_ISREG(st.st_mode):
                continue
            total += st.st_size
            if total > max_bytes:
                raise TransferError(f"{root} holds more than {max_bytes} bytes")
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                files[full.relative_to(root).as_posix()] = f.read()
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    return files


def _open_dir(parent_fd: int, name: str) -> int:
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    except FileExistsError:
        pass
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)


def write_export(answer: Mapping[str, Any], dest: Path) -> ExportReport:
    """Write the executor's `export` answer under `dest` (created if missing)."""
    dest.mkdir(parents=True, exist_ok=True)
    report = ExportReport(
        truncated=bool(answer.get("walk_truncated")), left_out=int(answer.get("left_out", 0))
    )
    for item in answer.get("skipped", []):
        report.skipped[str(item["path"])] = str(item["reason"])
        report.truncated = report.truncated or item["reason"] == "over_size_cap"
    for key, kind in (("dirs", int), ("symlinks", str)):
        for path, value in (answer.get(key) or {}).items():
            try:
                safe_relative(str(path))
            except TransferError:
                report.skipped[str(path)] = "unsafe_path"
                continue
            getattr(report.shape, key)[str(path)] = kind(value)
    root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for item in answer.get("files", []):
            path = str(item["path"])
            try:
                rel = safe_relative(path)
            except TransferError:
                report.skipped[path] = "unsafe_path"
                continue
            data = base64.b64decode(item["data"])
            fds = [root_fd]
            try:
                for part in rel.parts[:-1]:
                    fds.append(_open_dir(fds[-1], part))
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                fd = os.open(rel.parts[-1], flags, 0o644, dir_fd=fds[-1])
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except OSError as e:
                report.skipped[path] = f"host_error: {e.strerror}"
                continue
            finally:
                for fd in fds[1:]:
                    os.close(fd)
            report.files.append(path)
            report.bytes += len(data)
            mode = int(item.get("mode", 0o644)) & 0o777
            if mode != 0o644:
                report.shape.modes[path] = mode
    finally:
        os.close(root_fd)
    return report
