"""`ImageMount`: a jail chrooted into a prebuilt root filesystem instead of the host toolchain.

Pure data, part of `SandboxSpec` (so it is part of `spec_hash()`): the image directory on
the host (read-only in the jail), its content digest, the task's workdir (a per-episode
tmpfs the tools are rooted at, seeded from the image's own copy), the image's `ENV`, and
extra read-only binds (the verifier jail's `/tests` and offline toolkit) and tmpfs mounts.
"""

from __future__ import annotations

import posixpath

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ImageMount(BaseModel):
    """Where an image jail's root, workdir and extra mounts come from."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    root: str
    """Host directory of the image's root filesystem (mounted read-only as `/`)."""
    digest: str = Field(min_length=8)
    """Content digest of the image (Dockerfile + build context + base), recorded per episode."""
    workdir: str = "/app"
    """The task's working directory: a per-episode writable tmpfs, the tools' root and cwd."""
    python: str = "/usr/bin/python3"
    """The image's interpreter that runs the jail's executor."""
    env: dict[str, str] = Field(default_factory=dict)
    """The image's environment (`ENV`), set before the spec's own variables."""
    writable: tuple[str, ...] = ("/tmp", "/root", "/var/tmp", "/run", "/solution")
    """Further writable tmpfs mounts (each `tmpfs_mib` big); they must exist in the image
    (`sandbox.images.MOUNT_DIRS`). `/solution` is where Harbor's oracle puts a task's
    `solution/` (and where some reference solutions read their files from)."""
    binds_ro: tuple[tuple[str, str], ...] = ()
    """(host path, jail path) pairs bound read-only, e.g. a verifier's `/tests`."""

    @field_validator("workdir", "python")
    @classmethod
    def _absolute(cls, path: str) -> str:
        norm = posixpath.normpath(path)
        if not norm.startswith("/") or norm == "/":
            raise ValueError(f"must be an absolute path below /, got {path!r}")
        return norm
