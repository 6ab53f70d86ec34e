"""Errors of Harbor task directories: each one line naming the file and the field or line,
and the category of refusal it belongs to.

    SuiteError
    └── HarborTaskError            a task cannot run here: `file: field: what is wrong`
        └── UnsupportedEnvironment the Dockerfile asks for what cannot be built here (its line)

Every such error carries a `RefusalCategory`: loading a dataset turns each one into a
`RefusedTask` (the task is left out, listed in one line), never into an exception for the
dataset (`suites/harbor/suite.py`), unless strict mode asks for all or nothing.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from suites.errors import SuiteError


class RefusalCategory(StrEnum):
    """Why a Harbor task is refused at load (the one list; documented in docs/harbor.md)."""

    BASE_IMAGE = "base-image"
    """The base image cannot be built here (alpine, CUDA, an unknown or unserved base, a
    second image of a multi-stage build)."""
    MULTI_CONTAINER = "multi-container"
    """The environment is a docker-compose file (several containers)."""
    NETWORK_BUILD = "network-build"
    """A build step fetches from the internet beyond the package registries (`git clone`,
    `curl`/`wget` of a URL, an installer script, `ADD <url>`)."""
    NETWORK_AGENT = "network-agent"
    """The task declares that the agent needs the internet (`allowed_hosts`, a remote MCP
    server, or a reference solution that downloads); epiflow's jails have no network."""
    NETWORK_VERIFIER = "network-verifier"
    """The verifier fetches from the internet at verify time (a URL its scripts download),
    beyond what the offline toolkit provisions ahead."""
    NEEDS_ROOT = "needs-root"
    """The reference solution needs root (`useradd`, `chown` to another user, starting
    `sshd` or a `service`) and Harbor's verifier expects what it did in the same container;
    epiflow's agent is an unprivileged user in a read-only image (`suites.harbor.privilege`)."""
    MALFORMED = "malformed"
    """A missing or unreadable file, a malformed `task.toml` field or Dockerfile line."""


class HarborTaskError(SuiteError):
    """A Harbor task directory cannot run here: `file: field: what is wrong`."""

    def __init__(
        self,
        file: Path,
        field: str,
        message: str,
        *,
        category: RefusalCategory = RefusalCategory.MALFORMED,
        line: int | None = None,
    ) -> None:
        self.file = file
        self.field = field
        self.category = category
        self.line = line
        """The line of `file` at fault, when one is."""
        super().__init__(f"{file}: {field}: {message}", setting=str(file))


class UnsupportedEnvironment(HarborTaskError):
    """The task's Dockerfile asks for what cannot be built here (names the Dockerfile line)."""

    def __init__(
        self,
        file: Path,
        line: int | None,
        instruction: str,
        message: str,
        *,
        category: RefusalCategory = RefusalCategory.MALFORMED,
    ) -> None:
        where = f"line {line}" if line is not None else "<file>"
        super().__init__(file, where, f"{instruction}: {message}", category=category, line=line)


class RefusedTask(BaseModel):
    """A task of a dataset that was left out at load, and why (one line)."""

    model_config = ConfigDict(frozen=True)

    task: Path
    """The task directory."""
    category: RefusalCategory
    """Why, as a documented category."""
    file: Path
    """The file at fault (`task.toml`, the Dockerfile, `solution/solve.sh`, …)."""
    line: int | None = None
    """Its line at fault, when one is."""
    message: str
    """`file: field or line: what is wrong`."""

    @classmethod
    def from_error(cls, task: Path, error: HarborTaskError) -> RefusedTask:
        return cls(
            task=task,
            category=error.category,
            file=error.file,
            line=error.line,
            message=str(error),
        )

    def __str__(self) -> str:
        return f"{self.category}: {self.message}"
