"""`run_verifier` on real nsjail: the contract, and broken verifiers flagged as errors."""

from __future__ import annotations

import asyncio
import json

import pytest

from tasks.types import TaskInstance, VerifierSpec
from tasks.verify import parse_verifier_stdout, run_verifier


def task_with(verifier: VerifierSpec, files: dict[str, str] | None = None) -> TaskInstance:
    return TaskInstance(
        suite="t",
        suite_version="1",
        template="probe",
        template_version="1",
        seed=0,
        difficulty=1,
        prompt="probe",
        files=files or {},
        verifier=verifier,
    )


def python_verifier(script: str, **kw) -> VerifierSpec:
    return VerifierSpec(argv=["python3", "-I", "-"], stdin=script, **kw)


def verify(open_task_sandbox, task: TaskInstance, *setup: list[str]):
    async def body():
        async with await open_task_sandbox(task.files) as box:
            for argv in setup:
                await box.exec(argv)
            return await run_verifier(box, task)

    return asyncio.run(body())


def test_reads_the_workspace_inside_the_jail(open_task_sandbox):
    script = (
        "import json, os\n"
        "print('debug line first')\n"
        "print(json.dumps({'score': 0.25, 'reason': os.getcwd() + ' ' + open('a.txt').read()}))\n"
    )
    outcome = verify(open_task_sandbox, task_with(python_verifier(script), {"a.txt": "hi"}))
    assert not outcome.error
    assert outcome.score == 0.25
    assert outcome.reason == "/workspace hi"
    assert outcome.exit_code == 0


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("raise SystemExit(3)", "crashed with exit code 3"),
        ("import sys; print('{\"score\": 1}'); sys.exit(1)", "crashed with exit code 1"),
        ("1/0", "ZeroDivisionError"),
        ("print('all good!')", "not JSON"),
        ("print('')", "printed nothing"),
        ("print('[1, 2]')", "expected a JSON object"),
        ('print(\'{"score": 1.5, "reason": "x"}\')', "`score` must be a number in [0, 1]"),
        ('print(\'{"score": "1", "reason": "x"}\')', "`score` must be a number in [0, 1]"),
        ('print(\'{"score": NaN, "reason": "x"}\')', "`score` must be a number in [0, 1]"),
        ('print(\'{"score": 1, "reason": 5}\')', "`reason` must be a string"),
    ],
)
def test_broken_verifier_is_score_zero_and_flagged(open_task_sandbox, script, expected):
    outcome = verify(open_task_sandbox, task_with(python_verifier(script)))
    assert outcome.error
    assert outcome.score == 0.0
    assert outcome.reason.startswith("verifier error: ")
    assert expected in outcome.reason


def test_verifier_timeout_is_flagged(open_task_sandbox):
    outcome = verify(
        open_task_sandbox,
        # The hang under test (its timeout is the behaviour checked), not a wait of the test.
        task_with(python_verifier("import time; time.sleep(30)", timeout_s=1)),
    )
    assert outcome.error and outcome.timed_out
    assert outcome.score == 0.0
    assert "timed out" in outcome.reason


def test_verifier_files_are_installed_outside_the_workspace(open_task_sandbox):
    spec = VerifierSpec(
        argv=["python3", "-I", "/tmp/v/check.py"],
        files={"/tmp/v/check.py": "import json\nprint(json.dumps({'score': 1, 'reason': 'ok'}))\n"},
    )
    # The agent left a symlink where the verifier file goes; it is replaced, not written through.
    outcome = verify(
        open_task_sandbox,
        task_with(spec),
        ["sh", "-c", "mkdir -p /tmp/v && ln -s /workspace/trap.py /tmp/v/check.py"],
    )
    assert not outcome.error, outcome
    assert outcome.score == 1.0


def test_a_symlinked_verifier_folder_is_replaced_too(open_task_sandbox):
    spec = VerifierSpec(
        argv=[
            "sh",
            "-c",
            "test ! -e /workspace/planted/check.py && python3 -I /tmp/v/sub/check.py",
        ],
        files={
            "/tmp/v/sub/check.py": "import json\nprint(json.dumps({'score': 1, 'reason': 'ok'}))\n"
        },
    )
    outcome = verify(
        open_task_sandbox,
        task_with(spec),
        ["sh", "-c", "mkdir -p /workspace/planted && ln -s /workspace/planted /tmp/v"],
    )
    assert not outcome.error, outcome
    assert outcome.score == 1.0


def test_verifier_files_inside_the_workspace_are_refused(open_task_sandbox):
    spec = VerifierSpec(argv=["true"], files={"/workspace/check.py": "x"})
    outcome = verify(open_task_sandbox, task_with(spec))
    assert outcome.error
    assert "outside /workspace" in outcome.reason


def test_a_planted_stdlib_module_does_not_shadow_the_verifier(open_task_sandbox):
    script = "import json\nprint(json.dumps({'score': 1, 'reason': 'real json'}))\n"
    planted = {"json.py": 'def dumps(*a, **k):\n    return \'{"score": 1, "reason": "fake"}\'\n'}
    outcome = verify(open_task_sandbox, task_with(python_verifier(script), planted))
    assert outcome.reason == "real json"


def test_parse_takes_the_last_non_empty_line():
    assert parse_verifier_stdout('noise\n{"score": 1, "reason": "r"}\n\n') == (1.0, "r")
    assert parse_verifier_stdout('{"score": 0}') == (0.0, "")
    long_reason = "x" * 2000
    _, reason = parse_verifier_stdout(json.dumps({"score": 0, "reason": long_reason}))
    assert len(reason) <= 500
