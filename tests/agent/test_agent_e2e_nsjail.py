"""End to end on real nsjail: protocol, loop and policies (scripted and a loopback endpoint).

These use `sandbox.open_sandbox` (one jail per episode) and the verifier running inside
the jail. They skip with a reason if the sandbox package or nsjail is not usable here.
"""

from __future__ import annotations

import asyncio

import pytest

from agent.loop import run_episode
from agent.policies import make_policy
from agent.render import render_final, render_tool_call
from agent.settings import LoopSettings, PolicySettings
from agent.trajectory import EpisodeStatus, FailureCategory, ParseKind
from tests.agent.chat_server import ChatServer, reply

sandbox = pytest.importorskip("sandbox", reason="the sandbox package is not importable")
if not hasattr(sandbox, "open_sandbox"):
    pytest.skip("sandbox.open_sandbox is not implemented yet", allow_module_level=True)


def episode(task, policy, spec, settings=None, **kw):
    kw.setdefault("open_sandbox", sandbox.sandbox_opener(sandbox.SandboxSettings()))

    async def go():
        try:
            return await run_episode(
                task, policy, spec=spec, run_key="e2e", settings=settings or LoopSettings(), **kw
            )
        finally:
            await policy.aclose()

    traj = asyncio.run(go())
    if traj.status == EpisodeStatus.ENV_ERROR and "unavailable" in (traj.failure_reason or ""):
        pytest.skip(f"nsjail cannot start here: {traj.failure_reason}")
    return traj


def test_oracle_succeeds_in_a_real_jail(task, spec) -> None:
    traj = episode(task, make_policy("scripted:oracle", settings=PolicySettings()), spec)
    assert traj.status == EpisodeStatus.SUCCESS, traj.failure_reason
    assert traj.verifier_score == 1.0
    assert traj.sandbox_spec_hash == spec.spec_hash()
    shell = next(s for s in traj.steps if s.tool == "execute_shell")
    assert shell.exit_code == 0 and shell.stdout == "hello\n" and shell.stdout_bytes == b"hello\n"
    assert shell.duration_ms is not None and shell.resources is not None
    write = next(s for s in traj.steps if s.tool == "write_file")
    assert [(c.path, c.change) for c in write.files_changed] == [("out.txt", "created")]
    assert write.files_changed[0].sha256 is not None


def test_idle_scores_zero_in_a_real_jail(task, spec) -> None:
    traj = episode(task, make_policy("scripted:idle", settings=PolicySettings()), spec)
    assert (traj.failure_category, traj.verifier_score) == (FailureCategory.VERIFIER_FAILED, 0.0)


def test_noisy_policy_in_a_real_jail(task, spec) -> None:
    policy = make_policy(
        "scripted:noisy?malformed=0.3&unknown_tool=0.2&mistyped_arg=0.2&premature_final=0&repeated_command=0.2",
        settings=PolicySettings(),
    )
    traj = episode(
        task,
        policy,
        spec,
        LoopSettings(max_steps=40, max_consecutive_parse_failures=40),
        policy_seed=11,
    )
    assert any(s.parse_kind == ParseKind.ERROR for s in traj.steps)
    assert all(s.parse_error_code for s in traj.steps if s.parse_kind == ParseKind.ERROR)
    assert traj.status == EpisodeStatus.SUCCESS, traj.failure_reason


def test_a_failing_command_is_a_result_not_an_error(task, spec) -> None:
    texts = [
        render_tool_call("c1", "execute_shell", {"command": "echo oops >&2; exit 3"}),
        render_final("gave up"),
    ]
    with ChatServer([reply(t) for t in texts]) as server:
        policy = make_policy(
            f"openai:{server.base_url}#m", settings=PolicySettings(backoff_initial_s=0.01)
        )
        traj = episode(task, policy, spec)
    step = traj.steps[0]
    assert step.exit_code == 3 and step.stderr == "oops\n"
    assert (
        step.observation is not None
        and 'exit_code="3"' in step.observation
        and "<stderr>oops" in step.observation
    )
    assert traj.failure_category == FailureCategory.VERIFIER_FAILED


def test_loopback_endpoint_policy_in_a_real_jail(task, spec) -> None:
    texts = [
        render_tool_call(f"c{i + 1}", c.tool, c.args) for i, c in enumerate(task.reference_solution)
    ]
    with ChatServer([reply(t) for t in [*texts, render_final("done")]]) as server:
        policy = make_policy(
            f"openai:{server.base_url}#m", settings=PolicySettings(backoff_initial_s=0.01)
        )
        traj = episode(task, policy, spec)
    assert traj.status == EpisodeStatus.SUCCESS, traj.failure_reason
    assert all(s.prompt_tokens is not None for s in traj.steps)


def _seed_with_recoverable_faults(profile) -> int:
    """A fault seed that hits an early call but never three calls in a row (the oracle retries twice)."""
    from sandbox.faults import FaultInjector

    for seed in range(1000):
        injector = FaultInjector(profile, seed)
        hits = [injector.next_fault("read_file") is not None for _ in range(12)]
        if any(hits[:4]) and not any(all(hits[i : i + 3]) for i in range(10)):
            return seed
    raise AssertionError("no suitable seed")


def test_injected_faults_are_recorded_and_the_oracle_recovers(task, spec) -> None:
    faults = sandbox.FaultProfile(permission_denied_p=0.35)
    seed = _seed_with_recoverable_faults(faults)
    traj = episode(
        task,
        make_policy("scripted:oracle", settings=PolicySettings()),
        spec,
        LoopSettings(max_steps=20),
        faults=faults,
        fault_seed=seed,
    )
    hit = [s for s in traj.steps if s.injected_fault is not None]
    assert hit
    assert all(s.injected_fault.kind == "permission_denied" and s.error_type for s in hit)
    assert traj.fault_profile["permission_denied_p"] == 0.35 and traj.fault_seed == seed
    assert traj.status == EpisodeStatus.SUCCESS, traj.failure_reason


def test_a_builtin_suite_task_with_the_suites_verifier(spec) -> None:
    builtin = pytest.importorskip("suites.builtin", reason="the built-in suite is not importable")
    suite = builtin.builtin_suite()
    name = next(iter(suite.templates))
    task = suite.generate(name, 3)
    oracle = episode(task, make_policy("scripted:oracle", settings=PolicySettings()), spec)
    assert oracle.status == EpisodeStatus.SUCCESS, oracle.failure_reason
    idle = episode(task, make_policy("scripted:idle", settings=PolicySettings()), spec)
    assert (idle.failure_category, idle.verifier_score) == (FailureCategory.VERIFIER_FAILED, 0.0)
    assert idle.verifier_reason


def test_the_verifier_writes_nested_files_and_a_garbage_one_is_an_env_error(task, spec) -> None:
    from tasks.types import VerifierSpec
    from tests.agent.conftest import VERIFY_SCRIPT

    files = {"/tmp/verify/nested/check.py": VERIFY_SCRIPT}
    checked = task.model_copy(
        update={
            "verifier": VerifierSpec(
                argv=["python3", "-I", "/tmp/verify/nested/check.py"], files=files
            )
        }
    )
    ok = episode(checked, make_policy("scripted:oracle", settings=PolicySettings()), spec)
    assert (ok.status, ok.verifier_reason) == (EpisodeStatus.SUCCESS, "out.txt ok")
    garbage = task.model_copy(
        update={"verifier": VerifierSpec(argv=["python3", "-c", "print('no json')"])}
    )
    broken = episode(garbage, make_policy("scripted:oracle", settings=PolicySettings()), spec)
    assert broken.failure_category == FailureCategory.ENV_ERROR and "not JSON" in (
        broken.failure_reason or ""
    )


def test_concurrent_episodes_share_one_policy(spec) -> None:
    from tests.agent.conftest import make_copy_task

    tasks = [make_copy_task(seed) for seed in range(4)]
    # One stateless policy instance serves all episodes at once; perturbed turns never run.
    policy = make_policy(
        "scripted:noisy?malformed=0.3&premature_final=0&skipped_step=0&repeated_command=0",
        settings=PolicySettings(),
    )

    async def go():
        episodes = (
            run_episode(
                t,
                policy,
                spec=spec,
                run_key="concurrent",
                settings=LoopSettings(max_steps=30),
                rollout_index=i,
                open_sandbox=sandbox.sandbox_opener(sandbox.SandboxSettings()),
            )
            for i, t in enumerate(tasks)
        )
        return await asyncio.gather(*episodes)

    trajs = asyncio.run(go())
    assert len({t.episode_id for t in trajs}) == len(tasks)
    for traj, task in zip(trajs, tasks, strict=True):
        if traj.status == EpisodeStatus.ENV_ERROR and "unavailable" in (traj.failure_reason or ""):
            pytest.skip(f"nsjail cannot start here: {traj.failure_reason}")
        assert traj.status == EpisodeStatus.SUCCESS, traj.failure_reason
        executed = [
            (s.tool, s.args) for s in traj.steps if (s.observation or "").startswith("<tool_result")
        ]
        assert executed == [(c.tool, c.args) for c in task.reference_solution]
