"""Suite errors.

    SuiteError
    ├── SuiteNotFound           no built-in or user suite has that name
    ├── TemplateNotFound        the suite has no template of that name
    ├── SuiteFormatError        a user `suite.yaml` is malformed (every issue with file and line)
    ├── SuiteConflict           two suite folders declare the same name
    ├── SeedRangeError          a training seed reaches into the held-out range
    └── GeneratorError          a user template's generator module failed for a seed (in its jail)

A verifier that crashes or prints garbage is *not* an exception: it is a
`VerifierOutcome` with `error=True` and score 0 (see `tasks.verify`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from core.errors import EpiflowError


class SuiteError(EpiflowError):
    """Base class of every suite failure (each is in the suite or its name: not retried)."""

    retryable = False


class SuiteNotFound(SuiteError):
    """No suite of the requested name is built in or found on the suites path."""


class TemplateNotFound(SuiteError):
    """The suite has no template of the requested name."""


class SuiteConflict(SuiteError):
    """Two suite folders declare the same suite name."""


class SeedRangeError(SuiteError):
    """Training instances asked for seeds that overlap the held-out evaluation range."""


class GeneratorError(SuiteError):
    """A user template's generator script failed, timed out or printed invalid output."""

    def __init__(
        self,
        message: str,
        *,
        setting: str | None = None,
        template: str,
        seed: int,
        exit_code: int | None = None,
        stderr: str = "",
    ) -> None:
        super().__init__(message, setting=setting)
        self.template = template
        self.seed = seed
        self.exit_code = exit_code
        self.stderr = stderr
        """The tail of the script's stderr (a traceback, usually)."""


class FormatIssue(BaseModel):
    """One problem in a `suite.yaml`, located in the file."""

    model_config = ConfigDict(frozen=True)

    file: Path
    """The file the problem is in."""
    line: int | None
    """1-based line of the offending node; None when the file could not be parsed that far."""
    column: int | None
    """1-based column of the offending node."""
    field: str
    """Dotted path of the field, e.g. `tasks[2].verifier.command`; `<file>` for the whole file."""
    message: str
    """What is wrong and what is expected."""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line else f"{self.file}"
        return f"{where}: {self.field}: {self.message}"


class SuiteFormatError(SuiteError):
    """A user suite folder is malformed; `issues` lists every problem found, with file and line."""

    def __init__(self, issues: list[FormatIssue]) -> None:
        self.issues = issues
        lines = "\n".join(f"  {issue}" for issue in issues)
        super().__init__(f"invalid suite ({len(issues)} problem(s)):\n{lines}")
