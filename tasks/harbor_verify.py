"""A Harbor task's verifier as written: `tests/test.sh` in a verifier jail of the task's image.

After the agent's episode (`tasks.verify.run_verifier` hands tasks with an environment
here): every process the agent left is killed, the agent's final workdir is exported from
its jail (its files and their shape: permission bits, folders, symlinks), and a fresh
**verifier jail** of the same image starts with that workdir, the
task's `tests/` copied to a writable `/tests` (the agent's jail never had it), a writable
`/logs` (tmpfs) and the offline toolkit at `/opt/epiflow` (`suites/harbor/toolkit.py`,
its shims first on `PATH`). `bash /tests/test.sh` runs there, as written, from the workdir.

The reward comes from `/logs/verifier/reward.txt` (a number) or `reward.json` (an object of
named numbers: `reward`, else `score`, else the suite's reward rule over them, the mean by
default: `tasks/harbor_reward.py`; every key is stored); it must lie in [0, 1]. `ctrf.json`, when written, is stored (an object of the episode, with its `artifact` row) with its per-test
results. A script that exits non-zero without writing a reward (`set -e` before a failing
pytest) scores 0, and so does a workdir the agent filled past the export's caps (files,
bytes) while the image's own workdir fits them. Infrastructure errors (`error=True`, the
episode becomes `env_error`): something needed the network or a Python the image lacks
(`/logs/.epiflow-offline`), a timeout, no reward after exit 0, a malformed or out-of-range
reward, a verifier jail that cannot start, an image whose own workdir is past the caps.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from sandbox.errors import SandboxError
from sandbox.image_spec import ImageMount
from sandbox.interface import Sandbox
from sandbox.settings import SandboxSettings
from sandbox.spec import MIN_PROCESS_MEMORY_MIB, SandboxSpec
from sandbox.transfer import ExportReport
from tasks.environment import TaskEnvironment
from tasks.harbor_reward import reward_from
from tasks.types import TaskInstance
from tasks.verify import MAX_RAW_CHARS, VerifierOutcome

CTRF_CAP = 512 * 1024
"""Bytes of `ctrf.json` kept (the rest would not fit the executor's output cap)."""
TESTS_SOURCE = "/.epiflow/tests"
"""Where the task's `tests/` is bound read-only in the verifier jail; `test.sh` runs from a
writable copy at `/tests` (a tmpfs), as Harbor copies it into the container: some tests
build there (`cd /tests && python setup.py build_ext --inplace`)."""
OFFLINE_MARKER = "/logs/.epiflow-offline"
"""Where the shims record what needed the network (the verifier jail's `/logs` tmpfs)."""

TOOLKIT_ENV = {
    "UV_OFFLINE": "1",
    "UV_NO_INDEX": "1",
    "UV_FIND_LINKS": "/opt/epiflow/wheels",
    "UV_PYTHON_DOWNLOADS": "never",
    "UV_PYTHON_PREFERENCE": "only-system",
    "UV_CACHE_DIR": "/tmp/.uv-cache",
    "UV_LINK_MODE": "hardlink",
    "UV_NO_CONFIG": "1",
    "UV_NO_PROGRESS": "1",
    "PIP_NO_INDEX": "1",
    "PIP_FIND_LINKS": "/opt/epiflow/wheels",
    "PIP_BREAK_SYSTEM_PACKAGES": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}
"""The verifier jail's extra environment (besides `PATH`). uv links from its cache (the same
`/tmp`) rather than copying, so requirements take their room once; `UV_NO_CONFIG`: a
`uv.toml` or `pyproject.toml` the agent left in the workdir does not steer the verifier's uv."""

SHIMS_PATH = "/opt/epiflow/shims:/root/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The shims first; then `$HOME/.local/bin`, where a verify-time `pip install` puts its
scripts (the image's site-packages are read-only, so pip installs for the user)."""

_COLLECT = f"""\
import json, os
out = {{}}
for name, path, cap in (
    ("reward_txt", "/logs/verifier/reward.txt", 4096),
    ("reward_json", "/logs/verifier/reward.json", 65536),
    ("ctrf", "/logs/verifier/ctrf.json", {CTRF_CAP}),
    ("offline", "{OFFLINE_MARKER}", 8192),
):
    try:
        with open(path, "rb") as f:
            data = f.read(cap + 1)
    except OSError:
        continue
    out[name] = data[:cap].decode("utf-8", "replace")
    if len(data) > cap:
        out[name + "_truncated"] = True
print(json.dumps(out))
"""


def _read_tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _overflow(report: ExportReport, max_files: int) -> str:
    """What of an export's caps a workdir passed, in a few words."""
    parts = []
    if report.left_out:
        parts.append(f"{report.left_out} files past the {max_files}-file cap")
    over = [p for p, r in report.skipped.items() if r == "over_size_cap"]
    if over or report.truncated:
        parts.append(f"{len(over)} files over the byte cap")
    other = sorted({r for r in report.skipped.values() if r != "over_size_cap"})
    if other:
        parts.append("files skipped: " + ", ".join(other)[:200])
    return "; ".join(parts) or "export truncated"


def _pristine_workdir_fits(env: TaskEnvironment, settings: SandboxSettings) -> bool:
    """Whether the image's own workdir (what every episode starts from) fits the export's
    caps: its bytes were already checked when the agent's jail was seeded, its file count
    is counted here."""
    base = Path(env.image.root) / env.image.workdir.lstrip("/")
    count = 0
    for folder, dirs, names in os.walk(base):
        dirs[:] = [d for d in dirs if not (Path(folder) / d).is_symlink()]
        count += sum(1 for n in names if (Path(folder) / n).is_file())
        if count > settings.max_tracked_files:
            return False
    return True


def verifier_spec(env: TaskEnvironment, agent_spec: SandboxSpec) -> SandboxSpec:
    """The verifier jail's spec: the agent's, with `/tests`, the toolkit and `/logs` added,
    and each tmpfs (`/tmp` holds uv's cache and the test environment it builds) as large as
    the task's memory allows beside the workdir: a tmpfs takes RAM only as it fills, charged
    to the jail's memory limit."""
    image = env.image
    verifier_image = ImageMount(
        root=image.root,
        digest=image.digest,
        workdir=image.workdir,
        python=image.python,
        env=image.env,
        writable=(*image.writable, "/logs", "/tests"),
        binds_ro=((env.tests_dir, TESTS_SOURCE), (env.toolkit_dir, "/opt/epiflow")),
    )
    data = agent_spec.model_dump()
    hard = max(env.verifier_timeout_s + 60.0, 120.0)
    room = agent_spec.memory_mib - agent_spec.workspace_mib - MIN_PROCESS_MEMORY_MIB
    data.update(
        image=verifier_image,
        tmpfs_mib=max(agent_spec.tmpfs_mib, room),
        hard_timeout_s=hard,
        soft_timeout_s=hard - 30.0,
        max_call_timeout_s=max(env.verifier_timeout_s, data["max_call_timeout_s"]),
        env={**agent_spec.env, **TOOLKIT_ENV, "PATH": SHIMS_PATH},
    )
    return SandboxSpec(**data)


def _error(reason: str, details: dict[str, Any], started: float, **raw: Any) -> VerifierOutcome:
    return VerifierOutcome(
        score=0.0,
        reason=f"verifier error: {reason}"[:500],
        error=True,
        details=details,
        duration_ms=(time.perf_counter() - started) * 1000.0,
        **raw,
    )


_NO_PYTHON = re.compile(r"No interpreter found for Python ([0-9][0-9.]*)", re.IGNORECASE)
_NO_SPACE = re.compile(r"No space left on device", re.IGNORECASE)


def offline_reason(marker: str) -> str:
    """The infrastructure error of what the shims recorded as needing the network: a Python
    the image lacks is named as such (epiflow never downloads one), the rest as network."""
    lines = marker.strip().splitlines()
    for line in lines:
        if _NO_SPACE.search(line):
            return (
                "the verifier's requirements do not fit its jail's RAM-backed /tmp (uv's cache "
                f"and environments; the task's memory less its workdir): {line}"
            )
        missing = _NO_PYTHON.search(line)
        if missing:
            return (
                f"the verifier needs Python {missing.group(1).rstrip('.')}, which the image does "
                f"not have and epiflow does not download: {line}"
            )
    needed = "; ".join(lines[:3])
    return (
        f"the verifier needs the network, which epiflow's jails never have: {needed} "
        "(docs/harbor.md lists what runs offline)"
    )


def ctrf_tests(text: str) -> list[dict[str, Any]]:
    """Per-test results of a CTRF report: name, status, duration_ms, message (may be empty)."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    tests = data.get("results", {}).get("tests", []) if isinstance(data, dict) else []
    out: list[dict[str, Any]] = []
    for test in tests if isinstance(tests, list) else []:
        if not isinstance(test, dict):
            continue
        duration = test.get("duration")
        out.append(
            {
                "name": str(test.get("name", ""))[:1000],
                "status": str(test.get("status", "other"))[:32],
                "duration_ms": float(duration) if isinstance(duration, int | float) else None,
                "message": str(test.get("message") or test.get("trace") or "")[:2000],
            }
        )
    return out


async def run_harbor_verifier(sandbox: Sandbox, task: TaskInstance) -> VerifierOutcome:
    """Run the task's `tests/test.sh` over the agent's final workdir; never raises for a
    broken verifier (an `error=True` outcome instead).

    Raises:
        SandboxCrashed, EpisodeHardTimeout: the agent's jail failed while being exported.
    """
    env = task.environment
    assert env is not None  # run_verifier routes only such tasks here
    started = time.perf_counter()
    details: dict[str, Any] = {
        "harbor": {
            "image": env.image.digest,
            "substitutions": list(env.substitutions),
            "metadata": env.metadata,
            "build_s": env.build_s,
        }
    }
    info = details["harbor"]
    export = getattr(sandbox, "export", None)
    settings = getattr(sandbox, "settings", None)
    agent_spec = getattr(sandbox, "spec", None)
    if (
        export is None
        or not isinstance(settings, SandboxSettings)
        or not isinstance(agent_spec, SandboxSpec)
    ):
        return _error(
            "a Harbor verifier needs an nsjail sandbox (export, settings, spec)", details, started
        )
    await sandbox.stop_processes()
    scratch = Path(tempfile.mkdtemp(prefix="epiflow-harbor-"))
    try:
        report = await export(scratch, max_bytes=settings.populate_max_bytes)
        if report.truncated or report.left_out or report.skipped:
            what = _overflow(report, settings.max_tracked_files)
            host_side = any(r.startswith("host_error") for r in report.skipped.values())
            fits = await asyncio.to_thread(_pristine_workdir_fits, env, settings)
            if not host_side and fits:
                # The task's own workdir fits the caps, so the agent filled it: scoring this
                # as an infrastructure error would let an agent that is failing swap its
                # failure reward for none at all.
                return VerifierOutcome(
                    score=0.0,
                    reason=f"the agent left its workdir too large to verify ({what}): score 0",
                    details=details,
                    duration_ms=(time.perf_counter() - started) * 1000.0,
                )
            return _error(
                f"the agent's workdir is too large to hand to the verifier ({what})",
                details,
                started,
            )
        files = await asyncio.to_thread(_read_tree, scratch)
        shape = report.shape
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    from sandbox.factory import activate, start_jail
    from sandbox.host import prepare_host

    spec = verifier_spec(env, agent_spec)
    try:
        host = await prepare_host(settings)
        jail = await start_jail(spec, host, settings)
        box = await activate(
            jail, spec, host, settings, files=files, faults=None, fault_seed=0, shape=shape
        )
    except SandboxError as e:
        return _error(f"the verifier jail could not start: {e}", details, started)
    try:
        workdir = env.image.workdir
        script = (
            f"mkdir -p /logs/verifier /logs/agent && cp -R {TESTS_SOURCE}/. /tests/ "
            f"&& cd {workdir} && exec bash /tests/test.sh"
        )
        run = await box.exec(["/bin/bash", "-c", script], timeout_s=env.verifier_timeout_s)
        collected_run = await box.run_python(_COLLECT, timeout_s=30)
    except SandboxError as e:
        return _error(f"the verifier jail failed: {type(e).__name__}: {e}", details, started)
    finally:
        await box.close()
    raw = {
        "exit_code": run.exit_code,
        "timed_out": run.timed_out,
        "stdout": run.stdout.decode("utf-8", "replace")[-MAX_RAW_CHARS:],
        "stderr": run.stderr.decode("utf-8", "replace")[-MAX_RAW_CHARS:],
    }
    info["test_sh_exit_code"] = run.exit_code
    info["verify_s"] = round(time.perf_counter() - started, 3)
    try:
        collected: dict[str, str] = json.loads(collected_run.stdout.decode("utf-8", "replace"))
    except ValueError:
        return _error(
            "could not read /logs/verifier from the verifier jail", details, started, **raw
        )
    if "ctrf" in collected:
        info["ctrf"] = collected["ctrf"]
        info["tests"] = ctrf_tests(collected["ctrf"])
    if "offline" in collected:
        return _error(offline_reason(collected["offline"]), details, started, **raw)
    if run.timed_out:
        return _error(
            f"tests/test.sh timed out after {env.verifier_timeout_s:g} s", details, started, **raw
        )
    try:
        score, keys, source = reward_from(collected, env.reward_rule)
    except ValueError as e:
        return _error(str(e), details, started, **raw)
    info["reward"] = keys
    info["reward_source"] = source
    info["reward_rule"] = env.reward_rule
    duration_ms = (time.perf_counter() - started) * 1000.0
    if score is None:
        if run.exit_code not in (0, None):
            return VerifierOutcome(
                score=0.0,
                reason=f"tests/test.sh exited {run.exit_code} without writing a reward (tests failed)",
                details=details, duration_ms=duration_ms, **raw,
            )  # fmt: skip
        return _error(
            "tests/test.sh wrote neither /logs/verifier/reward.txt nor reward.json",
            details,
            started,
            **raw,
        )
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        return _error(f"reward {score!r} ({source}) is outside [0, 1]", details, started, **raw)
    passed = sum(1 for t in info.get("tests", []) if t["status"] == "passed")
    total = len(info.get("tests", []))
    tests = f", {passed}/{total} tests passed" if total else ""
    return VerifierOutcome(
        score=score, reason=f"reward {score:g} ({source}){tests}", details=details,
        duration_ms=duration_ms, **raw,
    )  # fmt: skip
