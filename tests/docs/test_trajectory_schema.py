"""docs/trajectory-schema.md follows the code: every field, its docstring, real SQL columns."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel
from sqlmodel import SQLModel

import models  # noqa: F401  (registers every table on SQLModel.metadata)
from agent.trajectory import AgentIdentity, AtifRemainder, ContextStep, Step, Trajectory
from sandbox.types import FileChange, InjectedFault, ResourceUsage

DOC = Path(__file__).resolve().parents[2] / "docs" / "trajectory-schema.md"
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def attribute_docstrings(cls: type[BaseModel]) -> dict[str, str]:
    """Field name → the docstring written under it, whitespace-normalised."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for node, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def section_rows(title: str) -> list[list[str]]:
    """The body rows of the first table under heading `title`, as stripped cells."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n{title}\n") + 1
    rows: list[list[str]] = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("#") or (rows and not line.startswith("|")):
            break
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in CELL_SPLIT.split(line.strip())[1:-1]])
    return rows[1:]  # the header row


def field_name(cell: str) -> str:
    match = re.match(r"`(\w+)`", cell)
    assert match, cell
    return match.group(1)


@pytest.mark.parametrize(
    ("title", "model"), [("## Trajectory fields", Trajectory), ("## Step fields", Step)]
)
def test_field_table_lists_every_field_with_its_docstring(
    title: str, model: type[BaseModel]
) -> None:
    rows = section_rows(title)
    assert [field_name(r[0]) for r in rows] == list(model.model_fields)
    docs = attribute_docstrings(model)
    for row in rows:
        assert row[2] == docs[field_name(row[0])], field_name(row[0])


def test_nested_types_table_matches_sandbox_types() -> None:
    rows = section_rows("The nested types (`sandbox/types.py`):")
    documented = {(r[0].strip("`"), field_name(r[1])): r[2] for r in rows}
    expected = {
        (cls.__name__, name): doc
        for cls in (ResourceUsage, FileChange, InjectedFault)
        for name, doc in attribute_docstrings(cls).items()
    }
    assert documented == expected


def test_every_sql_column_named_exists_and_episode_and_step_are_covered() -> None:
    text = DOC.read_text(encoding="utf-8")
    tables = SQLModel.metadata.tables
    named = {
        (table, column) for table, column in re.findall(r"`(\w+)\.(\w+)`", text) if table in tables
    }
    missing = {(t, c) for t, c in named if c not in tables[t].columns}
    assert not missing, f"the document names columns that do not exist: {missing}"
    for table in ("episode", "step"):
        uncovered = {c.name for c in tables[table].columns} - {c for t, c in named if t == table}
        assert not uncovered, f"{table} columns the document does not map: {uncovered}"


# --- error kinds: the document lists every value the code can write --------------------

ERROR_TYPE_PACKAGES = ("agent", "sandbox", "collection", "storage", "scoring")
"""Packages whose code can put a value into `Step.error_type` (directly or through the
sandbox's `ToolResult`)."""
INDIRECT_SOURCES = {
    "fault.kind": "the keys of `_FAULT_MESSAGES` (the tool_timeout fault writes 'timeout')",
    "answer['error_type']": "the in-jail executor's `ToolFailure` kinds",
    "e.error_type": "a `ToolFailure` kind",
    "result.error_type": "a `ToolResult` built elsewhere",
    "error_type": "a local assigned from constants above",
    "kind": "`os_failure`'s lookup in `_ERRNO_TYPES` (values and default read here)",
}
"""Non-constant expressions assigned to an `error_type`, and where their values come from."""


def _strings(node: ast.expr, where: str, found: set[str]) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            found.add(node.value)
        return
    if isinstance(node, ast.IfExp):
        _strings(node.body, where, found)
        _strings(node.orelse, where, found)
        return
    source = ast.unparse(node)
    assert source in INDIRECT_SOURCES, (
        f"{where}: `error_type` gets `{source}`, a source of values this test does not know: "
        "teach it where the values come from and list them in docs/trajectory-schema.md"
    )


def error_types_in_code() -> set[str]:
    root = DOC.parents[1]
    found: set[str] = set()
    for package in ERROR_TYPE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                where = f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}"
                if isinstance(node, ast.keyword) and node.arg == "error_type":
                    _strings(node.value, where, found)
                elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names = {
                        t.id if isinstance(t, ast.Name) else getattr(t, "attr", None)
                        for t in targets
                    }
                    if "error_type" in names:
                        _strings(node.value, where, found)
                    if names & {"_ERRNO_TYPES", "_FAULT_MESSAGES"}:
                        assert isinstance(node.value, ast.Dict), where
                        keys_or_values = (
                            node.value.values if "_ERRNO_TYPES" in names else node.value.keys
                        )
                        for item in keys_or_values:
                            assert item is not None, where
                            _strings(item, where, found)
                elif isinstance(node, ast.Call):
                    func = node.func
                    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                    if name == "ToolFailure" and node.args:
                        _strings(node.args[0], where, found)
                    if (
                        name == "get"
                        and isinstance(func, ast.Attribute)
                        and ast.unparse(func.value) == "_ERRNO_TYPES"
                        and len(node.args) == 2
                    ):
                        _strings(node.args[1], where, found)
    return found


def test_every_error_kind_the_code_writes_is_documented() -> None:
    in_code = error_types_in_code()
    assert {"nonzero_exit", "not_found", "sandbox_crashed", "network_failure"} <= in_code
    documented = {field_name(r[0]) for r in section_rows("## Error kinds")}
    assert not in_code - documented, f"undocumented error kinds: {sorted(in_code - documented)}"
    assert not documented - in_code, f"documented but never written: {documented - in_code}"


def test_import_types_table_matches_the_code() -> None:
    rows = section_rows("The types (`agent/trajectory.py`):")
    documented = {(r[0].strip("`"), field_name(r[1])): r[2] for r in rows}
    expected = {
        (cls.__name__, name): doc
        for cls in (AgentIdentity, ContextStep, AtifRemainder)
        for name, doc in attribute_docstrings(cls).items()
    }
    assert documented == expected
