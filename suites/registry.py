"""Finding suites by name: the built-in suite, `suites/examples/`, and `EPIFLOW_SUITES_PATH`.

A folder is a suite when it holds `suite.yaml`; each entry of the suites path is either such
a folder or a folder of them. Names come from `suite.yaml`; a folder whose file cannot be
read is listed under its folder name, so `load_suite(folder_name)` reports the exact error.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, ConfigDict

from suites.builtin import BUILTIN_NAME, builtin_suite
from suites.errors import SuiteConflict, SuiteError, SuiteNotFound
from suites.settings import SuitesSettings
from suites.suite import Suite
from suites.user_suite import SUITE_FILE, load_user_suite

if TYPE_CHECKING:
    from sandbox.settings import SandboxSettings

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
"""The example user suites shipped with epiflow."""


class SuiteEntry(BaseModel):
    """One suite on offer, loaded or not."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Suite name."""
    source: Path | None
    """Its folder; None for the built-in suite."""


def suite_folders(settings: SuitesSettings) -> list[Path]:
    """Every folder holding a `suite.yaml`, examples first, then the suites path in order."""
    roots = ([EXAMPLES_DIR] if settings.include_examples else []) + list(settings.path)
    found: list[Path] = []
    for root in roots:
        if (root / SUITE_FILE).is_file():
            candidates = [root]
        elif root.is_dir():
            candidates = sorted(p for p in root.iterdir() if (p / SUITE_FILE).is_file())
        else:
            candidates = []
        for folder in candidates:
            if folder.resolve() not in {f.resolve() for f in found}:
                found.append(folder)
    return found


def harbor_datasets(settings: SuitesSettings) -> list[Path]:
    """Every Harbor dataset on the suites path: an entry that is a task directory or holds
    task directories, or the subfolders of an entry that are (`suites/harbor/`)."""
    from suites.harbor.suite import is_dataset

    found: list[Path] = []
    for root in settings.path:
        if (root / SUITE_FILE).is_file() or not root.is_dir():
            continue
        if is_dataset(root):
            candidates = [root]
        else:
            candidates = sorted(p for p in root.iterdir() if p.is_dir() and is_dataset(p))
        found += [c for c in candidates if c.resolve() not in {f.resolve() for f in found}]
    return found


def available_suites(settings: SuitesSettings) -> list[SuiteEntry]:
    """The built-in suite, every user suite folder found (by declared name) and every
    Harbor dataset (by folder name)."""
    entries = [SuiteEntry(name=BUILTIN_NAME, source=None)]
    entries += [SuiteEntry(name=_declared_name(f), source=f) for f in suite_folders(settings)]
    entries += [SuiteEntry(name=f.name, source=f) for f in harbor_datasets(settings)]
    return entries


def load_suite(name: str, *, settings: SuitesSettings, sandbox: SandboxSettings) -> Suite:
    """The suite called `name`, found with the entry point's `settings`; the entry
    point's `sandbox` settings configure the jails of user generator scripts.

    Raises:
        SuiteNotFound: no built-in or user suite has that name.
        SuiteConflict: several folders declare that name (or a folder claims `builtin`).
        SuiteFormatError: the user suite's `suite.yaml` is malformed (file, line, field).
        HarborDatasetError: strict mode, and a Harbor dataset holds tasks that cannot run.
    """
    entries = [e for e in available_suites(settings) if e.name == name]
    if not entries:
        known = ", ".join(sorted({e.name for e in available_suites(settings)}))
        raise SuiteNotFound(f"no suite named {name!r} (available: {known})")
    if len(entries) > 1:
        where = ", ".join(str(e.source or "<built-in>") for e in entries)
        raise SuiteConflict(f"suite name {name!r} is declared more than once: {where}")
    source = entries[0].source
    if source is None:
        return builtin_suite()
    if not (source / SUITE_FILE).is_file():
        return _load_harbor(source, name, settings)
    return load_user_suite(source, sandbox=sandbox)


def _load_harbor(source: Path, name: str, settings: SuitesSettings) -> Suite:
    from core.home import epiflow_home
    from suites.harbor.suite import load_harbor_suite

    images = settings.harbor_image_dir or epiflow_home() / "images"
    return load_harbor_suite(
        source,
        name=name,
        images_dir=images,
        strict=settings.harbor_strict,
        reward_rule=settings.reward_rule_for(name),
    )


def load_all_suites(
    settings: SuitesSettings, *, sandbox: SandboxSettings
) -> tuple[list[Suite], list[SuiteError]]:
    """Every suite that loads, plus the errors of those that do not (for listings)."""
    loaded: list[Suite] = []
    errors: list[SuiteError] = []
    for name in dict.fromkeys(e.name for e in available_suites(settings)):
        try:
            loaded.append(load_suite(name, settings=settings, sandbox=sandbox))
        except SuiteError as e:
            errors.append(e)
    return loaded, errors


def _declared_name(folder: Path) -> str:
    try:
        data = yaml.safe_load((folder / SUITE_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return folder.name
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else folder.name
