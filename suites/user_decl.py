"""The `suite.yaml` schema: pydantic declarations a user suite is validated against.

`suites.user_suite` maps every validation error back to a file and line; this module only
says what is valid. See docs/suites.md for the format.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandbox.tool_specs import BUILTIN_TOOLS
from suites.params import ParamDecl

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]*$"
"""Suite and task names."""
TEMPLATE_OPEN = "{{"
"""Start of a template expression (see `suites.expressions`)."""


def _version_to_str(value: Any) -> Any:
    # `version: 1` is an int in YAML; accept numbers but keep the version a string.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


class FileSource(BaseModel):
    """A workspace file: inline text (a YAML string) or `{from: path/in/suite/folder}`."""

    model_config = ConfigDict(frozen=True)

    text: str | None = None
    """Inline content."""
    from_: str | None = None
    """Path relative to the suite folder whose content is used."""
    render: bool = False
    """For `from` files of a task with parameters: render `{{ … }}` in the file's content
    (inline text of such a task is always rendered)."""

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, value: Any) -> Any:
        # One located error per file instead of pydantic's one-per-union-member noise.
        if isinstance(value, str):
            return {"text": value}
        if isinstance(value, dict):
            extra = sorted(str(k) for k in value if k not in ("from", "render"))
            problem = (
                f"; unknown key(s) {extra}"
                if extra
                else "; `from` must be a non-empty string"
                if not isinstance(value.get("from"), str) or not value["from"]
                else "; `render` must be true or false"
                if not isinstance(value.get("render", False), bool)
                else ""
            )
            if problem:
                raise ValueError(
                    "a file is inline text or {from: path/in/suite/folder, render: false}" + problem
                )
            return {"from_": value["from"], "render": value.get("render", False)}
        raise ValueError(
            f"a file is inline text or {{from: path/in/suite/folder}}, got {type(value).__name__}"
        )


class VerifierDecl(BaseModel):
    """How a user task is verified: a command run inside the jail, in /workspace."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(default=None, min_length=1)
    """Shell command (`/bin/sh -c`) printing `{"score": …, "reason": …}` as its last line."""
    argv: list[str] | None = Field(default=None, min_length=1)
    """Alternative to `command`: the argv to run, without a shell."""
    files: list[str] = Field(default_factory=list)
    """Suite-folder paths copied to `VERIFIER_DIR/<same path>` before the command runs."""
    timeout_s: float = Field(default=30.0, gt=0, le=300)
    """Timeout of the verifier command, seconds."""

    @model_validator(mode="after")
    def _one_command(self) -> VerifierDecl:
        if (self.command is None) == (self.argv is None):
            raise ValueError("give exactly one of `command` (a shell string) or `argv` (a list)")
        return self


class ReferenceCallDecl(BaseModel):
    """One tool call of the reference solution."""

    model_config = ConfigDict(extra="forbid")

    tool: Literal["execute_shell", "read_file", "write_file", "list_dir"]
    """One of the four built-in tools."""
    args: dict[str, Any]
    """Arguments, matching the tool's JSON schema (sandbox/tool_specs.py)."""

    @model_validator(mode="after")
    def _args_match_schema(self) -> ReferenceCallDecl:
        # A `{{ … }}` value is typed once rendered: the loader checks it then.
        problems = tool_args_problems(self.tool, self.args, deferred_templates=True)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class GeneratorDecl(BaseModel):
    """A Python script that turns a seed into parameters and files, run in a jail per seed."""

    model_config = ConfigDict(extra="forbid")

    script: str = Field(min_length=1)
    """Suite-folder path of the script (run as `python3 -I <script>` in the generation jail)."""
    provides: list[str] = Field(default_factory=list)
    """Parameter names the script returns (exactly these), usable in `{{ … }}`."""
    files: list[str] = Field(default_factory=list)
    """Suite-folder paths of data files the script reads (at the same path in its /workspace)."""
    timeout_s: float = Field(default=30.0, gt=0, le=300)
    """Timeout of one run of the script, seconds."""


class TaskDecl(BaseModel):
    """One task of a user suite: static, or generated from seeded `params` and a `generator`."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    """Template name: lower-case letters, digits, `_`, `-`, `.`."""
    version: str = "1"
    """Task version; bump it when the task, its parameters or its verifier change."""
    difficulty: int = Field(ge=1, le=5)
    """1 (a 2-step chore) … 5 (a ~15-step job with traps)."""
    summary: str = ""
    """One line for `epiflow suites list`."""
    params: dict[str, ParamDecl] = Field(default_factory=dict)
    """Seeded parameters, drawn in this order (see `suites.params`)."""
    generator: GeneratorDecl | None = None
    """A generator script run in a jail per seed (see `suites.generator`)."""
    prompt: str = Field(min_length=1)
    """The task as the agent sees it."""
    files: dict[str, FileSource] = Field(default_factory=dict)
    """Workspace path → inline text, or `{from: path/in/suite}`."""
    reference_solution: list[ReferenceCallDecl] = Field(default_factory=list)
    """Tool calls that solve the task (the oracle replays them)."""
    reference_final: str = "Done."
    """The oracle's `<final>` text."""
    verifier: VerifierDecl
    """How the outcome is checked."""

    _coerce_version = field_validator("version", mode="before")(_version_to_str)

    @property
    def generated(self) -> bool:
        """True when instances depend on the seed (parameters or a generator)."""
        return bool(self.params) or self.generator is not None


class SuiteDecl(BaseModel):
    """The whole `suite.yaml`."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    """Suite name, unique on the suites path; `builtin` is reserved."""
    version: str
    """Suite version."""
    description: str = ""
    """What the suite is about."""
    tasks: list[TaskDecl] = Field(min_length=1)
    """The tasks."""

    _coerce_version = field_validator("version", mode="before")(_version_to_str)


def tool_args_problems(
    tool: str, args: dict[str, Any], *, deferred_templates: bool = False
) -> list[str]:
    """What is wrong with `args` for `tool` under its JSON schema (the subset the tools use).

    With `deferred_templates`, a string holding `{{` passes the type check (it is checked
    again once rendered).
    """
    schema = BUILTIN_TOOLS[tool].parameters
    props: dict[str, Any] = schema.get("properties", {})
    problems = [
        f"missing argument {k!r} for {tool}" for k in schema.get("required", []) if k not in args
    ]
    for key, value in args.items():
        if key not in props:
            problems.append(
                f"unknown argument {key!r} for {tool} (expected one of {sorted(props)})"
            )
            continue
        if deferred_templates and isinstance(value, str) and TEMPLATE_OPEN in value:
            continue
        want = props[key].get("type")
        if want == "string" and not isinstance(value, str):
            problems.append(
                f"argument {key!r} of {tool} must be a string, got {type(value).__name__}"
            )
        if want == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
            problems.append(
                f"argument {key!r} of {tool} must be an integer, got {type(value).__name__}"
            )
    return problems
