"""User suites: a folder with a `suite.yaml`, loaded into a `Suite` with located errors.

    my_suite/
      suite.yaml          name, version, tasks (prompt, files, difficulty, verifier, …)
      files/…             workspace files referenced as `{from: files/…}`
      verifiers/…         verifier scripts, copied into the jail under VERIFIER_DIR

Every malformed field is reported with its file and line (`SuiteFormatError.issues`): the
YAML is composed into nodes first so each pydantic error location maps back to a mark.
User tasks are static: every seed yields the same task (the seed still goes into the
task id). See docs/suites.md for the format.
"""

from __future__ import annotations

import posixpath
import random
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sandbox.tool_specs import BUILTIN_TOOLS
from suites.errors import FormatIssue, SuiteFormatError
from suites.suite import Suite
from suites.template import TaskDraft, TaskTemplate
from suites.types import ReferenceCall, VerifierSpec

SUITE_FILE = "suite.yaml"
"""The file that makes a folder a suite."""
VERIFIER_DIR = "/tmp/epiflow-verifier"
"""In-jail folder the verifier files are copied to (outside the agent's /workspace)."""

_NAME = r"^[a-z0-9][a-z0-9_.-]*$"
_Loc = tuple[str | int, ...]


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

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, value: Any) -> Any:
        # One located error per file instead of pydantic's one-per-union-member noise.
        if isinstance(value, str):
            return {"text": value}
        if isinstance(value, dict):
            extra = sorted(str(k) for k in value if k != "from")
            if extra or not isinstance(value.get("from"), str) or not value["from"]:
                raise ValueError(
                    "a file is inline text or {from: path/in/suite/folder}"
                    + (
                        f"; unknown key(s) {extra}"
                        if extra
                        else "; `from` must be a non-empty string"
                    )
                )
            return {"from_": value["from"]}
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
        problems = tool_args_problems(self.tool, self.args)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class TaskDecl(BaseModel):
    """One task of a user suite (a template with a single, static instance)."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=_NAME)]
    """Template name: lower-case letters, digits, `_`, `-`, `.`."""
    version: str = "1"
    """Task version; bump it when the task or its verifier changes."""
    difficulty: int = Field(ge=1, le=5)
    """1 (a 2-step chore) … 5 (a ~15-step job with traps)."""
    summary: str = ""
    """One line for `epiflow suites list`."""
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


class SuiteDecl(BaseModel):
    """The whole `suite.yaml`."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=_NAME)]
    """Suite name, unique on the suites path; `builtin` is reserved."""
    version: str
    """Suite version."""
    description: str = ""
    """What the suite is about."""
    tasks: list[TaskDecl] = Field(min_length=1)
    """The tasks."""

    _coerce_version = field_validator("version", mode="before")(_version_to_str)


def tool_args_problems(tool: str, args: dict[str, Any]) -> list[str]:
    """What is wrong with `args` for `tool` under its JSON schema (the subset the tools use)."""
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


def load_user_suite(folder: Path) -> Suite:
    """Load the suite in `folder` (which holds `suite.yaml`).

    Raises:
        SuiteFormatError: the file is missing, not YAML, or any field is malformed; every
            problem found is listed with file, line and field.
    """
    path = folder / SUITE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SuiteFormatError([_issue(path, None, "<file>", f"cannot read: {e}")]) from e
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        issue = _issue(path, mark, "<file>", f"not valid YAML: {e.problem or e}")
        raise SuiteFormatError([issue]) from e
    except yaml.YAMLError as e:
        raise SuiteFormatError([_issue(path, None, "<file>", f"not valid YAML: {e}")]) from e
    if not isinstance(data, dict) or root is None:
        found = "an empty file" if data is None else type(data).__name__
        raise SuiteFormatError(
            [
                _issue(
                    path,
                    root.start_mark if root else None,
                    "<file>",
                    f"expected a mapping with name, version and tasks, got {found}",
                )
            ]
        )
    try:
        decl = SuiteDecl.model_validate(data)
    except ValidationError as e:
        raise SuiteFormatError(
            [
                _issue(
                    path,
                    _mark_for(root, tuple(err["loc"])),
                    _dotted(tuple(err["loc"])),
                    _message(err),
                )
                for err in e.errors()
            ]
        ) from e
    problems = _folder_problems(folder, decl)
    if problems:
        raise SuiteFormatError(
            [_issue(path, _mark_for(root, loc), _dotted(loc), msg) for loc, msg in problems]
        )
    return Suite(
        decl.name,
        decl.version,
        [_template(folder, task) for task in decl.tasks],
        description=decl.description,
        source=folder,
    )


def _folder_problems(folder: Path, decl: SuiteDecl) -> list[tuple[_Loc, str]]:
    """Problems only the suite folder can reveal: names, paths, referenced files."""
    problems: list[tuple[_Loc, str]] = []
    if decl.name == "builtin":
        problems.append((("name",), "`builtin` is reserved for the built-in suite"))
    seen: dict[str, int] = {}
    for i, task in enumerate(decl.tasks):
        if task.name in seen:
            problems.append(
                (
                    ("tasks", i, "name"),
                    f"duplicate task name {task.name!r} (also tasks[{seen[task.name]}])",
                )
            )
        seen.setdefault(task.name, i)
        for rel, source in task.files.items():
            loc: _Loc = ("tasks", i, "files", rel)
            if not _is_clean_relative(rel):
                problems.append((loc, f"workspace path {rel!r} must be relative, without `..`"))
            if source.from_ is not None:
                problems += [
                    ((*loc, "from"), msg) for msg in _suite_file_problems(folder, source.from_)
                ]
        for j, name in enumerate(task.verifier.files):
            problems += [
                (("tasks", i, "verifier", "files", j), msg)
                for msg in _suite_file_problems(folder, name)
            ]
    return problems


def _suite_file_problems(folder: Path, rel: str) -> list[str]:
    if not _is_clean_relative(rel):
        return [f"{rel!r} must be a path relative to the suite folder, without `..`"]
    if not (folder / rel).is_file():
        return [f"{rel!r} does not exist in {folder}"]
    try:
        (folder / rel).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return [f"{rel!r} is not UTF-8 text"]
    return []


def _is_clean_relative(path: str) -> bool:
    norm = posixpath.normpath(path)
    return (
        bool(path)
        and not path.startswith("/")
        and norm != "."
        and not norm.startswith("..")
        and "\\" not in path
    )


def _template(folder: Path, task: TaskDecl) -> TaskTemplate:
    files = {
        rel: (folder / src.from_).read_text(encoding="utf-8")
        if src.from_ is not None
        else str(src.text)
        for rel, src in task.files.items()
    }
    decl = task.verifier
    verifier = VerifierSpec(
        argv=list(decl.argv) if decl.argv is not None else ["/bin/sh", "-c", str(decl.command)],
        files={
            posixpath.join(VERIFIER_DIR, rel): (folder / rel).read_text(encoding="utf-8")
            for rel in decl.files
        },
        timeout_s=decl.timeout_s,
    )
    draft = TaskDraft(
        prompt=task.prompt,
        files=files,
        reference_solution=[
            ReferenceCall(tool=c.tool, args=c.args) for c in task.reference_solution
        ],
        reference_final=task.reference_final,
        verifier=verifier,
    )

    def build(rng: random.Random) -> TaskDraft:
        del rng  # user tasks are static: every seed gives the same draft
        return draft

    return TaskTemplate(
        name=task.name,
        version=task.version,
        difficulty=task.difficulty,
        summary=task.summary or task.prompt.strip().splitlines()[0][:80],
        build=build,
    )


def _mark_for(root: yaml.Node, loc: _Loc) -> yaml.Mark:
    """The mark of the deepest node `loc` reaches (a missing key points at its mapping)."""
    node = root
    for depth, part in enumerate(loc, start=1):
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key: yaml.Node = key_node
                if key.value == part:
                    if depth == len(loc):
                        # Point at the key: a block value starts on a later line.
                        return key.start_mark
                    node = value_node
                    break
            else:
                return node.start_mark
        elif (
            isinstance(node, yaml.SequenceNode)
            and isinstance(part, int)
            and 0 <= part < len(node.value)
        ):
            node = node.value[part]
        else:
            return node.start_mark
    return node.start_mark


def _dotted(loc: _Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "<file>"


def _message(err: Any) -> str:
    kind = err.get("type", "")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field (check the spelling; see docs/suites.md)"
    if kind == "string_pattern_mismatch":
        msg = "must be lower-case letters, digits, '_', '-' or '.', starting with a letter or digit"
    else:
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    value = err.get("input")
    if isinstance(value, str | int | float | bool) and kind not in {
        "value_error",
        "assertion_error",
    }:
        msg += f" (got {value!r})"
    return msg


def _issue(path: Path, mark: yaml.Mark | None, field: str, message: str) -> FormatIssue:
    return FormatIssue(
        file=path,
        line=mark.line + 1 if mark is not None else None,
        column=mark.column + 1 if mark is not None else None,
        field=field,
        message=message,
    )
