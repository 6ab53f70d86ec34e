"""`HostSetup`: what every jail of a process is built from (the result of host preparation).

A leaf module: the argv builder (`sandbox/nsjail.py`) reads it, host preparation
(`sandbox/host.py`) makes it, and neither has to import the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

LimitMode = Literal["cgroup_v1", "cgroup_v2", "rlimit"]

JAIL_UID = 1000
JAIL_GID = 1000
EXECUTOR_DIR_IN_JAIL = "/.epiflow"


@dataclass(frozen=True)
class HostSetup:
    """What every jail of this process is built from."""

    nsjail: Path
    """The nsjail binary in use."""
    etc_dir: Path
    """The synthetic `/etc`, mounted read-only."""
    executor: Path
    """The executor (compiled by the jail's own interpreter when possible), mounted read-only."""
    limit_mode: LimitMode
    """How memory and pids are limited: cgroups where the host allows it, rlimits otherwise."""
    cgroup_note: str
    """Why the limit mode is what it is (for logs and the sandbox's description)."""

    @property
    def executor_in_jail(self) -> str:
        """Where the executor appears inside the jail."""
        return f"{EXECUTOR_DIR_IN_JAIL}/executor{self.executor.suffix}"
