"""Settings are built at the entry point and passed down, never below it.

A settings class reads the environment when it is built, so one built inside a lower
layer (a default for a parameter nobody passed) silently disagrees with the entry point's
settings whenever a caller built its own: the rule of docs/architecture.md and
STYLE.md's "config in one place". The entry points build them: the CLI (`cli/`), the
flows (`flows/`), `config/settings.py`'s loaders and Alembic's own entry
(`migrations/env.py`); benchmarks (`bench/`) are scripts, not packages, and are not
scanned. A field's `default_factory` is built with its parent, at the parent's entry
point, and is not a call.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ENTRY_POINTS = ("cli/", "flows/", "migrations/env.py")
"""Packages and modules that are entry points: every construction there is allowed."""

LOADERS = {"config/settings.py": {"load_settings", "load_qc_config", "_build"}}
"""Functions that read the settings from the environment for an entry point."""

PENDING: dict[str, str] = {}
"""Constructions below an entry point in files this change could not edit (another change
was editing them), with where they are and what must pass settings first. Remove an entry
when it is fixed: the test fails on an entry that no longer matches."""


def _packages(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/__init__.py") if p.parent.name != "tests")


def settings_classes(root: Path) -> set[str]:
    """Names of the project's pydantic-settings classes (subclasses of `BaseSettings`)."""
    names: set[str] = set()
    for package in _packages(root):
        for path in package.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id == "BaseSettings" for b in node.bases
                ):
                    names.add(node.name)
    return names


def constructions_below_entry_points(root: Path, classes: set[str]) -> dict[str, list[str]]:
    """`path builds Class` → the functions that do (`<module>`: at import time), for every
    call of a settings class outside the entry points and their loaders."""
    found: dict[str, list[str]] = {}
    for package in _packages(root):
        for path in sorted(package.rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(ENTRY_POINTS):
                continue
            tree = ast.parse(path.read_text(), filename=rel)
            scopes: list[tuple[ast.AST, str]] = [(tree, "<module>")]
            while scopes:
                node, scope = scopes.pop()
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        scopes.append((child, child.name))
                        continue
                    scopes.append((child, scope))
                    if not isinstance(child, ast.Call):
                        continue
                    func = child.func
                    name = func.id if isinstance(func, ast.Name) else None
                    if name in classes and scope not in LOADERS.get(rel, ()):
                        found.setdefault(f"{rel} builds {name}", []).append(scope)
    return found


def test_the_scan_finds_a_construction_below_an_entry_point(tmp_path: Path) -> None:
    (tmp_path / "low").mkdir()
    (tmp_path / "low" / "__init__.py").write_text("")
    (tmp_path / "low" / "settings.py").write_text(
        "from pydantic_settings import BaseSettings\nclass LowSettings(BaseSettings):\n    x: int = 1\n"
    )
    (tmp_path / "low" / "work.py").write_text(
        "from low.settings import LowSettings\n"
        "DEFAULT = LowSettings(x=2)\n"
        "def work(settings=None):\n"
        "    return settings if settings is not None else LowSettings()\n"
    )
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "__init__.py").write_text("")
    (tmp_path / "cli" / "main.py").write_text(
        "from low.settings import LowSettings\ndef main():\n    return LowSettings()\n"
    )
    classes = settings_classes(tmp_path)
    assert classes == {"LowSettings"}
    found = constructions_below_entry_points(tmp_path, classes)
    assert {key: sorted(scopes) for key, scopes in found.items()} == {
        "low/work.py builds LowSettings": ["<module>", "work"]
    }


def test_settings_are_built_only_at_entry_points() -> None:
    found = constructions_below_entry_points(ROOT, settings_classes(ROOT))
    new = {key: scopes for key, scopes in found.items() if key not in PENDING}
    assert not new, (
        "settings built below an entry point (take them as a parameter and let the entry "
        f"point build them): {new}"
    )
    fixed = sorted(PENDING.keys() - found)
    assert not fixed, f"fixed: remove them from PENDING: {fixed}"
