"""`SandboxSpec`: what one episode jail looks like, validated and hashable.

The spec is part of an episode's identity (seed 000 §3.4: the environment version goes
into the metadata), so `spec_hash()` is a sha256 of its canonical JSON and never depends
on field order, the host, or the Python version.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandbox.image_spec import ImageMount

NetworkMode = Literal["none", "loopback"]

_ENV_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
#: Memory that must stay free of the two tmpfs mounts so the jail's processes can still run.
MIN_PROCESS_MEMORY_MIB = 128


class SandboxSpec(BaseModel):
    """Resources, limits and timeouts of one episode jail (defaults follow seed 003 §5)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    cpus: int = Field(default=2, ge=1, le=256)
    """CPUs the jail may use (CPU affinity of its processes)."""
    memory_mib: int = Field(default=4096, ge=64)
    """Memory of the whole jail, MiB (cgroup limit, or per-process address space without cgroups)."""
    pids: int = Field(default=256, ge=8)
    """Most processes and threads alive in the jail at once."""
    tmpfs_mib: int = Field(default=256, ge=1)
    """Size of the jail's `/tmp` (tmpfs), MiB."""
    workspace_mib: int = Field(default=512, ge=1)
    """Size of the writable `/workspace` (tmpfs), MiB; also the largest file a command may write."""
    inodes: int = Field(default=65536, ge=64)
    """Most files (inodes) in each of `/tmp` and `/workspace`."""
    network: NetworkMode = "none"
    """`none`: no interface at all; `loopback`: the jail's own `lo` only. Never the host's."""
    call_timeout_s: float = Field(default=30.0, gt=0)
    """Timeout of one tool call when the call names none, seconds."""
    max_call_timeout_s: float = Field(default=300.0, gt=0)
    """Largest timeout a tool call may ask for, seconds."""
    soft_timeout_s: float = Field(default=480.0, gt=0)
    """Episode age after which every observation warns the agent to wrap up, seconds."""
    hard_timeout_s: float = Field(default=600.0, gt=0)
    """Episode age at which the jail is killed and the episode ends as `timeout`, seconds."""
    output_cap_bytes: int = Field(default=1 << 20, ge=1024)
    """Bytes kept of each of stdout and stderr per call (and of a file read); the rest is dropped."""
    env_allow: tuple[str, ...] = ()
    """Names of host environment variables passed into the jail; nothing else of the host's passes."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables set in the jail (after the allow-listed ones)."""
    kill_background: bool = True
    """Kill every process a command left behind when its call returns (no daemon outlives a call)."""
    image: ImageMount | None = None
    """Chroot into this prebuilt root filesystem (a Harbor task's environment) instead of the
    host toolchain; None (the default) for the toolchain jail. Left out of the canonical JSON
    when None, so the hashes of toolchain specs do not change."""

    @field_validator("env_allow")
    @classmethod
    def _env_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not name or not set(name) <= _ENV_NAME_CHARS:
                raise ValueError(f"env_allow names must be [A-Za-z0-9_]+, got {name!r}")
        return tuple(sorted(set(names)))

    @field_validator("env")
    @classmethod
    def _env_values(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not name or not set(name) <= _ENV_NAME_CHARS:
                raise ValueError(f"env names must be [A-Za-z0-9_]+, got {name!r}")
            if "\x00" in value:
                raise ValueError(f"env value of {name} contains a NUL byte")
        return env

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.soft_timeout_s >= self.hard_timeout_s:
            raise ValueError(
                f"soft_timeout_s ({self.soft_timeout_s}) must be below hard_timeout_s "
                f"({self.hard_timeout_s})"
            )
        if self.call_timeout_s > self.max_call_timeout_s:
            raise ValueError(
                f"call_timeout_s ({self.call_timeout_s}) must not exceed max_call_timeout_s "
                f"({self.max_call_timeout_s})"
            )
        # Both tmpfs mounts are charged to the jail's memory; if they could fill it, the
        # OOM killer would have nothing to kill but the executor.
        if self.tmpfs_mib + self.workspace_mib + MIN_PROCESS_MEMORY_MIB > self.memory_mib:
            raise ValueError(
                f"tmpfs_mib + workspace_mib ({self.tmpfs_mib} + {self.workspace_mib} MiB) must "
                f"leave at least {MIN_PROCESS_MEMORY_MIB} MiB of memory_mib ({self.memory_mib} MiB)"
            )
        return self

    def __hash__(self) -> int:
        return hash(self.canonical_json())

    def canonical_json(self) -> str:
        """The spec as canonical JSON (sorted keys, no whitespace)."""
        data = self.model_dump(mode="json")
        if data.get("image") is None:
            data.pop("image", None)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def spec_hash(self) -> str:
        """sha256 of the canonical JSON: equal specs hash equal on every host."""
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    def call_timeout(self, requested: float | None) -> float:
        """The timeout a call actually gets: the default, or the request clamped to the spec."""
        if requested is None:
            return self.call_timeout_s
        return min(max(float(requested), 0.001), self.max_call_timeout_s)
