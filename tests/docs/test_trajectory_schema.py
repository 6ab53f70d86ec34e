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
from agent.trajectory import Step, Trajectory
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
