"""The layout tells the design: `flows/` holds Prefect flows and their tasks only (no SQL,
no CLI, no rendering), and benchmarks use no private helper of a flow module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOW_MODULES = sorted(p for p in (ROOT / "flows").glob("*.py") if p.name != "__init__.py")
SQL_PACKAGES = ("sqlalchemy", "sqlmodel", "psycopg")
SQL_CALLS = {"select", "insert", "update", "delete", "text", "Session", "connect", "begin"}


def _imports(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize("path", FLOW_MODULES, ids=lambda p: p.name)
def test_flow_modules_run_no_sql(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported = _imports(tree)
    assert not [m for m in imported if m.split(".")[0] in SQL_PACKAGES], imported
    called = {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }
    assert not called & SQL_CALLS, called & SQL_CALLS


@pytest.mark.parametrize("path", FLOW_MODULES, ids=lambda p: p.name)
def test_flow_modules_define_flows_tasks_or_deployments(path: Path) -> None:
    tree = ast.parse(path.read_text())
    decorators = {
        (d.func if isinstance(d, ast.Call) else d)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for d in node.decorator_list
    }
    names = {getattr(d, "id", getattr(d, "attr", "")) for d in decorators}
    assert names & {"flow", "task"} or path.name == "deployments.py", path.name
    assert not {"typer", "rich"} & {m.split(".")[0] for m in _imports(tree)}


def test_benchmarks_use_no_private_flow_helpers() -> None:
    for path in sorted((ROOT / "bench").glob("*.py")):
        for name in _imports(ast.parse(path.read_text())):
            if name.startswith("flows."):
                assert not name.rsplit(".", 1)[-1].startswith("_"), (path.name, name)
