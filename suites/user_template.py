"""A user task (`TaskDecl`) as a `TaskTemplate`: static, or expanded from seeded values.

A static task (no `params`, no `generator`) yields the same draft for every seed. A
generated task draws its `params` from `random.Random(seed)`, runs its generator (if any)
in a jail with the seed, and expands `{{ … }}` (see `suites.expressions`) in the prompt, the
workspace paths and inline files (and `from` files marked `render: true`), the reference
calls' string arguments (an argument the tool wants as an integer keeps the type of a
whole `{{ … }}`), the reference final text and the verifier's command or argv. The
verifier also gets every value as JSON in `PARAMS_FILE`.

Expansion failures carry the location of the field (`ExpansionFailure.loc`); the loader turns
them into `SuiteFormatError`s with file and line.
"""

from __future__ import annotations

import json
import posixpath
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.tool_specs import BUILTIN_TOOLS
from suites.expressions import ExpressionError, expand_text, expand_value, names_in
from suites.generator import GeneratedParts, GeneratorJob
from suites.params import draw_params
from suites.template import TaskDraft, TaskTemplate
from suites.user_decl import TaskDecl, tool_args_problems
from tasks.types import ReferenceCall, VerifierSpec, is_workspace_relative

VERIFIER_DIR = "/tmp/epiflow-verifier"
"""In-jail folder the verifier files are copied to (outside the agent's /workspace)."""
PARAMS_NAME = "params.json"
"""Name, under `VERIFIER_DIR`, of the JSON object of a generated task's values."""
PARAMS_FILE = posixpath.join(VERIFIER_DIR, PARAMS_NAME)
"""In-jail path of the values file the verifier of a generated task can read."""
DRAFT_CACHE_SIZE = 4096
"""Drafts of a generator template kept per template (a generator run costs a jail)."""

Loc = tuple[str | int, ...]


class ExpansionFailure(Exception):
    """A field of a generated task could not be expanded for a seed."""

    def __init__(self, loc: Loc, message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


@dataclass(frozen=True)
class _Text:
    """One field that holds template text, with where it is in `suite.yaml`."""

    loc: Loc
    text: str


def template_texts(index: int, task: TaskDecl, from_texts: dict[str, str]) -> list[_Text]:
    """Every field of `task` that is expanded, located (`from_texts`: files marked `render`)."""
    base: Loc = ("tasks", index)
    out = [_Text((*base, "prompt"), task.prompt)]
    for rel, src in task.files.items():
        out.append(_Text((*base, "files", rel), rel))
        if src.text is not None:
            out.append(_Text((*base, "files", rel), src.text))
        elif src.from_ is not None and src.render:
            out.append(_Text((*base, "files", rel, "from"), from_texts[src.from_]))
    for j, call in enumerate(task.reference_solution):
        loc: Loc = (*base, "reference_solution", j)
        out += [_Text(loc, text) for text in _strings(call.args)]
    out.append(_Text((*base, "reference_final"), task.reference_final))
    decl = task.verifier
    if decl.command is not None:
        out.append(_Text((*base, "verifier", "command"), decl.command))
    for k, arg in enumerate(decl.argv or []):
        out.append(_Text((*base, "verifier", "argv", k), arg))
    return out


def name_problems(index: int, task: TaskDecl, from_texts: dict[str, str]) -> list[tuple[Loc, str]]:
    """Syntax errors and unknown names in `task`'s templates (no values needed)."""
    known = set(task.params) | set(task.generator.provides if task.generator else ())
    problems: list[tuple[Loc, str]] = []
    for field in template_texts(index, task, from_texts):
        try:
            unknown = sorted(names_in(field.text) - known)
        except ExpressionError as e:
            problems.append((field.loc, str(e)))
            continue
        if unknown:
            declared = ", ".join(sorted(known)) or "none"
            problems.append(
                (field.loc, f"unknown parameter(s) {', '.join(unknown)} (declared: {declared})")
            )
    return problems


class _Expander:
    """Expands one generated task's draft from its values."""

    def __init__(
        self, index: int, task: TaskDecl, from_texts: dict[str, str], verifier_files: dict[str, str]
    ) -> None:
        self.base: Loc = ("tasks", index)
        self.task = task
        self.from_texts = from_texts
        self.verifier_files = verifier_files

    def draft(self, values: dict[str, Any], generated: GeneratedParts | None) -> TaskDraft:
        task, base = self.task, self.base
        files: dict[str, str] = {}
        for rel, src in task.files.items():
            loc: Loc = (*base, "files", rel)
            path = self._text(loc, rel, values)
            if not is_workspace_relative(path):
                raise ExpansionFailure(
                    loc, f"workspace path renders as {path!r}: not inside /workspace"
                )
            if path in files:
                raise ExpansionFailure(loc, f"two workspace paths render as {path!r}")
            if src.text is not None:
                files[path] = self._text(loc, src.text, values)
            elif src.from_ is not None:
                text = self.from_texts[src.from_]
                files[path] = self._text((*loc, "from"), text, values) if src.render else text
        for path, text in (generated.files if generated else {}).items():
            if path in files:
                raise ExpansionFailure(
                    (*base, "generator", "script"),
                    f"the generator returned file {path!r}, which `files` already declares",
                )
            files[path] = text
        calls: list[ReferenceCall] = []
        for j, call in enumerate(task.reference_solution):
            loc = (*base, "reference_solution", j)
            schema = BUILTIN_TOOLS[call.tool].parameters.get("properties", {})
            args = {
                key: self._text(loc, value, values)
                if isinstance(value, str) and schema.get(key, {}).get("type") == "string"
                else self._value(loc, value, values)
                for key, value in call.args.items()
            }
            problems = tool_args_problems(call.tool, args)
            if problems:
                raise ExpansionFailure(loc, "once rendered: " + "; ".join(problems))
            calls.append(ReferenceCall(tool=call.tool, args=args))
        decl = task.verifier
        argv = (
            [self._text((*base, "verifier", "argv", k), a, values) for k, a in enumerate(decl.argv)]
            if decl.argv is not None
            else [
                "/bin/sh",
                "-c",
                self._text((*base, "verifier", "command"), str(decl.command), values),
            ]
        )
        return TaskDraft(
            prompt=self._text((*base, "prompt"), task.prompt, values),
            files=files,
            reference_solution=calls,
            reference_final=self._text((*base, "reference_final"), task.reference_final, values),
            verifier=VerifierSpec(
                argv=argv,
                files={
                    **self.verifier_files,
                    PARAMS_FILE: json.dumps(values, ensure_ascii=False, sort_keys=True),
                },
                timeout_s=decl.timeout_s,
            ),
        )

    def _text(self, loc: Loc, text: str, values: dict[str, Any]) -> str:
        try:
            return expand_text(text, values)
        except ExpressionError as e:
            raise ExpansionFailure(loc, str(e)) from e

    def _value(self, loc: Loc, value: Any, values: dict[str, Any]) -> Any:
        try:
            if isinstance(value, str):
                return expand_value(value, values)
        except ExpressionError as e:
            raise ExpansionFailure(loc, str(e)) from e
        if isinstance(value, list):
            return [self._value(loc, v, values) for v in value]
        if isinstance(value, dict):
            return {k: self._value(loc, v, values) for k, v in value.items()}
        return value


def build_template(
    index: int,
    task: TaskDecl,
    *,
    from_texts: dict[str, str],
    verifier_files: dict[str, str],
    generator: GeneratorJob | None,
    on_failure: Callable[[ExpansionFailure, int], Exception],
    run: Callable[[GeneratorJob, list[tuple[int, dict[str, Any]]]], list[GeneratedParts]],
) -> TaskTemplate:
    """The `TaskTemplate` of `task` (the `index`-th task of its suite).

    `from_texts` holds the text of every `from` file, `verifier_files` the in-jail path →
    text of the verifier's files; `on_failure(failure, seed)` makes the exception a
    expansion failure raises at generation time; `run` runs the generator (in nsjail:
    `suites.generator.run_generator` with the entry point's sandbox settings).
    """
    summary = task.summary or task.prompt.strip().splitlines()[0][:80]
    if not task.generated:
        static = _static_draft(task, from_texts, verifier_files)

        def build_static(rng: random.Random) -> TaskDraft:
            del rng  # a static task: every seed gives the same draft
            return static

        return TaskTemplate(task.name, task.version, task.difficulty, summary, build=build_static)

    expander = _Expander(index, task, from_texts, verifier_files)

    def expand(seed: int, values: dict[str, Any], parts: GeneratedParts | None) -> TaskDraft:
        try:
            return expander.draft(values, parts)
        except ExpansionFailure as failure:
            raise on_failure(failure, seed) from failure

    if generator is None:

        def build_declared(seeds: Sequence[int]) -> list[TaskDraft]:
            return [expand(s, draw_params(task.params, random.Random(s)), None) for s in seeds]

        return TaskTemplate(
            task.name, task.version, task.difficulty, summary, build_seeds=build_declared
        )

    job = generator
    run_job = run
    cache: dict[int, TaskDraft] = {}

    def build_generated(seeds: Sequence[int]) -> list[TaskDraft]:
        drafts = {s: cache[s] for s in seeds if s in cache}
        todo = [s for s in dict.fromkeys(seeds) if s not in drafts]
        declared = {s: draw_params(task.params, random.Random(s)) for s in todo}
        outputs = run_job(job, [(s, declared[s]) for s in todo])
        for seed, parts in zip(todo, outputs, strict=True):
            drafts[seed] = expand(seed, {**declared[seed], **parts.params}, parts)
            if len(cache) >= DRAFT_CACHE_SIZE:
                cache.pop(next(iter(cache)))
            cache[seed] = drafts[seed]
        return [drafts[s] for s in seeds]

    return TaskTemplate(
        task.name, task.version, task.difficulty, summary, build_seeds=build_generated
    )


def _static_draft(
    task: TaskDecl, from_texts: dict[str, str], verifier_files: dict[str, str]
) -> TaskDraft:
    decl = task.verifier
    return TaskDraft(
        prompt=task.prompt,
        files={
            rel: from_texts[src.from_] if src.from_ is not None else str(src.text)
            for rel, src in task.files.items()
        },
        reference_solution=[
            ReferenceCall(tool=c.tool, args=c.args) for c in task.reference_solution
        ],
        reference_final=task.reference_final,
        verifier=VerifierSpec(
            argv=list(decl.argv) if decl.argv is not None else ["/bin/sh", "-c", str(decl.command)],
            files=dict(verifier_files),
            timeout_s=decl.timeout_s,
        ),
    )


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def read_texts(folder: Path, paths: Sequence[str]) -> dict[str, str]:
    """Suite-folder path → text, for files the loader has already checked."""
    return {rel: (folder / rel).read_text(encoding="utf-8") for rel in paths}
