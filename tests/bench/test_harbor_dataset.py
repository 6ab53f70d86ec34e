"""`bench/harbor.py --dataset … --no-run` on a folder the test writes: every task directory
is either loaded or refused with a category, and a folder with bad tasks never raises.
Nothing is built or timed."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "harbor.py"


def _bench() -> Any:
    # bench/ is scripts, not a package: loaded by path (as `python bench/harbor.py` runs it)
    spec = importlib.util.spec_from_file_location("bench_harbor", BENCH)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get("bench_harbor")
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_harbor"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module


def _run_dataset(args: argparse.Namespace, folder: Path, images: Path) -> Any:
    return _bench()._run_dataset(args, folder, images)


def _task(folder: Path, name: str, dockerfile: str | None, compose: bool = False) -> None:
    task = folder / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n\n[metadata]\ndifficulty = "easy"\n')
    (task / "instruction.md").write_text(f"Do {name}.\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "solution" / "solve.sh").write_text("true\n")
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    if compose:
        (task / "environment" / "docker-compose.yaml").write_text("services: {}\n")


def _args(**overrides: object) -> argparse.Namespace:
    return argparse.Namespace(**{"tasks": None, "limit": None, "no_run": True, **overrides})


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    folder = tmp_path / "mixed"
    _task(folder, "fine", "FROM ubuntu:24.04\nWORKDIR /app\n")
    _task(folder, "also-fine", "FROM python:3.11-slim\nWORKDIR /app\n")
    _task(folder, "alpine", "FROM alpine:3.20\nWORKDIR /app\n")
    _task(folder, "compose", None, compose=True)
    _task(folder, "no-context", "FROM ubuntu:24.04\nCOPY missing.txt /app/\n")
    return folder


def test_no_run_loads_and_categorises_every_task(dataset: Path, tmp_path: Path) -> None:
    out = _run_dataset(_args(), dataset, tmp_path / "images")

    assert out["tasks"] == 5
    assert out["loaded"] == 2
    assert out["refused_by_category"] == {"base-image": 1, "multi-container": 1, "malformed": 1}
    assert out["ran"] == 0
    per_task = out["per_task"]
    assert set(per_task) == {"fine", "also-fine", "alpine", "compose", "no-context"}
    assert per_task["fine"] == {"outcome": "loaded"}
    assert per_task["alpine"]["outcome"] == "refused"
    assert "alpine" in per_task["alpine"]["message"]
    assert per_task["compose"]["category"] == "multi-container"


def test_no_run_selects_by_name_and_limit(dataset: Path, tmp_path: Path) -> None:
    named = _run_dataset(_args(tasks="fine,alpine"), dataset, tmp_path / "images")
    limited = _run_dataset(_args(limit=1), dataset, tmp_path / "images")

    assert named["selected"] == 1  # alpine is refused: listed, never selected to run
    assert limited["selected"] == 1


def test_unknown_task_names_the_flag(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--tasks: no task directory nope"):
        _run_dataset(_args(tasks="fine,nope"), dataset, tmp_path / "images")


def test_the_oracle_on_a_substituted_base_is_counted_under_its_own_reason() -> None:
    from agent.policies.scripted import IdlePolicy, OraclePolicy
    from agent.substituted_base import substituted_base_failure
    from sandbox.image_spec import ImageMount
    from tasks.environment import TaskEnvironment
    from tasks.types import TaskInstance, VerifierSpec

    env = TaskEnvironment(
        image=ImageMount(root="/images/img/root", digest="d" * 16), tests_dir="/t",
        toolkit_dir="/k", base_substitution="ubuntu:24.04 built as Debian trixie",
    )  # fmt: skip
    task = TaskInstance(
        suite="d", suite_version="1", template="t", template_version="1", seed=0,
        difficulty=1, prompt="p", verifier=VerifierSpec(argv=["true"]), environment=env,
    )  # fmt: skip
    # the verifier's own words may look like another bucket's: the category wins
    reason = substituted_base_failure(task, OraclePolicy(), "tests/test.sh timed out")
    assert reason is not None and _bench()._env_reason(reason) == "substituted-base"
    assert substituted_base_failure(task, IdlePolicy(), "reward 0") is None
    as_named = task.model_copy(
        update={"environment": env.model_copy(update={"base_substitution": None})}
    )
    assert substituted_base_failure(as_named, OraclePolicy(), "reward 0") is None
