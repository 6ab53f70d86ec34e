"""The layout tells the design.

- Floors: every package imports only packages on lower floors, in the order of the
  package table of docs/architecture.md (lowest first), so no import cycle between
  packages can exist; every package is on a floor.
- `flows/` holds Prefect flows and their tasks only (no SQL, no CLI, no rendering), and
  benchmarks use no private helper of a flow module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
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


def floor_order(architecture: str) -> list[str]:
    """The packages of the architecture page's package table, lowest floor first."""
    return re.findall(r"^\| `([a-z_]+)/` \|", architecture, flags=re.MULTILINE)


def packages(root: Path) -> list[str]:
    """The project's top-level packages (folders with an `__init__.py`), tests aside."""
    return sorted(
        p.parent.name for p in root.glob("*/__init__.py") if p.parent.name not in ("tests",)
    )


def upward_imports(root: Path, floors: list[str]) -> list[str]:
    """Every import of a package from a package on its own floor or above, as
    `path:line: imports module (floor of that package ≥ floor of this one)`."""
    floor = {name: i for i, name in enumerate(floors)}
    found: list[str] = []
    for package in floors:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top != package and top in floor and floor[top] > floor[package]:
                        found.append(
                            f"{path.relative_to(root)}:{node.lineno}: imports {module} "
                            f"({top}/ is on floor {floor[top]}, above {package}/ on floor "
                            f"{floor[package]})"
                        )
    return found


def test_every_package_is_on_a_floor() -> None:
    floors = floor_order(ARCHITECTURE.read_text())
    assert len(floors) == len(set(floors)), floors
    assert sorted(floors) == packages(ROOT), (
        "docs/architecture.md's package table must list every package once: "
        f"missing {sorted(set(packages(ROOT)) - set(floors))}, "
        f"not packages {sorted(set(floors) - set(packages(ROOT)))}"
    )


def test_every_package_is_installed() -> None:
    """An installed epiflow (`pip install .`, a wheel) has every package: setuptools'
    `include` list in pyproject.toml names each one (`environment/` was once left out)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    named = sorted(pattern.removesuffix("*") for pattern in include)
    missing = sorted(set(packages(ROOT)) - set(named))
    assert not missing, f"pyproject.toml [tool.setuptools.packages.find] include lacks {missing}"


def test_no_package_imports_a_package_above_it() -> None:
    floors = floor_order(ARCHITECTURE.read_text())
    offending = upward_imports(ROOT, floors)
    assert not offending, "lower floors import nothing above them:\n" + "\n".join(offending)


def test_an_upward_import_is_named_with_its_place(tmp_path: Path) -> None:
    """The check itself: a lazy import inside a function counts, the failure names it, and a
    cycle fails whatever the order."""
    for name, source in {
        "low": "def f():\n    from high.mod import g\n    return g\n",
        "high": "from low import f\n",
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(source)
    assert upward_imports(tmp_path, ["low", "high"]) == [
        "low/__init__.py:2: imports high.mod (high/ is on floor 1, above low/ on floor 0)"
    ]
    assert upward_imports(tmp_path, ["high", "low"]) == [
        "high/__init__.py:1: imports low (low/ is on floor 1, above high/ on floor 0)"
    ]
    (tmp_path / "low" / "__init__.py").write_text("def f():\n    return 1\n")
    assert upward_imports(tmp_path, ["low", "high"]) == []


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
