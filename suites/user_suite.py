"""User suites: a folder with a `suite.yaml`, loaded into a `Suite` with located errors.

    my_suite/
      suite.yaml          name, version, tasks (params, generator, prompt, files, verifier, …)
      files/…             workspace files referenced as `{from: files/…}`
      verifiers/…         verifier scripts, copied into the jail under VERIFIER_DIR
      generators/…        generator scripts (and their data), run in a jail per seed

Every malformed field is reported with its file and line (`SuiteFormatError.issues`): the
YAML is composed into nodes first so each pydantic error location maps back to a mark.
A task without `params` or `generator` is static: every seed yields the same task (the
seed still goes into the task id); a generated task is rendered per seed
(`suites.user_template`). The schema is `suites.user_decl`; the format is in docs/suites.md.
"""

from __future__ import annotations

import functools
import posixpath
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from suites.errors import FormatIssue, SuiteFormatError
from suites.generator import GeneratorJob, run_generator
from suites.params import PARAM_NAME
from suites.suite import Suite
from suites.user_decl import SuiteDecl, TaskDecl, tool_args_problems
from suites.user_template import (
    PARAMS_NAME,
    VERIFIER_DIR,
    ExpansionFailure,
    build_template,
    name_problems,
    read_texts,
)
from tasks.types import is_workspace_relative

if TYPE_CHECKING:
    from sandbox.settings import SandboxSettings

__all__ = ["SUITE_FILE", "VERIFIER_DIR", "load_user_suite", "tool_args_problems"]

SUITE_FILE = "suite.yaml"
"""The file that makes a folder a suite."""
PROBE_SEED = 0
"""Seed a generated task without a generator is rendered with at load time, to catch errors."""

_Loc = tuple[str | int, ...]


def load_user_suite(folder: Path, *, sandbox: SandboxSettings) -> Suite:
    """Load the suite in `folder` (which holds `suite.yaml`).

    `sandbox` configures the jails generator scripts run in (the entry point's settings). Tasks with parameters but no generator are
    rendered once here (seed `PROBE_SEED`), so their template errors are load errors;
    a generator's values can only be checked when it runs (`suites check` does).

    Raises:
        SuiteFormatError: the file is missing, not YAML, or any field is malformed; every
            problem found is listed with file, line and field.
    """
    path = folder / SUITE_FILE
    root, decl = _read_decl(path)
    problems = _folder_problems(folder, decl)
    if not problems:
        problems = _template_problems(folder, decl)
    if problems:
        raise SuiteFormatError(
            [_issue(path, _mark_for(root, loc), _dotted(loc), msg) for loc, msg in problems]
        )

    def on_failure(failure: ExpansionFailure, seed: int) -> SuiteFormatError:
        message = f"seed {seed}: {failure.message}"
        return SuiteFormatError(
            [_issue(path, _mark_for(root, failure.loc), _dotted(failure.loc), message)]
        )

    run = functools.partial(run_generator, sandbox_settings=sandbox)
    templates = [
        build_template(
            i,
            task,
            from_texts=_from_texts(folder, task),
            verifier_files={
                posixpath.join(VERIFIER_DIR, rel): text
                for rel, text in read_texts(folder, task.verifier.files).items()
            },
            generator=_generator_job(folder, task),
            on_failure=on_failure,
            run=run,
        )
        for i, task in enumerate(decl.tasks)
    ]
    suite = Suite(decl.name, decl.version, templates, description=decl.description, source=folder)
    probe_issues: list[FormatIssue] = []
    for task in decl.tasks:
        if task.params and task.generator is None:
            try:
                suite.generate(task.name, PROBE_SEED)
            except SuiteFormatError as e:
                probe_issues += e.issues
    if probe_issues:
        raise SuiteFormatError(probe_issues)
    return suite


def _read_decl(path: Path) -> tuple[yaml.Node, SuiteDecl]:
    """The YAML node tree (for locations) and the validated declaration of `path`."""
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
    return root, decl


def _from_texts(folder: Path, task: TaskDecl) -> dict[str, str]:
    return read_texts(folder, [src.from_ for src in task.files.values() if src.from_ is not None])


def _generator_job(folder: Path, task: TaskDecl) -> GeneratorJob | None:
    decl = task.generator
    if decl is None:
        return None
    return GeneratorJob(
        suite_folder=folder,
        template=task.name,
        script=decl.script,
        files=read_texts(folder, [decl.script, *decl.files]),
        provides=tuple(decl.provides),
        timeout_s=decl.timeout_s,
    )


def _template_problems(folder: Path, decl: SuiteDecl) -> list[tuple[_Loc, str]]:
    """Syntax errors and unknown names in the templates of generated tasks."""
    problems: list[tuple[_Loc, str]] = []
    for i, task in enumerate(decl.tasks):
        if task.generated:
            problems += name_problems(i, task, _from_texts(folder, task))
    return problems


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
            if not is_workspace_relative(rel):
                problems.append((loc, f"workspace path {rel!r} must be relative, without `..`"))
            if source.from_ is not None:
                problems += [
                    ((*loc, "from"), msg) for msg in _suite_file_problems(folder, source.from_)
                ]
            if source.render and not task.generated:
                problems.append(
                    ((*loc, "render"), "`render` needs `params` or a `generator` in the task")
                )
        for j, name in enumerate(task.verifier.files):
            vloc: _Loc = ("tasks", i, "verifier", "files", j)
            problems += [(vloc, msg) for msg in _suite_file_problems(folder, name)]
            if task.generated and posixpath.normpath(name) == PARAMS_NAME:
                problems.append(
                    (vloc, f"{PARAMS_NAME!r} is reserved for the task's values; rename the file")
                )
        if not task.generated:
            for j, call in enumerate(task.reference_solution):
                found = tool_args_problems(call.tool, call.args)
                if found:
                    problems.append((("tasks", i, "reference_solution", j), "; ".join(found)))
        problems += _parameter_problems(folder, i, task)
    return problems


def _parameter_problems(folder: Path, i: int, task: TaskDecl) -> list[tuple[_Loc, str]]:
    problems: list[tuple[_Loc, str]] = []
    for name in task.params:
        if not re.fullmatch(PARAM_NAME, name):
            problems.append(
                (("tasks", i, "params", name), f"parameter name {name!r} must match {PARAM_NAME}")
            )
    gen = task.generator
    if gen is None:
        return problems
    base: _Loc = ("tasks", i, "generator")
    for k, name in enumerate(gen.provides):
        if not re.fullmatch(PARAM_NAME, name):
            problems.append(((*base, "provides", k), f"name {name!r} must match {PARAM_NAME}"))
        elif name in task.params:
            problems.append(
                ((*base, "provides", k), f"{name!r} is also declared under `params`; pick one")
            )
    for loc, rel in [((*base, "script"), gen.script)] + [
        ((*base, "files", k), rel) for k, rel in enumerate(gen.files)
    ]:
        if not is_workspace_relative(rel):
            problems.append((loc, f"{rel!r} must be a plain relative path (no `.`, `..`, `//`)"))
        else:
            problems += [(loc, msg) for msg in _suite_file_problems(folder, rel)]
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
