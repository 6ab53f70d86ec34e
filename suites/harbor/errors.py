"""Errors of Harbor task directories: each one line naming the file and the field or line."""

from __future__ import annotations

from pathlib import Path

from suites.errors import SuiteError


class HarborTaskError(SuiteError):
    """A Harbor task directory is malformed: `file: field: what is wrong`."""

    def __init__(self, file: Path, field: str, message: str) -> None:
        self.file = file
        self.field = field
        super().__init__(f"{file}: {field}: {message}", setting=str(file))


class UnsupportedEnvironment(HarborTaskError):
    """The task's Dockerfile asks for what cannot be built here (names the Dockerfile line)."""

    def __init__(self, file: Path, line: int | None, instruction: str, message: str) -> None:
        where = f"line {line}" if line is not None else "<file>"
        super().__init__(file, where, f"{instruction}: {message}")
        self.line = line
