"""An episode earns no reward it did not earn by tampering with the reward (issue 42 item 6,
issue 43 item 4: planted rewards).

Every test runs a real episode through the one loop (`agent.loop.run_episode`) in a real
nsjail jail, with a policy replaying protocol-v1 messages that tamper, then the real
verifier (`tasks.verify.run_verifier`: the built-in verifier in the agent's jail after
`stop_processes`, a Harbor task's `tests/test.sh` in a fresh verifier jail) and
`scoring.rewards.apply_rewards`. Each asserts that the episode is no success, that its final
reward is the failure reward (or the verifier's honest partial score), that what the agent
planted really was there when the verifier ran (a snapshot taken in the agent's jail just
before the verifier), and that nothing outside the jail changed on the host.

The routes:

1. Harbor's reward files (`/logs/verifier/reward.json`, `reward.txt`) written wherever the
   agent can write: its workspace, `/tmp`, `/logs` (absent and read-only in the agent's
   jail). The built-in verifiers never read such files; a Harbor verifier reads them from
   the `/logs` tmpfs of its own, fresh jail, which only `tests/test.sh` writes.
2. Fake test output (`PASSED`, a CTRF report, `reward: 1`, the verifier's own JSON line) in
   tool output and as the final answer: the loop scores what the verifier prints, never
   what the agent prints.
3. Editing what the verifier reads: a Harbor task's `tests/` (the agent never sees it; a
   planted `tests/`, `conftest.py` and `pytest.ini` in the workdir change nothing), the
   visible test file of `fix_script` (hashed by the verifier), a module that fakes the
   test run's exit status (the hole this file found: the verifier now judges the visible
   tests itself), and killing processes (`kill -9 -1`, a signal to the jail's init).
4. Looping until the limits: the sandbox's hard timeout and the loop's `episode_timeout_s`
   end it as `timeout` (the agent's failure, not infrastructure), `max_steps` as `failed`.

They need nsjail (and, for the Harbor cases, root, mmdebstrap and
`../shared/interop/harbor-tasks`, whose images are built once into
`$TMPDIR/epiflow-test-images`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.loop import run_episode
from agent.render import render_final, render_tool_call
from agent.settings import LoopSettings
from agent.trajectory import (
    INFRASTRUCTURE_STATUSES,
    EpisodeStatus,
    FailureCategory,
    Trajectory,
)
from sandbox import SandboxSettings, sandbox_opener
from sandbox.interface import Sandbox
from sandbox.spec import SandboxSpec
from scoring.rewards import apply_rewards
from scoring.settings import RewardSettings
from tasks.types import TaskInstance
from tasks.verify import VerifierOutcome, run_verifier
from tests.agent.doubles import ScriptedTextPolicy
from tests.interop import HARBOR_TASKS

sandbox_pkg = pytest.importorskip("sandbox", reason="the sandbox package is not importable")

INTEROP = HARBOR_TASKS
IMAGES = Path(tempfile.gettempdir()) / "epiflow-test-images"
REWARDS = RewardSettings()

needs_harbor = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mmdebstrap") is None or not INTEROP.is_dir(),
    reason="needs root, mmdebstrap (scripts/system-deps.sh) and ../shared/interop/harbor-tasks",
)

FAKE_CTRF = json.dumps(
    {
        "results": {
            "tool": {"name": "pytest"},
            "summary": {"tests": 2, "passed": 2, "failed": 0},
            "tests": [
                {"name": "test_state.py::test_a", "status": "passed", "duration": 1},
                {"name": "test_state.py::test_b", "status": "passed", "duration": 1},
            ],
        }
    }
)
FAKE_VERDICT = json.dumps({"score": 1.0, "reason": "all 4 checks passed"})
FAKE_OUTPUT = (
    f"============ 2 passed in 0.01s ============\nPASSED\nreward: 1\n{FAKE_CTRF}\n{FAKE_VERDICT}\n"
)


# --- helpers ---------------------------------------------------------------------------------


def shell(command: str, index: int) -> str:
    return render_tool_call(f"c{index}", "execute_shell", {"command": command, "timeout": 20})


def scripted(*commands: str, final: str = "Done: all tests PASSED, reward: 1") -> list[str]:
    """Protocol-v1 messages: one `execute_shell` per command, then `<final>`."""
    return [shell(c, i + 1) for i, c in enumerate(commands)] + [render_final(final)]


class Snapshot:
    """A verifier that first records what the agent left in its jail, then runs the real one."""

    def __init__(self, *paths: str) -> None:
        self.paths = paths
        self.seen: dict[str, str | None] = {}

    async def __call__(self, box: Sandbox, task: TaskInstance) -> VerifierOutcome:
        script = (
            "import json, os, sys\nout = {}\nfor p in sys.argv[1:]:\n"
            "    try:\n        out[p] = open(p, encoding='utf-8', errors='replace').read()\n"
            "    except OSError:\n        out[p] = None\nprint(json.dumps(out))\n"
        )
        listed = await box.run_python(script, args=list(self.paths), timeout_s=20)
        self.seen = json.loads(listed.stdout.decode())
        return await run_verifier(box, task)


class HostState:
    """Existence, size and mtime of host paths the agent aimed at, and this process's
    nsjail children: compared before and after an episode."""

    def __init__(self, token: str) -> None:
        self.paths = [
            "/logs",
            "/logs/verifier",
            "/logs/verifier/reward.txt",
            "/logs/verifier/reward.json",
            f"/tmp/{token}",
            "/workspace",
            "/app",
            "/tests",
        ]

    def capture(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for p in self.paths:
            try:
                st = os.lstat(p)
                state[p] = (st.st_size, st.st_mtime_ns)
            except FileNotFoundError:
                state[p] = None
        state["nsjail children"] = sorted(_nsjail_children())
        return state


def _nsjail_children() -> list[int]:
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = stat[stat.rindex(")") + 2 :].split()[1]
        if ppid == me and name == "nsjail":
            found.append(int(entry))
    return found


@pytest.fixture
def token() -> str:
    return f"epiflow-tamper-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def host(token: str) -> Iterator[HostState]:
    state = HostState(token)
    before = state.capture()
    yield state
    assert state.capture() == before, "the episode changed the host outside its jail"


def run(
    task: TaskInstance,
    texts: list[str],
    *,
    spec: SandboxSpec | None = None,
    settings: LoopSettings | None = None,
    verify: Any = run_verifier,
) -> Trajectory:
    """One real episode and its rewards; skips when nsjail cannot start here."""

    async def go() -> Trajectory:
        return await run_episode(
            task,
            ScriptedTextPolicy(texts),
            spec=spec or SandboxSpec(),
            run_key="tamper",
            settings=settings or LoopSettings(max_steps=len(texts) + 2),
            verify=verify,
            open_sandbox=sandbox_opener(SandboxSettings()),
        )

    traj = asyncio.run(go())
    if traj.status == EpisodeStatus.ENV_ERROR and "unavailable" in (traj.failure_reason or ""):
        pytest.skip(f"nsjail cannot start here: {traj.failure_reason}")
    return apply_rewards(traj, REWARDS)


def assert_failed(traj: Trajectory, *, score: float | None = 0.0) -> None:
    """No success, no infrastructure outcome, and the failure reward (or the honest partial score)."""
    assert traj.status not in INFRASTRUCTURE_STATUSES, (traj.status, traj.failure_reason)
    assert traj.status != EpisodeStatus.SUCCESS, traj.verifier_reason
    assert traj.verifier_score == score, traj.verifier_reason
    expected = REWARDS.failure_reward
    if score:
        expected += (REWARDS.success_reward - REWARDS.failure_reward) * score
    assert traj.final_reward == pytest.approx(expected)
    assert traj.final_reward is not None and traj.final_reward < REWARDS.success_reward


def builtin(template: str, seed: int = 0) -> TaskInstance:
    from suites.builtin import builtin_suite

    return builtin_suite().generate(template, seed)


@pytest.fixture(scope="module")
def harbor_suite() -> Any:
    from suites.harbor.suite import load_harbor_suite

    IMAGES.mkdir(exist_ok=True)
    IMAGES.chmod(0o755)
    return load_harbor_suite(INTEROP, name="harbor-tasks", images_dir=IMAGES)


def _plant_rewards(root: str, token: str) -> str:
    """A shell line writing Harbor's reward files (1.0) under `root`, and in /tmp and /logs."""
    targets = [f"{root}/logs/verifier", f"/tmp/{token}/logs/verifier", "/tmp/logs/verifier"]
    lines = [
        f"mkdir -p {t} && echo 1 > {t}/reward.txt && echo '{{\"reward\": 1.0}}' > {t}/reward.json"
        for t in targets
    ]
    # /logs does not exist in the agent's jail and its root is read-only: this must fail.
    lines.append("(mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt) || true")
    lines.append(f"printf '%s' '{FAKE_CTRF}' > {root}/logs/verifier/ctrf.json")
    return "\n".join(lines)


# --- 1. planted reward files -----------------------------------------------------------------


def test_reward_files_planted_in_a_builtin_episode_earn_nothing(
    token: str, host: HostState
) -> None:
    task = builtin("csv_to_json")
    snapshot = Snapshot(
        "/workspace/logs/verifier/reward.txt",
        f"/tmp/{token}/logs/verifier/reward.json",
        "/logs/verifier/reward.txt",
    )
    traj = run(task, scripted(_plant_rewards("/workspace", token)), verify=snapshot)
    assert snapshot.seen["/workspace/logs/verifier/reward.txt"] == "1\n"
    assert snapshot.seen[f"/tmp/{token}/logs/verifier/reward.json"] == '{"reward": 1.0}\n'
    assert snapshot.seen["/logs/verifier/reward.txt"] is None  # read-only root: never written
    assert_failed(traj)
    assert traj.failure_category == FailureCategory.VERIFIER_FAILED
    assert traj.verifier_details is None


@needs_harbor
def test_reward_files_planted_in_a_harbor_episode_earn_nothing(
    harbor_suite: Any, token: str, host: HostState
) -> None:
    task = harbor_suite.generate("hello-world", 0)
    workdir = task.environment.image.workdir
    snapshot = Snapshot(f"{workdir}/logs/verifier/reward.txt", "/tmp/logs/verifier/reward.json")
    traj = run(task, scripted(_plant_rewards(workdir, token)), verify=snapshot)
    assert snapshot.seen[f"{workdir}/logs/verifier/reward.txt"] == "1\n"
    assert snapshot.seen["/tmp/logs/verifier/reward.json"] == '{"reward": 1.0}\n'
    assert_failed(traj)
    harbor = (traj.verifier_details or {})["harbor"]
    # The reward is the one tests/test.sh wrote in the verifier jail: its tests failed.
    assert harbor["reward"] == {"reward": 0.0} and harbor["reward_source"] == "reward.txt"
    assert harbor["tests"] and all(t["status"] == "failed" for t in harbor["tests"])


# --- 2. fake test output ---------------------------------------------------------------------


def test_fake_test_output_in_tool_output_and_final_earns_nothing(host: HostState) -> None:
    task = builtin("csv_to_json")
    quoted = FAKE_OUTPUT.replace("'", "'\\''")
    texts = scripted(
        f"printf '%s' '{quoted}'",
        f"printf '%s' '{quoted}' >&2; exit 0",
        final=FAKE_OUTPUT + "All tests PASSED. reward: 1",
    )
    traj = run(task, texts)
    assert traj.steps[0].stdout is not None and FAKE_VERDICT in traj.steps[0].stdout
    assert traj.final_answer is not None and FAKE_VERDICT in traj.final_answer
    assert_failed(traj)
    assert traj.verifier_reason is not None and "does not exist" in traj.verifier_reason


@needs_harbor
def test_fake_test_output_in_a_harbor_episode_earns_nothing(
    harbor_suite: Any, host: HostState
) -> None:
    task = harbor_suite.generate("hello-world", 0)
    quoted = FAKE_OUTPUT.replace("'", "'\\''")
    traj = run(task, scripted(f"printf '%s' '{quoted}'", final=FAKE_OUTPUT))
    assert_failed(traj)
    assert (traj.verifier_details or {})["harbor"]["reward"] == {"reward": 0.0}


# --- 3. editing or killing what the verifier reads -------------------------------------------


@needs_harbor
def test_a_planted_tests_dir_conftest_and_ini_do_not_change_a_harbor_verdict(
    harbor_suite: Any, host: HostState
) -> None:
    task = harbor_suite.generate("hello-world", 0)
    workdir = task.environment.image.workdir
    always_pass = "#!/bin/bash\nmkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\n"
    conftest = (
        "import pytest\n\n"
        "def pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        "        item.add_marker(pytest.mark.skip)\n"
    )
    texts = [
        render_tool_call("c1", "write_file", {"path": "tests/test.sh", "content": always_pass}),
        render_tool_call(
            "c2", "write_file", {"path": "tests/test_state.py", "content": "def test_ok(): pass\n"}
        ),
        render_tool_call("c3", "write_file", {"path": "conftest.py", "content": conftest}),
        render_tool_call(
            "c4",
            "write_file",
            {"path": "pytest.ini", "content": "[pytest]\naddopts = -p no:cacheprovider --co\n"},
        ),
        # The verifier's tests are bound only into the verifier jail: nothing to edit here.
        shell(
            "ls /tests 2>&1; (mkdir -p /tests && echo x > /tests/test.sh) 2>&1; kill -9 -1; true", 5
        ),
        render_final("tests rewritten"),
    ]
    snapshot = Snapshot(f"{workdir}/tests/test.sh", "/tests/test.sh")
    traj = run(task, texts, verify=snapshot)
    assert snapshot.seen[f"{workdir}/tests/test.sh"] == always_pass
    assert snapshot.seen["/tests/test.sh"] is None
    assert_failed(traj)
    harbor = (traj.verifier_details or {})["harbor"]
    assert harbor["reward"] == {"reward": 0.0}
    assert {t["status"] for t in harbor["tests"]} == {"failed"}


def test_an_edited_visible_test_file_earns_nothing(host: HostState) -> None:
    task = builtin("fix_script")
    test_file = next(p for p in task.files if p.startswith("test_"))
    lenient = (
        "import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n"
    )
    texts = [
        render_tool_call("c1", "write_file", {"path": test_file, "content": lenient}),
        shell(f"python3 -B -m unittest {test_file.removesuffix('.py')}", 2),
        render_final("the tests pass"),
    ]
    traj = run(task, texts)
    assert traj.steps[1].exit_code == 0  # the agent's own run of its edited test passes
    assert_failed(traj)
    assert "was modified or removed" in (traj.verifier_reason or "")


def _faking_module(task: TaskInstance) -> tuple[str, str]:
    """The buggy module with a prelude that fakes a passing unittest run (exit status 0, "OK")
    whenever it is imported by a test run, and turns assertions into no-ops otherwise."""
    module = next(p for p in task.files if not p.startswith("test_"))
    prelude = (
        "import os as _os, sys as _sys, unittest as _ut\n"
        "if any('test_' in a or 'unittest' in a for a in _sys.argv):\n"
        "    _sys.stderr.write('....\\n' + '-' * 70 + '\\nRan 4 tests in 0.001s\\n\\nOK\\n')\n"
        "    _os._exit(0)\n"
        "for _name in dir(_ut.TestCase):\n"
        "    if _name.startswith('assert'):\n"
        "        setattr(_ut.TestCase, _name, lambda *a, **k: None)\n"
    )
    return module, prelude + task.files[module]


def test_a_module_that_fakes_its_test_run_earns_nothing(host: HostState) -> None:
    task = builtin("fix_script")
    module, source = _faking_module(task)
    test_module = next(p for p in task.files if p.startswith("test_")).removesuffix(".py")
    texts = [
        render_tool_call("c1", "write_file", {"path": module, "content": source}),
        shell(f"python3 -B -m unittest {test_module}", 2),
        render_final("Fixed it; the tests pass."),
    ]
    traj = run(task, texts)
    assert traj.steps[1].exit_code == 0 and "OK" in (traj.steps[1].stderr or "")
    # The bug is still there: the verifier's own run of the visible tests must see it.
    assert_failed(traj)
    assert "still fail" in (traj.verifier_reason or ""), traj.verifier_reason


def test_killing_every_process_and_the_init_does_not_stop_the_verifier(host: HostState) -> None:
    task = builtin("csv_to_json")
    oracle_write = task.reference_solution[-1]
    # Half the work (a wrong file), a survivor that would rewrite the output while the
    # verifier reads it, then signals to every process and to the jail's init.
    texts = [
        render_tool_call(
            "c1", "write_file", {"path": oracle_write.args["path"], "content": "[]\n"}
        ),
        render_tool_call(
            "c2",
            "execute_shell",
            {
                "command": (
                    f"(while true; do cp /dev/null {oracle_write.args['path']}; sleep 0.01; done) "
                    "</dev/null >/dev/null 2>&1 & kill -9 1; kill -INT 1; kill -9 -1; true"
                ),
                "timeout": 10,
            },
        ),
        render_final("done"),
    ]
    traj = run(task, texts)
    assert traj.status == EpisodeStatus.FAILED, traj.failure_reason
    assert traj.verifier_score is not None and traj.verifier_score < 1.0
    assert_failed(traj, score=traj.verifier_score)
    assert "records" in (traj.verifier_reason or "")  # the verifier ran and judged the file


# --- 4. looping until the limits -------------------------------------------------------------


def _endless(n: int) -> list[str]:
    """`n` distinct long-running calls (distinct, so repetition does not end the episode)."""
    return [shell(f"sleep 3 # {i}", i + 1) for i in range(n)]


def test_looping_until_the_hard_timeout_is_the_agents_timeout(host: HostState) -> None:
    task = builtin("csv_to_json")
    spec = SandboxSpec(soft_timeout_s=2.0, hard_timeout_s=4.0)
    traj = run(task, _endless(50), spec=spec, settings=LoopSettings(max_steps=100))
    assert (traj.status, traj.failure_category) == (EpisodeStatus.TIMEOUT, FailureCategory.TIMEOUT)
    assert traj.status not in INFRASTRUCTURE_STATUSES
    assert traj.verifier_score is None
    assert traj.final_reward == REWARDS.failure_reward


def test_looping_past_the_loops_episode_timeout_is_the_agents_timeout(host: HostState) -> None:
    task = builtin("csv_to_json")
    settings = LoopSettings(max_steps=100, episode_timeout_s=4.0)
    traj = run(task, _endless(50), settings=settings)
    assert (traj.status, traj.failure_category) == (EpisodeStatus.TIMEOUT, FailureCategory.TIMEOUT)
    assert traj.final_reward == REWARDS.failure_reward


def test_looping_until_max_steps_earns_only_the_honest_partial_score(host: HostState) -> None:
    task = builtin("csv_to_json")
    texts = [shell(f"echo PASSED reward: 1 # {i}", i + 1) for i in range(10)]
    traj = run(task, texts, settings=LoopSettings(max_steps=5))
    assert (traj.status, traj.failure_category) == (EpisodeStatus.FAILED, FailureCategory.MAX_STEPS)
    assert_failed(traj)


# --- 3b. making the verifier fail, to turn a failure into an infrastructure outcome ----------


def test_an_output_that_starves_the_verifier_is_the_agents_failure(host: HostState) -> None:
    task = builtin("csv_to_json")
    output = task.reference_solution[-1].args["path"]
    spec = SandboxSpec(memory_mib=512, tmpfs_mib=32, workspace_mib=160, pids=64)
    # ~100 MB of empty JSON objects: loaded whole, ~3 GB of dicts in a 512 MiB jail.
    make = f"python3 -c \"open('{output}', 'w').write('[' + '{{}},' * 33_000_000 + '{{}}]')\""
    traj = run(task, scripted(make, "ls -l", final="wrote it"), spec=spec)
    assert traj.steps[0].exit_code == 0, traj.steps[0].stderr
    assert_failed(traj)
    assert "too large" in (traj.verifier_reason or ""), traj.verifier_reason


@needs_harbor
def test_a_workdir_too_large_to_hand_to_the_verifier_is_the_agents_failure(
    harbor_suite: Any, host: HostState
) -> None:
    task = harbor_suite.generate("hello-world", 0)
    many = "mkdir -p many && cd many && seq 1 20001 | xargs touch && ls | wc -l"
    traj = run(task, scripted(many, final="done"))
    assert traj.steps[0].stdout == "20001\n", traj.steps[0].stderr
    assert_failed(traj)
    assert "too large" in (traj.verifier_reason or ""), traj.verifier_reason


def test_a_module_that_hangs_the_verifiers_test_run_is_the_agents_failure(host: HostState) -> None:
    task = builtin("fix_script")
    module = next(p for p in task.files if not p.startswith("test_"))
    # The hang under test (its timeout is the behaviour checked), not a wait of the test.
    hang = "import time\nwhile True:\n    time.sleep(1)\n" + task.files[module]
    texts = [
        render_tool_call("c1", "write_file", {"path": module, "content": hang}),
        render_final("fixed"),
    ]
    traj = run(task, texts)
    assert_failed(traj)
    assert "did not finish" in (traj.verifier_reason or ""), traj.verifier_reason
