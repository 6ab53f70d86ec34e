"""The built-in suite on real nsjail: the oracle scores 1.0, doing nothing scores 0.

The oracle here replays `reference_solution` straight through `Sandbox.call_tool` (the
agent loop's oracle policy is exercised end to end in test_cli_suites.py).
"""

from __future__ import annotations

import asyncio

import pytest

from suites.builtin import BUILTIN_TEMPLATES, builtin_suite
from suites.check import replay_reference
from tasks.verify import run_verifier

SUITE = builtin_suite()
SEEDS = (0, 1, 2, 1_000_000_007)


@pytest.mark.parametrize("name", [t.name for t in BUILTIN_TEMPLATES])
def test_oracle_scores_one_and_idle_scores_zero(name, open_task_sandbox):
    async def body():
        for seed in SEEDS:
            task = SUITE.generate(name, seed)
            async with await open_task_sandbox(task.files) as box:
                idle = await run_verifier(box, task)
            assert not idle.error, idle
            assert idle.score == 0.0, (seed, idle.reason)

            async with await open_task_sandbox(task.files) as box:
                await replay_reference(box, task)
                oracle = await run_verifier(box, task)
                again = await run_verifier(box, task)
            assert not oracle.error, oracle
            assert oracle.score == 1.0, (seed, oracle.reason, oracle.stderr)
            assert (again.score, again.reason) == (oracle.score, oracle.reason)

    asyncio.run(body())


def test_partial_work_gets_partial_credit(open_task_sandbox):
    task = SUITE.generate("merge_csv", 3)

    async def body():
        async with await open_task_sandbox(task.files) as box:
            await replay_reference(box, task)
            await box.call_tool("execute_shell", {"command": "rm skipped.txt"})
            return await run_verifier(box, task)

    outcome = asyncio.run(body())
    assert not outcome.error
    assert 0.0 < outcome.score < 1.0
    assert "skipped.txt" in outcome.reason


def test_tampering_with_the_tests_of_fix_script_scores_zero(open_task_sandbox):
    task = SUITE.generate("fix_script", 0)
    test_file = next(p for p in task.files if p.startswith("test_"))

    async def body():
        async with await open_task_sandbox(task.files) as box:
            await box.call_tool("write_file", {"path": test_file, "content": "pass\n"})
            # A planted stdlib module must not fake a passing run either.
            await box.call_tool(
                "write_file", {"path": "unittest.py", "content": "def main(**kw):\n    pass\n"}
            )
            return await run_verifier(box, task)

    outcome = asyncio.run(body())
    assert not outcome.error
    assert outcome.score == 0.0
    assert "modified" in outcome.reason
