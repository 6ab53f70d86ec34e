"""Harbor task directories: parsing and refusals (fast), and the two real tasks of
`../shared/interop/harbor-tasks/` end to end on real nsjail (images built with mmdebstrap,
no Docker): the oracle scores 1.0, doing nothing 0.0, the episodes and their per-test
results land in SQL on SQLite and PostgreSQL; a verifier that needs the network is an
infrastructure error (`env_error`), never a reward of 0.

The end-to-end tests need root and mmdebstrap (scripts/system-deps.sh installs it) and
build their images into `$TMPDIR/epiflow-test-images` (content-addressed: later runs reuse
them; the first build takes minutes).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from agent.settings import PolicySettings
from sandbox import SandboxSettings, sandbox_opener
from suites.harbor.dockerfile import parse_dockerfile
from suites.harbor.errors import HarborTaskError, UnsupportedEnvironment
from suites.harbor.suite import HarborDatasetError, load_harbor_suite
from suites.harbor.task import load_task
from suites.harbor.toolkit import verifier_requirements
from tasks.harbor_reward import reward_from
from tasks.harbor_verify import ctrf_tests
from tests.interop import HARBOR_TASKS, find_interop_dir, interop_dir

INTEROP = HARBOR_TASKS
"""The interop tasks' folder (absent without ../shared: use it behind `needs_builder`)."""


def interop_tasks() -> Path:
    """`shared/interop/harbor-tasks` (a loud skip without it: `tests.interop`)."""
    return interop_dir() / "harbor-tasks"


IMAGES = Path(tempfile.gettempdir()) / "epiflow-test-images"

needs_builder = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mmdebstrap") is None or find_interop_dir() is None,
    reason="needs root, mmdebstrap (scripts/system-deps.sh) and ../shared/interop/harbor-tasks",
)
builds_images = pytest.mark.slow(reason="builds Harbor task images with mmdebstrap")


def _task(
    root: Path, name: str, *, toml: str, dockerfile: str, test_sh: str, solve: str = ""
) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(textwrap.dedent(toml))
    (task / "instruction.md").write_text("Do the thing.\n")
    (task / "environment" / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    (task / "tests" / "test.sh").write_text(textwrap.dedent(test_sh))
    if solve:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(solve)
    for path in [task, *task.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return task


def test_both_interop_tasks_parse_with_their_limits_and_metadata() -> None:
    hello = load_task(interop_tasks() / "hello-world")
    csv = load_task(interop_tasks() / "csv-filter")
    assert (hello.memory_mib, hello.storage_mib, hello.cpus) == (2048, 10240, 1)  # memory = "2G"
    assert (csv.memory_mib, csv.storage_mib, csv.cpus) == (4096, 10240, 2)  # memory_mb
    assert (hello.agent_timeout_s, csv.verifier_timeout_s) == (120.0, 300.0)
    assert (csv.difficulty_label, csv.category, csv.tags) == (
        "easy",
        "data-processing",
        ("csv", "python", "filter"),
    )
    assert hello.instruction.startswith("Create a file called hello.txt")
    assert len(hello.content_hash) == 64 and hello.content_hash != csv.content_hash


def test_schema_1_1_names_the_task(tmp_path: Path) -> None:
    task = _task(
        tmp_path, "dir-name",
        toml='schema_version = "1.1"\n[task]\nname = "org/My Task"\nversion = "2.0"\n',
        dockerfile="FROM debian:bookworm\n", test_sh="echo 1 > /logs/verifier/reward.txt\n",
    )  # fmt: skip
    parsed = load_task(task)
    assert (parsed.name, parsed.version, parsed.schema_version) == ("org.my-task", "2.0", "1.1")


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ('version = "1.0"\n[environment]\nmemory = "lots"\n', "environment.memory"),
        ('version = "1.0"\n[agent]\ntimeout_sec = -1\n', "agent.timeout_sec"),
        ('version = "1.0"\n[metadata]\ntags = "csv"\n', "metadata.tags"),
        ('version = "1.0"\n[[steps]]\nname = "a"\n', "steps"),
        ('version = "9"\n', "schema_version"),
        ("version = \n", "<file>"),
    ],
)
def test_malformed_task_toml_is_one_line_naming_file_and_field(
    tmp_path: Path, toml: str, field: str
) -> None:
    task = _task(tmp_path, "t", toml=toml, dockerfile="FROM ubuntu:24.04\n", test_sh="true\n")
    with pytest.raises(HarborTaskError) as caught:
        load_task(task)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{task / 'task.toml'}: {field}: ")


@pytest.mark.parametrize(
    ("dockerfile", "line", "words"),
    [
        ("FROM alpine:3.22\nRUN apk add bash\n", 1, "alpine"),
        ("FROM python:3.13-alpine\n", 1, "alpine"),
        ("FROM nvidia/cuda:12.1.0-devel-ubuntu22.04\n", 1, "unknown base image"),
        ("FROM ubuntu:24.04 AS build\nRUN true\nFROM ubuntu:24.04\n", 3, "multi-stage"),
        (
            "FROM ubuntu:24.04\n\nCOPY --from=ghcr.io/astral-sh/uv:latest /uv /bin/\n",
            3,
            "multi-stage",
        ),
        ("FROM ubuntu:24.04\nADD https://example.com/x.tgz /x\n", 2, "fetches from the internet"),
        ("FROM ubuntu:24.04\nFROBNICATE x\n", 2, "is not a Dockerfile instruction"),
        ("# comment\nFROM python:3.9\n", 2, "Python 3.11"),
    ],
)
def test_unsupported_environments_are_refused_naming_the_line(
    tmp_path: Path, dockerfile: str, line: int, words: str
) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(dockerfile)
    with pytest.raises(UnsupportedEnvironment) as caught:
        parse_dockerfile(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: line {line}: ") and words in message


def test_a_docker_compose_environment_is_refused(tmp_path: Path) -> None:
    task = _task(
        tmp_path, "t", toml='version = "1.0"\n', dockerfile="FROM ubuntu:24.04\n", test_sh="true\n"
    )
    (task / "environment" / "Dockerfile").unlink()
    (task / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(HarborTaskError, match="docker-compose environments are not supported"):
        load_task(task)


def test_bases_map_to_the_debian_releases_served_here() -> None:
    hello = parse_dockerfile(interop_tasks() / "hello-world" / "environment" / "Dockerfile")
    csv = parse_dockerfile(interop_tasks() / "csv-filter" / "environment" / "Dockerfile")
    assert (hello.release, csv.release) == ("trixie", "trixie")
    # python:* bases carry CPython's headers as the official image does (C extensions
    # build), so the python task's base is the ubuntu one's plus python3-dev
    assert set(csv.packages) - set(hello.packages) == {"python3-dev"}
    assert hello.base_key() != csv.base_key()
    assert hello.substitutions == ("ubuntu:24.04 → Debian trixie (minbase)",)
    assert csv.substitutions[0].startswith(
        "python:3.13-slim → Debian trixie with its python3 (3.13)"
    )
    assert csv.python_links and csv.workdir == "/app"


def test_a_dataset_with_bad_tasks_runs_the_rest_and_lists_them_or_is_refused_when_strict(
    tmp_path: Path,
) -> None:
    good = 'version = "1.0"\n'
    _task(
        tmp_path,
        "good",
        toml=good,
        dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
        test_sh="true\n",
    )
    _task(tmp_path, "alpine", toml=good, dockerfile="FROM alpine:3.22\n", test_sh="true\n")
    _task(
        tmp_path,
        "bad-toml",
        toml='version = "1.0"\n[environment]\ncpus = 0\n',
        dockerfile="FROM ubuntu:24.04\n",
        test_sh="true\n",
    )
    suite = load_harbor_suite(tmp_path, name="d", images_dir=tmp_path / "images")
    assert list(suite.templates) == ["good"]
    assert [(r.task.name, r.category) for r in suite.refused] == [
        ("alpine", "base-image"),
        ("bad-toml", "malformed"),
    ]
    with pytest.raises(HarborDatasetError) as caught:
        load_harbor_suite(tmp_path, name="d", images_dir=tmp_path / "images", strict=True)
    lines = str(caught.value).splitlines()
    assert len(lines) == 3 and "alpine" in lines[1] and "environment.cpus" in lines[2]


def test_rewards_ctrf_and_requirements_are_read_as_harbor_writes_them() -> None:
    assert reward_from({"reward_txt": "1\n"})[0] == 1.0
    score, keys, source = reward_from({"reward_json": '{"score": 0.5, "extra": 3}'})
    assert (score, keys, source) == (0.5, {"score": 0.5, "extra": 3}, "reward.json")
    assert reward_from({})[0] is None
    assert reward_from({"reward_json": '{"a": 1, "b": 0.5}'})[0] == 0.75  # the mean
    tests = ctrf_tests(
        '{"results": {"tests": [{"name": "t::a", "status": "failed", "duration": 3, "message": "boom"}]}}'
    )
    assert tests == [{"name": "t::a", "status": "failed", "duration_ms": 3.0, "message": "boom"}]
    script = (interop_tasks() / "csv-filter" / "tests" / "test.sh").read_text()
    assert verifier_requirements(script) == ("pytest-json-ctrf==0.3.5", "pytest==8.4.1")
    assert verifier_requirements("pip install requests==2.32.3 -q\nuv run --with 'numpy' x") == (
        "numpy",
        "requests==2.32.3",
    )


# --- end to end on real nsjail -------------------------------------------------------------


def _episode(task, policy_spec: str):
    from agent.loop import run_episode
    from agent.policies import make_policy
    from agent.settings import LoopSettings
    from sandbox import SandboxSpec

    return asyncio.run(
        run_episode(
            task,
            make_policy(policy_spec, settings=PolicySettings()),
            spec=SandboxSpec(),
            run_key=f"harbor-test/{policy_spec}",
            settings=LoopSettings(),
            open_sandbox=sandbox_opener(SandboxSettings()),
        )
    )


@pytest.fixture(scope="module")
def interop_suite():
    IMAGES.mkdir(exist_ok=True)
    IMAGES.chmod(0o755)
    return load_harbor_suite(interop_tasks(), name="harbor-tasks", images_dir=IMAGES)


@needs_builder
@builds_images
def test_interop_tasks_oracle_one_idle_zero_and_rows_in_sql(
    interop_suite, db_url: str, tmp_path: Path
) -> None:
    from agent.trajectory import EpisodeStatus
    from models import HarborEpisode, HarborTest
    from storage.episodes import persist_episodes
    from storage.migrate import upgrade
    from storage.objects import LocalObjectStore

    trajectories = []
    for name in ("hello-world", "csv-filter"):
        task = interop_suite.generate(name, 0)
        assert task.environment is not None and task.environment.image.workdir == "/app"
        oracle = _episode(task, "scripted:oracle")
        assert oracle.status == EpisodeStatus.SUCCESS, (
            oracle.failure_reason,
            oracle.verifier_reason,
        )
        assert oracle.verifier_score == 1.0
        assert any(s.tool == "execute_shell" and "solve.sh" in str(s.args) for s in oracle.steps)
        idle = _episode(task, "scripted:idle")
        assert idle.status == EpisodeStatus.FAILED and idle.verifier_score == 0.0, (
            idle.verifier_reason
        )
        info = oracle.verifier_details["harbor"]
        assert info["image"] == task.environment.image.digest
        assert (
            info["substitutions"]
            and info["tests"]
            and all(t["status"] == "passed" for t in info["tests"])
        )
        trajectories += [oracle, idle]

    engine = create_engine(db_url)
    upgrade(engine)
    store = LocalObjectStore(tmp_path / "objects")
    report = persist_episodes(engine, store, trajectories)
    assert len(report.inserted) == 4
    with engine.connect() as conn:
        episodes = conn.execute(select(HarborEpisode.__table__)).mappings().all()  # type: ignore[attr-defined]
        tests = conn.execute(select(HarborTest.__table__)).mappings().all()  # type: ignore[attr-defined]
    by = {(r["task_name"], r["tests_passed"] == r["tests_total"]): r for r in episodes}
    assert (
        by[("csv-filter", True)]["reward"] == {"score": 1.0}
        and by[("csv-filter", True)]["category"] == "data-processing"
    )
    assert by[("hello-world", True)]["reward"] == {"reward": 1.0}
    assert {r["status"] for r in tests} == {"passed", "failed"}
    assert len([r for r in tests if r["status"] == "passed"]) == 5  # 2 + 3 tests of the oracles
    assert persist_episodes(engine, store, trajectories).inserted == []  # idempotent
    engine.dispose()


@needs_builder
@builds_images
def test_a_verifier_that_needs_the_network_is_an_infrastructure_error(tmp_path: Path) -> None:
    from agent.trajectory import EpisodeStatus

    root = Path(tempfile.mkdtemp(dir=IMAGES.parent if IMAGES.parent.is_dir() else None))
    root.chmod(0o755)
    try:
        _task(
            root, "needs-net",
            toml='version = "1.0"\n[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 60\n',
            dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
            # a host put together at run time: a URL written out is refused at load
            # (`network-verifier`, test_harbor_oracle_environment.py); this is the run-time net
            test_sh="#!/bin/bash\ncurl -fsSL \"https://$(echo example.com)/setup.sh\" | sh\necho 0 > /logs/verifier/reward.txt\n",
            solve="#!/bin/bash\ntrue\n",
        )  # fmt: skip
        suite = load_harbor_suite(root, name="net", images_dir=IMAGES)
        traj = _episode(suite.generate("needs-net", 0), "scripted:oracle")
        assert traj.status == EpisodeStatus.ENV_ERROR, traj.failure_reason
        assert "needs the network" in (traj.failure_reason or "") and "example.com" in (
            traj.failure_reason or ""
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


@needs_builder
@builds_images
def test_exported_builtin_templates_round_trip_with_oracle_one() -> None:
    from agent.trajectory import EpisodeStatus
    from suites.builtin import builtin_suite
    from suites.harbor.export import export_task

    root = Path(tempfile.mkdtemp(dir=IMAGES.parent))
    root.chmod(0o755)
    try:
        tasks = builtin_suite().instances(2, templates=["csv_to_json", "dir_tree", "log_errors"])
        for task in tasks:
            export_task(task, root)
        suite = load_harbor_suite(root, name="exported", images_dir=IMAGES)
        assert sorted(suite.templates) == sorted(f"builtin.{t.template}.{t.seed}" for t in tasks)
        for name in suite.templates:
            harbor_task = suite.generate(name, 0)
            traj = _episode(harbor_task, "scripted:oracle")
            assert traj.status == EpisodeStatus.SUCCESS and traj.verifier_score == 1.0, (
                name,
                traj.failure_reason,
                traj.verifier_reason,
            )
            idle = _episode(harbor_task, "scripted:idle")
            assert idle.verifier_score == 0.0, (name, idle.verifier_reason)
    finally:
        shutil.rmtree(root, ignore_errors=True)
