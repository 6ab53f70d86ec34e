"""A Harbor dataset is a list of tasks, each with its own outcome: every Dockerfile form
Harbor tasks use is parsed or refused in one line with its category; a folder mixing
runnable and unrunnable tasks loads (never raises), lists and checks per task; a task whose
image does not build is that task's `env_error` while the others run.

Parsing and categorising build nothing (fast). One test builds: `suites check` over the
interop `hello-world` beside a task whose `RUN` fails (root and mmdebstrap; the images go
to `$TMPDIR/epiflow-test-images`, shared with `test_harbor_tasks.py`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sandbox.images import CopyStep, MkdirStep, RunStep
from suites.harbor.dockerfile import expand, parse_dockerfile
from suites.harbor.errors import RefusalCategory, UnsupportedEnvironment
from suites.harbor.suite import HarborDatasetError, load_harbor_suite
from suites.settings import SuitesSettings
from tests.interop import HARBOR_TASKS

REPO = Path(__file__).resolve().parents[2]
INTEROP = HARBOR_TASKS
IMAGES = Path(tempfile.gettempdir()) / "epiflow-test-images"
GOOD_TOML = 'version = "1.0"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n'


def _task(
    root: Path,
    name: str,
    *,
    dockerfile: str = "FROM ubuntu:24.04\nWORKDIR /app\n",
    toml: str = GOOD_TOML,
    test_sh: str = "echo 1 > /logs/verifier/reward.txt\n",
    solve: str | None = "#!/bin/bash\ntrue\n",
    files: dict[str, str] | None = None,
) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(toml)
    (task / "instruction.md").write_text(f"Solve {name}.\n")
    (task / "environment" / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    (task / "tests" / "test.sh").write_text(test_sh)
    if solve is not None:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(solve)
    for rel, text in (files or {}).items():
        (task / "environment" / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / "environment" / rel).write_text(text)
    for path in [task, *task.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return task


def _plan(tmp_path: Path, dockerfile: str, files: dict[str, str] | None = None):
    context = tmp_path / "ctx"
    context.mkdir(exist_ok=True)
    for rel, text in (files or {}).items():
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        (context / rel).write_text(text)
    (context / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    return parse_dockerfile(context / "Dockerfile")


# --- every Dockerfile form ------------------------------------------------------------------


def test_copy_dot_copies_the_whole_context(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "FROM python:3.13-slim\nCOPY . /tmp/build/\n", {"a.py": "x"})
    assert plan.steps == (CopyStep(line=2, sources=(".",), dest="/tmp/build/"),)
    assert (
        plan.digest()
        != _plan(tmp_path, "FROM python:3.13-slim\nCOPY . /tmp/build/\n", {"a.py": "y"}).digest()
    )


def test_copy_of_a_folder_a_glob_and_chown(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        """\
        FROM ubuntu:24.04
        WORKDIR /app
        COPY src/ ./src/
        COPY --chown=1000:1000 --chmod=644 *.csv data/
        COPY ["b.csv", "/app/b-copy.csv"]
        """,
        {"src/main.py": "print(1)\n", "a.csv": "a\n", "b.csv": "b\n"},
    )
    assert plan.steps[1:] == (
        CopyStep(line=3, sources=("src",), dest="/app/src/"),
        CopyStep(line=4, sources=("a.csv", "b.csv"), dest="/app/data/"),
        CopyStep(line=5, sources=("b.csv",), dest="/app/b-copy.csv"),
    )
    assert any("--chown ignored (lines 4)" in s for s in plan.substitutions)


def test_add_of_a_local_file_and_of_a_tar_archive_that_docker_extracts(tmp_path: Path) -> None:
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "data.txt").write_text("x\n")
    with tarfile.open(context / "bundle.tar.gz", "w:gz") as archive:
        archive.add(context / "data.txt", arcname="data.txt")
    plan = _plan(tmp_path, "FROM debian:bookworm\nADD data.txt /srv/\nADD bundle.tar.gz /opt/b\n")
    copy, stage, extract = plan.steps
    assert copy == CopyStep(line=2, sources=("data.txt",), dest="/srv/")
    assert isinstance(stage, CopyStep) and stage.sources == ("bundle.tar.gz",)
    assert isinstance(extract, RunStep) and f"tar -xf {stage.dest} -C /opt/b" in extract.command


def test_arg_and_env_substitution(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        """\
        ARG BASE=debian:13.0-slim
        FROM ${BASE}
        ARG APP_DIR
        ENV ROOT=${APP_DIR:-/srv/app} PATH=/opt/tool/bin:$PATH
        ENV LABEL="${ROOT:+set} at $ROOT"
        WORKDIR $ROOT
        COPY a.txt ${ROOT}/a.txt
        RUN echo "$ROOT"
        """,
        {"a.txt": "a\n"},
    )
    assert plan.release == "trixie" and plan.workdir == "/srv/app"
    assert plan.env["ROOT"] == "/srv/app" and plan.env["LABEL"] == "set at /srv/app"
    assert plan.env["PATH"].startswith("/opt/tool/bin:/usr/local/bin") or plan.env[
        "PATH"
    ].startswith("/opt/tool/bin:/usr/local/sbin")
    assert CopyStep(line=7, sources=("a.txt",), dest="/srv/app/a.txt") in plan.steps
    run = plan.steps[-1]
    assert isinstance(run, RunStep) and run.env["ROOT"] == "/srv/app" and run.workdir == "/srv/app"
    assert expand(r"\$HOME ${X-unset} ${Y:-d}", {"X": "", "Y": ""}) == "$HOME  d"


def test_workdir_user_and_shell(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        """\
        FROM python:3.11-slim-bookworm
        WORKDIR /work
        WORKDIR sub
        USER 1000:1000
        SHELL ["/bin/bash", "-o", "pipefail", "-c"]
        RUN echo a | cat
        RUN ["python3", "-c", "print(1)"]
        """,
    )
    assert plan.release == "bookworm" and plan.workdir == "/work/sub"
    assert plan.steps[:2] == (MkdirStep(line=2, path="/work"), MkdirStep(line=3, path="/work/sub"))
    shell_run, exec_run = plan.steps[2:]
    assert isinstance(shell_run, RunStep) and isinstance(exec_run, RunStep)
    assert shell_run.command == "/bin/bash -o pipefail -c 'echo a | cat'"
    assert exec_run.command == "python3 -c 'print(1)'"  # exec form: no shell wrapper
    assert any(s.startswith("USER 1000:1000 (line 4)") for s in plan.substitutions)


def test_heredocs(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        """\
        FROM ubuntu:24.04
        RUN <<EOF
        set -e
        echo one > /tmp/one
        EOF
        RUN python3 <<'PY'
        print("two")
        PY
        RUN <<EOF
        #!/usr/bin/env python3
        print("three")
        EOF
        COPY <<EOF /etc/app.conf
        key=value
        EOF
        RUN echo after
        """,
    )
    script, stdin, shebang, conf, after = plan.steps
    assert isinstance(script, RunStep) and script.command == "set -e\necho one > /tmp/one\n"
    assert isinstance(stdin, RunStep) and stdin.command == "python3 <<'PY'\nprint(\"two\")\nPY\n"
    assert isinstance(shebang, RunStep) and shebang.command.startswith(
        "/usr/bin/env python3 <<'EOF'\n"
    )
    assert isinstance(conf, RunStep) and conf.line == 13
    assert "cat > /etc/app.conf <<EOF\nkey=value\nEOF" in conf.command
    assert isinstance(after, RunStep) and (after.line, after.command) == (16, "echo after")


def test_shifts_and_unclosed_heredocs_do_not_swallow_the_lines_below(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        "FROM ubuntu:24.04\nRUN python3 -c 'x=1; print(x<<y)'\nRUN cat <<NEVER_CLOSED\nRUN echo z\n",
    )
    assert [(s.line, s.command) for s in plan.steps if isinstance(s, RunStep)] == [
        (2, "python3 -c 'x=1; print(x<<y)'"),
        (3, "cat <<NEVER_CLOSED"),
        (4, "echo z"),
    ]


def test_onbuild_and_metadata_instructions_are_ignored_and_recorded(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 'FROM ubuntu:22.04\nONBUILD RUN true\nCMD ["bash"]\nEXPOSE 80\n')
    assert plan.steps == () and plan.release == "bookworm"
    assert {"ONBUILD (line 2) ignored", "CMD (line 3) ignored"} <= set(plan.substitutions)


@pytest.mark.parametrize(
    ("image", "release"),
    [
        ("debian:12", "bookworm"),
        ("debian:12.5-slim", "bookworm"),
        ("debian:bookworm-slim", "bookworm"),
        ("debian:bookworm-20240110", "bookworm"),
        ("debian:13", "trixie"),
        ("debian:13.0-slim", "trixie"),
        ("debian:trixie-slim", "trixie"),
        ("debian:stable-slim", "trixie"),
        ("docker.io/library/debian:trixie", "trixie"),
        ("python:3.11-slim-bookworm", "bookworm"),
        ("python:3.13-slim-bookworm", "trixie"),  # Python 3.13 is trixie's, not bookworm's
        ("python:3.10-slim-bookworm", "bookworm"),
        ("python:bookworm", "bookworm"),
        ("python:3.12-slim-trixie", "trixie"),
        ("ubuntu:noble-20240423", "trixie"),
        ("ubuntu:24.04@sha256:0123456789abcdef0123456789abcdef", "trixie"),
    ],
)
def test_base_tags_by_version_number_and_codename(tmp_path: Path, image: str, release: str) -> None:
    assert _plan(tmp_path, f"FROM {image}\n").release == release


def test_a_python_base_gets_the_python_its_tag_names(tmp_path: Path) -> None:
    """Terminal-Bench's `python:3.13-slim-bookworm` + `uvx -p 3.13` in its verifier: the
    image has Python 3.13 (trixie's), and the substitution line says the release changed."""
    plan = _plan(tmp_path, "FROM python:3.13-slim-bookworm\n")
    assert plan.release == "trixie"
    assert any(
        "python:3.13-slim-bookworm → Debian trixie with its python3 (3.13)" in s
        for s in plan.substitutions
    ), plan.substitutions


@pytest.mark.parametrize(
    ("dockerfile", "line", "category", "words"),
    [
        ("FROM alpine:3.22\n", 1, "base-image", "alpine"),
        ("FROM debian:bullseye\n", 1, "base-image", "Debian 11 is not served"),
        ("FROM debian:11-slim\n", 1, "base-image", "Debian 11 is not served"),
        ("FROM nvidia/cuda:12.1.0-devel-ubuntu22.04\n", 1, "base-image", "unknown base image"),
        ("FROM ubuntu:24.04 AS a\nRUN true\nFROM ubuntu:24.04\n", 3, "base-image", "multi-stage"),
        ("FROM ubuntu:24.04\nCOPY --from=ghcr.io/astral-sh/uv:latest /uv /bin/\n", 2, "base-image", "multi-stage"),
        ("FROM ubuntu:24.04\nRUN apt-get update && git clone https://github.com/a/b /b\n", 2, "network-build", "git clone"),
        ("FROM ubuntu:24.04\nRUN curl -LsSf https://astral.sh/uv/install.sh | sh\n", 2, "network-build", "curl of astral.sh"),
        ("FROM ubuntu:24.04\nRUN \\\n  wget -qO- https://sh.rustup.rs | sh -s -- -y\n", 2, "network-build", "wget of sh.rustup.rs"),
        ("FROM ubuntu:24.04\nRUN pip install git+https://github.com/a/b\n", 2, "network-build", "git+ URL"),
        ("FROM ubuntu:24.04\nADD https://example.com/x.tgz /x\n", 2, "network-build", "internet"),
        ("FROM ubuntu:24.04\nRUN --network=host true\n", 2, "network-build", "network"),
        ("FROM ubuntu:24.04\nFROBNICATE x\n", 2, "malformed", "FROBNICATE"),
        ("FROM ubuntu:24.04\nCOPY missing.txt /app/\n", 2, "malformed", "not found in the build context"),
        ("FROM ubuntu:24.04\nCOPY ../outside /app/\n", 2, "malformed", "leaves the build context"),
        ("RUN true\n", 1, "malformed", "before FROM"),
    ],
)  # fmt: skip
def test_refusals_are_one_line_with_their_line_and_category(
    tmp_path: Path, dockerfile: str, line: int, category: str, words: str
) -> None:
    with pytest.raises(UnsupportedEnvironment) as caught:
        _plan(tmp_path, dockerfile)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(
        f"{tmp_path / 'ctx' / 'Dockerfile'}: line {line}: "
    )
    assert words in message and caught.value.category == category and caught.value.line == line


@pytest.mark.parametrize(
    ("dockerfile", "files", "words"),
    [
        # Terminal-Bench's bn-fit-modify: the URL comes in through an ARG
        ("FROM ubuntu:24.04\nWORKDIR /app\nARG URL=https://raw.example.com/d.csv\nRUN curl -fsSL \"${URL}\" -o d.csv\n", {}, "curl of raw.example.com"),
        ("FROM ubuntu:24.04\nENV REPO=https://github.com/a/b\nRUN git clone $REPO /b\n", {}, "git clone"),
        # fix-git / sanitize-git-repo: the clone is in a script the build context holds
        ("FROM ubuntu:24.04\nWORKDIR /app\nCOPY setup.sh ./\nRUN bash /app/setup.sh && rm /app/setup.sh\n",
         {"setup.sh": "git config --global user.name T\n# git clone in a comment\ngit clone https://github.com/a/b.git\n"},
         "git clone (in setup.sh, line 3, which the step runs)"),
        ("FROM ubuntu:24.04\nWORKDIR /app\nCOPY scripts /opt/s\nRUN cd /opt/s && sh ./get.sh\n",
         {"scripts/get.sh": "apt-get install -y curl\nwget https://data.example.org/x.bin\n"},
         "wget of data.example.org (in scripts/get.sh, line 2, which the step runs)"),
    ],
)  # fmt: skip
def test_a_fetch_through_a_variable_or_a_copied_script_is_a_network_build_refusal(
    tmp_path: Path, dockerfile: str, files: dict[str, str], words: str
) -> None:
    with pytest.raises(UnsupportedEnvironment) as caught:
        _plan(tmp_path, dockerfile, files)
    assert caught.value.category == "network-build" and words in str(caught.value)


def test_a_copied_script_that_only_installs_packages_builds(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        "FROM ubuntu:24.04\nWORKDIR /app\nCOPY setup.sh ./\nRUN bash setup.sh\n",
        {"setup.sh": "apt-get update && apt-get install -y git\npip install pandas\n"},
    )
    assert isinstance(plan.steps[-1], RunStep) and plan.steps[-1].command == "bash setup.sh"


def test_pip_and_apt_from_the_registries_are_not_network_refusals(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        "FROM python:3.11-slim\nRUN apt-get update && apt-get install -y curl\nRUN pip install pandas==2.2.3\n",
    )
    assert len(plan.steps) == 2 and "python3-pip" in plan.packages


# --- task.toml and the solution: what the agent needs --------------------------------------


@pytest.mark.parametrize(
    ("toml", "solve", "field"),
    [
        (GOOD_TOML + '[environment]\nallowed_hosts = ["api.github.com"]\n', None, "environment.allowed_hosts"),
        (GOOD_TOML.replace("[agent]\n", '[agent]\nnetwork_mode = "allowlist"\n'), None, "agent.network_mode"),
        (GOOD_TOML + '[[environment.mcp_servers]]\nname = "s"\nurl = "https://mcp.example.com/sse"\n', None, "environment.mcp_servers"),
        (GOOD_TOML, "#!/bin/bash\n# pip install nothing (a comment)\npip install requests\n", "line 3"),
        (GOOD_TOML, "#!/bin/bash\ncurl -fsSL https://example.com/data.csv -o /app/data.csv\n", "line 2"),
    ],
)  # fmt: skip
def test_a_task_that_declares_the_agent_needs_the_network_is_refused(
    tmp_path: Path, toml: str, solve: str | None, field: str
) -> None:
    _task(tmp_path, "net", toml=toml, solve=solve or "#!/bin/bash\ntrue\n")
    suite = load_harbor_suite(tmp_path, name="d", images_dir=tmp_path / "images")
    (refused,) = suite.refused
    assert refused.category == RefusalCategory.NETWORK_AGENT and f": {field}: " in refused.message
    assert str(refused).startswith("network-agent: ") and "\n" not in str(refused)


def test_allow_internet_true_is_a_permission_not_a_need(tmp_path: Path) -> None:
    _task(
        tmp_path,
        "tb",
        toml=GOOD_TOML + '[environment]\nallow_internet = true\nnetwork_mode = "public"\n',
    )
    suite = load_harbor_suite(tmp_path, name="d", images_dir=tmp_path / "images")
    assert list(suite.templates) == ["tb"] and suite.refused == []


def test_a_docker_compose_environment_is_multi_container(tmp_path: Path) -> None:
    task = _task(tmp_path, "compose")
    (task / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    (refused,) = load_harbor_suite(tmp_path, name="d", images_dir=tmp_path / "images").refused
    assert refused.category == "multi-container" and refused.file.name == "docker-compose.yaml"


# --- a folder mixing runnable and unrunnable tasks -------------------------------------------


def _mixed(root: Path) -> Path:
    root.mkdir(exist_ok=True)
    root.chmod(0o755)
    _task(root, "runs", dockerfile="FROM python:3.13-slim\nWORKDIR /app\nCOPY . /tmp/build/\n")
    _task(root, "alpine", dockerfile="FROM alpine:3.22\n")
    _task(root, "clones", dockerfile="FROM ubuntu:24.04\n\nRUN git clone https://github.com/a/b\n")
    _task(root, "bad-toml", toml='version = "1.0"\n[environment]\ncpus = 0\n')
    (_task(root, "compose") / "environment" / "compose.yaml").write_text("services: {}\n")
    return root


def test_a_mixed_folder_loads_the_runnable_tasks_and_refuses_each_other_in_one_line(
    tmp_path: Path,
) -> None:
    suite = load_harbor_suite(_mixed(tmp_path / "d"), name="d", images_dir=tmp_path / "images")
    assert list(suite.templates) == ["runs"]
    by = {r.task.name: r for r in suite.refused}
    assert {name: str(r.category) for name, r in by.items()} == {
        "alpine": "base-image", "bad-toml": "malformed", "clones": "network-build",
        "compose": "multi-container",
    }  # fmt: skip
    assert by["clones"].line == 3 and by["clones"].file.name == "Dockerfile"
    assert by["bad-toml"].line is None and "environment.cpus" in by["bad-toml"].message
    with pytest.raises(HarborDatasetError) as caught:
        load_harbor_suite(tmp_path / "d", name="d", images_dir=tmp_path / "images", strict=True)
    assert len(str(caught.value).splitlines()) == 5 and "EPIFLOW_SUITES_HARBOR_STRICT" in str(
        caught.value
    )


def test_a_folder_of_only_unrunnable_tasks_is_an_empty_suite(tmp_path: Path) -> None:
    _task(tmp_path, "alpine", dockerfile="FROM alpine:3.22\n")
    suite = load_harbor_suite(tmp_path, name="d", images_dir=tmp_path / "images")
    assert list(suite.templates) == [] and len(suite.refused) == 1


def test_strict_mode_and_the_deprecated_skip_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EPIFLOW_SUITES_HARBOR_STRICT", "EPIFLOW_SUITES_HARBOR_SKIP_INVALID"):
        monkeypatch.delenv(name, raising=False)
    assert SuitesSettings().harbor_strict is False
    monkeypatch.setenv("EPIFLOW_SUITES_HARBOR_SKIP_INVALID", "1")
    assert SuitesSettings().harbor_strict is False
    monkeypatch.setenv("EPIFLOW_SUITES_HARBOR_SKIP_INVALID", "0")
    assert SuitesSettings().harbor_strict is True
    monkeypatch.setenv("EPIFLOW_SUITES_HARBOR_STRICT", "0")
    with pytest.raises(ValueError, match="unset EPIFLOW_SUITES_HARBOR_SKIP_INVALID"):
        SuitesSettings()


def test_suites_list_shows_builtin_runnable_and_refused_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli.suites import app

    monkeypatch.setenv("EPIFLOW_SUITES_PATH", str(_mixed(tmp_path / "dataset")))
    monkeypatch.setenv("EPIFLOW_SUITES_HARBOR_IMAGE_DIR", str(tmp_path / "images"))
    result = CliRunner().invoke(app, ["list", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    suites = {s["name"]: s for s in data["suites"]}
    assert "builtin" in suites and data["errors"] == []
    assert [t["template"] for t in suites["dataset"]["templates"]] == ["runs"]
    assert sorted(r["category"] for r in suites["dataset"]["refused"]) == [
        "base-image", "malformed", "multi-container", "network-build",
    ]  # fmt: skip


def test_epiflow_suites_list_with_a_mixed_folder_never_tracebacks(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "EPIFLOW_SUITES_PATH": str(_mixed(tmp_path / "dataset")),
        "EPIFLOW_SUITES_HARBOR_IMAGE_DIR": str(tmp_path / "images"),
        "COLUMNS": "200",
    }
    done = subprocess.run(
        [str(Path(sys.executable).parent / "epiflow"), "suites", "list"], env=env, capture_output=True, text=True,
        cwd=REPO, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    refused = [line for line in done.stdout.splitlines() if line.startswith("refused ")]
    assert len(refused) == 4 and any(
        line.startswith("refused network-build: ") and "Dockerfile: line 3: RUN git clone" in line
        for line in refused
    )
    assert "builtin" in done.stdout and "runs" in done.stdout


# --- a build failure is that task's outcome --------------------------------------------------


def test_an_unbuilt_environment_ends_the_episode_as_env_error_before_any_jail(
    tmp_path: Path,
) -> None:
    from agent.loop import run_episode
    from agent.policies import make_policy
    from agent.settings import LoopSettings, PolicySettings
    from agent.trajectory import EpisodeStatus
    from sandbox import SandboxSpec
    from sandbox.images import ImageBuildError

    _task(tmp_path, "t")
    suite = load_harbor_suite(tmp_path, name="d", images_dir=tmp_path / "images")
    task = suite.generate("t", 0).model_copy(
        update={
            "environment": suite.unbuilt_environment(
                "t", ImageBuildError("Dockerfile:3: RUN: exit code 2")
            )
        }
    )

    async def no_jail(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("a task without its image must not open a jail")

    traj = asyncio.run(
        run_episode(
            task, make_policy("scripted:oracle", settings=PolicySettings()), spec=SandboxSpec(), run_key="t",
            settings=LoopSettings(), open_sandbox=no_jail,  # type: ignore[arg-type]
        )
    )  # fmt: skip
    assert traj.status == EpisodeStatus.ENV_ERROR
    assert (
        traj.failure_reason == "the task's image could not be built: Dockerfile:3: RUN: exit code 2"
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mmdebstrap") is None or not INTEROP.is_dir(),
    reason="needs root, mmdebstrap (scripts/system-deps.sh) and ../shared/interop/harbor-tasks",
)
@pytest.mark.slow(reason="builds Harbor task images with mmdebstrap")
def test_check_runs_every_task_when_one_image_does_not_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cli.suites import app

    IMAGES.mkdir(exist_ok=True)
    IMAGES.chmod(0o755)
    root = Path(tempfile.mkdtemp(dir=IMAGES.parent))
    root.chmod(0o755)
    try:
        dataset = root / "mixed"
        dataset.mkdir()
        dataset.chmod(0o755)
        shutil.copytree(INTEROP / "hello-world", dataset / "hello-world")
        _task(
            dataset,
            "breaks",
            dockerfile="FROM ubuntu:24.04\nWORKDIR /app\nRUN echo broken >&2; exit 3\n",
        )
        _task(dataset, "alpine", dockerfile="FROM alpine:3.22\n")
        for path in [dataset, *dataset.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        monkeypatch.setenv("EPIFLOW_SUITES_PATH", str(dataset))
        monkeypatch.setenv("EPIFLOW_SUITES_HARBOR_IMAGE_DIR", str(IMAGES))
        result = CliRunner().invoke(
            app, ["check", "--suite", "mixed", "--instances", "1", "--json"]
        )
        assert result.exit_code == 1, result.output  # an env_error is reported, never an abort
        report = json.loads(result.stdout)
        rows = {row["task"]: row for row in report["harbor_tasks"]}
        assert rows["hello-world"]["score"] == 1.0 and rows["hello-world"]["env_errors"] == 0
        assert rows["hello-world"]["idle_score"] == 0.0
        broken = rows["breaks"]
        assert (
            broken["env_errors"] == 1 and broken["build_s"] is None and broken["idle_score"] is None
        )
        assert "could not be built" in broken["reason"] and ":3: RUN" in broken["reason"]
        assert [r["category"] for r in report["harbor_refused"]] == ["base-image"]
        assert report["environment_errors"] == 1
        below = {t["template"]: t["below_full"] for t in report["templates"]}
        assert below == {"breaks": 0, "hello-world": 0}  # not scored: the reference is not blamed
        assert "reference solution or its verifier is wrong" not in result.output
    finally:
        shutil.rmtree(root, ignore_errors=True)
