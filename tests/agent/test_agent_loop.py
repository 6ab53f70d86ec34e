"""The episode loop on the in-memory sandbox DOUBLE (tests/agent/doubles.py; real nsjail in
test_agent_e2e_nsjail.py): record points, endings, limits and error paths."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from agent.loop import run_episode
from agent.policies import make_policy
from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from agent.render import render_final, render_tool_call
from agent.settings import LoopSettings, NoisyRates, PolicySettings
from agent.trajectory import (
    EpisodeStatus,
    FailureCategory,
    ParseKind,
    Trajectory,
    episode_id_for,
    history_hash,
)
from sandbox.errors import SandboxUnavailable
from tasks.verify import VerifierOutcome
from tests.agent.conftest import MemoryOpener, memory_verify
from tests.agent.doubles import ScriptedTextPolicy


def run(task, policy, spec, settings, opener, **kw) -> Trajectory:
    kw.setdefault("verify", memory_verify)
    return asyncio.run(
        run_episode(
            task, policy, spec=spec, run_key="run-1", settings=settings, open_sandbox=opener, **kw
        )
    )


def test_oracle_succeeds_and_every_record_point_is_filled(task, spec, loop_settings) -> None:
    opener = MemoryOpener()
    traj = run(
        task, make_policy("scripted:oracle", settings=PolicySettings()), spec, loop_settings, opener
    )
    assert traj.status == EpisodeStatus.SUCCESS, traj.failure_reason
    assert traj.failure_category == FailureCategory.SUCCESS
    assert traj.episode_id == episode_id_for("run-1", task.task_id, 0)
    assert traj.verifier_score == 1.0 and traj.verifier_reason == "out.txt ok"
    assert traj.final_answer == task.reference_final
    assert [s.tool for s in traj.steps[:-1]] == [c.tool for c in task.reference_solution]
    assert traj.steps[-1].parse_kind == ParseKind.FINAL
    assert len({s.history_hash for s in traj.steps}) == len(traj.steps)
    assert traj.sandbox_spec_hash == "memory-double"
    assert traj.started_at is not None and traj.ended_at is not None
    assert traj.ended_at >= traj.started_at
    for index, step in enumerate(traj.steps[:-1]):
        assert step.index == index
        assert step.raw_output.startswith("Next I call")
        assert step.generation_latency_ms is not None and step.parse_latency_ms is not None
        assert step.parse_kind == ParseKind.TOOL_CALL and step.call_id == f"c{index + 1}"
        assert step.args == task.reference_solution[index].args
        assert step.observation is not None and step.observation.startswith(
            f'<tool_result id="c{index + 1}"'
        )
        assert step.duration_ms == 1.5 and step.resources is not None
        assert step.stdout_bytes is not None
    write = traj.steps[3]
    assert write.files_changed[0].path == "out.txt" and write.files_changed[0].sha256
    shell = traj.steps[2]
    assert shell.exit_code == 0 and shell.stdout == "hello\n" and shell.stdout_bytes == b"hello\n"
    assert opener.opened[0].closed == 1


def test_each_step_hashes_the_history_its_policy_saw(task, spec, loop_settings) -> None:
    """The loop keeps the history hash as the history grows (`HistoryHash`): each step's
    hash is still sha256 of the canonical JSON of the whole list the policy was sent."""
    seen: list[list[dict[str, Any]]] = []
    oracle = make_policy("scripted:oracle", settings=PolicySettings())

    class Recording(Policy):
        spec = oracle.spec

        async def respond(self, request: PolicyRequest) -> PolicyResponse:
            seen.append(request.messages)
            return await oracle.respond(request)

    traj = run(task, Recording(), spec, loop_settings, MemoryOpener())
    assert traj.status == EpisodeStatus.SUCCESS and len(seen) == len(traj.steps) > 2
    for step, messages in zip(traj.steps, seen, strict=True):
        canonical = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        whole = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
        assert step.history_hash == whole == history_hash(messages)


def test_idle_policy_ends_with_a_failed_verifier(task, spec, loop_settings) -> None:
    traj = run(
        task,
        make_policy("scripted:idle", settings=PolicySettings()),
        spec,
        loop_settings,
        MemoryOpener(),
    )
    assert (traj.status, traj.failure_category) == (
        EpisodeStatus.FAILED,
        FailureCategory.VERIFIER_FAILED,
    )
    assert traj.verifier_score == 0.0 and len(traj.steps) == 1


def test_noisy_policy_records_perturbations_and_parse_errors(task, spec) -> None:
    settings = LoopSettings(max_steps=40, max_consecutive_parse_failures=40)
    rates = NoisyRates(
        malformed=0.3,
        unknown_tool=0.2,
        missing_arg=0.2,
        mistyped_arg=0.2,
        premature_final=0.0,
        fabricated_claim=0.2,
        repeated_command=0.2,
        skipped_step=0.0,
    )
    policy = make_policy("scripted:noisy", settings=PolicySettings(noisy=rates))
    first = run(task, policy, spec, settings, MemoryOpener(), policy_seed=3)
    again = run(task, policy, spec, settings, MemoryOpener(), policy_seed=3)
    assert [s.raw_output for s in first.steps] == [s.raw_output for s in again.steps]
    perturbed = [s for s in first.steps if s.policy_perturbation]
    assert perturbed, "rates this high must perturb some step"
    for step in perturbed:
        if step.policy_perturbation in (
            "malformed",
            "unknown_tool",
            "missing_arg",
            "mistyped_arg",
            "fabricated_claim",
        ):
            assert step.parse_kind == ParseKind.ERROR, step.raw_output
            assert step.observation is not None and step.observation.startswith("<tool_error")
        if step.policy_perturbation == "repeated_command":
            assert step.parse_kind == ParseKind.TOOL_CALL and step.repeat_count >= 1
    # Errors never end the episode by themselves: the oracle underneath still finishes the task.
    assert first.status == EpisodeStatus.SUCCESS, first.failure_reason


def test_each_perturbation_lands_where_expected(task, spec) -> None:
    expected = {
        "malformed": ParseKind.ERROR,
        "unknown_tool": ParseKind.ERROR,
        "missing_arg": ParseKind.ERROR,
        "mistyped_arg": ParseKind.ERROR,
        "fabricated_claim": ParseKind.ERROR,
        "premature_final": ParseKind.FINAL,
        "skipped_step": ParseKind.TOOL_CALL,
    }
    codes = {
        "unknown_tool": "unknown_tool",
        "missing_arg": "missing_arg",
        "mistyped_arg": "bad_value",
        "fabricated_claim": "fabricated_observation",
    }
    for kind, parse_kind in expected.items():
        policy = make_policy(
            f"scripted:noisy?{'&'.join(f'{k}=0' for k in expected if k != kind)}&repeated_command=0&{kind}=1",
            settings=PolicySettings(),
        )
        traj = run(task, policy, spec, LoopSettings(max_steps=3), MemoryOpener())
        step = traj.steps[0]
        assert step.policy_perturbation == kind
        assert step.parse_kind == parse_kind, (kind, step.raw_output)
        if kind in codes:
            assert step.parse_error_code == codes[kind]
    premature = run(
        task,
        make_policy("scripted:noisy?premature_final=1", settings=PolicySettings()),
        spec,
        LoopSettings(),
        MemoryOpener(),
    )
    assert premature.failure_category == FailureCategory.VERIFIER_FAILED
    skipped = run(
        task,
        make_policy(
            "scripted:noisy?skipped_step=1&"
            + "&".join(f"{k}=0" for k in codes)
            + "&malformed=0&premature_final=0&repeated_command=0",
            settings=PolicySettings(),
        ),
        spec,
        LoopSettings(),
        MemoryOpener(),
    )
    assert [s.tool for s in skipped.steps if s.tool] == ["read_file", "write_file"]


def test_oracle_retries_a_call_hit_by_an_injected_fault(task, spec, loop_settings) -> None:
    opener = MemoryOpener(fault_on_call={1: "permission_denied"})
    traj = run(
        task, make_policy("scripted:oracle", settings=PolicySettings()), spec, loop_settings, opener
    )
    assert traj.status == EpisodeStatus.SUCCESS
    assert (
        traj.steps[1].injected_fault is not None and traj.steps[1].error_type == "permission_denied"
    )
    assert traj.steps[2].tool == "read_file" and traj.steps[2].injected_fault is None


def test_max_steps(task, spec) -> None:
    call = render_tool_call("c1", "execute_shell", {"command": "echo hi"})
    texts = [call.replace('"c1"', f'"c{i}"').replace("echo hi", f"echo {i}") for i in range(5)]
    traj = run(task, ScriptedTextPolicy(texts), spec, LoopSettings(max_steps=3), MemoryOpener())
    assert (traj.status, traj.failure_category) == (EpisodeStatus.FAILED, FailureCategory.MAX_STEPS)
    assert len(traj.steps) == 3
    assert traj.verifier_score == 0.0  # the verifier still ran for partial credit


def test_parse_failures_end_after_the_limit_but_single_errors_do_not(task, spec) -> None:
    texts = [
        "no block here",
        "<tool_call>",
        "ok " + render_tool_call("c1", "list_dir", {"path": "."}),
        "x",
        "y",
        "z",
    ]
    traj = run(
        task,
        ScriptedTextPolicy(texts),
        spec,
        LoopSettings(max_consecutive_parse_failures=3),
        MemoryOpener(),
    )
    assert traj.failure_category == FailureCategory.PARSE_FAILURES
    assert [s.parse_kind for s in traj.steps] == [
        ParseKind.NONE,
        ParseKind.ERROR,
        ParseKind.TOOL_CALL,
    ] + [ParseKind.NONE] * 3
    assert traj.steps[0].parse_error_code == "no_block"
    assert traj.steps[1].observation is not None and "<tool_error" in traj.steps[1].observation


def test_repetition_warns_then_ends_the_episode(task, spec) -> None:
    texts = [render_tool_call(f"c{i}", "list_dir", {"path": "data"}) for i in range(10)]
    settings = LoopSettings(repeat_warn_after=2, repeat_abort_after=4)
    opener = MemoryOpener()
    traj = run(task, ScriptedTextPolicy(texts), spec, settings, opener)
    assert traj.failure_category == FailureCategory.MAX_STEPS and "repetition" in (
        traj.failure_reason or ""
    )
    assert [s.repeat_count for s in traj.steps] == [1, 2, 3, 4]
    assert [s.repetition_warning for s in traj.steps[:3]] == [False, True, True]
    assert '<warning kind="repetition">' in (traj.steps[1].observation or "")
    assert len(opener.opened[0].calls) == 3  # the 4th identical call was not run


def test_soft_timeout_warning_reaches_the_observation(task, spec, loop_settings) -> None:
    traj = run(
        task,
        make_policy("scripted:oracle", settings=PolicySettings()),
        spec,
        loop_settings,
        MemoryOpener(soft_timeout_from_call=2),
    )
    flags = [s.soft_timeout_warning for s in traj.steps if s.tool]
    assert flags == [False, False, True, True]
    assert '<warning kind="soft_timeout">' in (traj.steps[2].observation or "")


def test_sandbox_crash_is_an_env_error_with_steps_kept(task, spec, loop_settings) -> None:
    traj = run(
        task,
        make_policy("scripted:oracle", settings=PolicySettings()),
        spec,
        loop_settings,
        MemoryOpener(crash_on_call=2),
    )
    assert (traj.status, traj.failure_category) == (
        EpisodeStatus.ENV_ERROR,
        FailureCategory.ENV_ERROR,
    )
    assert len(traj.steps) == 3 and traj.steps[2].error_type == "sandbox_crashed"
    assert traj.verifier_score is None


def test_hard_timeout_is_a_timeout(task, spec, loop_settings) -> None:
    traj = run(
        task,
        make_policy("scripted:oracle", settings=PolicySettings()),
        spec,
        loop_settings,
        MemoryOpener(hard_timeout_on_call=1),
    )
    assert (traj.status, traj.failure_category) == (EpisodeStatus.TIMEOUT, FailureCategory.TIMEOUT)


def test_sandbox_unavailable_is_an_env_error(task, spec, loop_settings) -> None:
    async def unavailable(*args, **kwargs):
        raise SandboxUnavailable("no user namespaces")

    traj = run(
        task,
        make_policy("scripted:oracle", settings=PolicySettings()),
        spec,
        loop_settings,
        unavailable,
    )
    assert traj.status == EpisodeStatus.ENV_ERROR and "no user namespaces" in (
        traj.failure_reason or ""
    )


def test_policy_error_keeps_the_steps_so_far(task, spec, loop_settings) -> None:
    texts = [
        render_tool_call("c1", "list_dir", {"path": "."}),
        render_tool_call("c2", "read_file", {"path": "data/in.txt"}),
    ]
    traj = run(
        task,
        ScriptedTextPolicy(texts, error="endpoint exploded"),
        spec,
        loop_settings,
        MemoryOpener(),
    )
    assert (traj.status, traj.failure_category) == (
        EpisodeStatus.POLICY_ERROR,
        FailureCategory.POLICY_ERROR,
    )
    assert "endpoint exploded" in (traj.failure_reason or "")
    assert len(traj.steps) == 2


def test_a_10_mb_answer_is_capped_and_recorded(task, spec) -> None:
    huge = "<final>" + "A" * (10 * 1024 * 1024) + "</final>"
    settings = LoopSettings(max_output_chars=65_536, max_consecutive_parse_failures=1)
    traj = run(task, ScriptedTextPolicy([huge]), spec, settings, MemoryOpener())
    step = traj.steps[0]
    assert step.raw_output_truncated and len(step.raw_output) == 65_536
    assert step.parse_kind == ParseKind.ERROR and step.parse_error_code == "unclosed_tag"
    assert traj.failure_category == FailureCategory.PARSE_FAILURES
    assert len(traj.model_dump_json()) < 1_000_000


def test_a_reference_step_over_the_answer_cap_is_an_env_error_not_a_cut_oracle(task, spec) -> None:
    # The oracle replays the task's reference solution: a step the loop would have to cut
    # cannot be replayed whole, and half a solution says nothing about the task.
    calls = list(task.reference_solution)
    at = next(i for i, c in enumerate(calls) if c.tool == "execute_shell")
    calls[at] = calls[at].model_copy(
        update={"args": {**calls[at].args, "command": "echo " + "x" * 5000}}
    )
    long_task = task.model_copy(update={"reference_solution": calls})
    settings = LoopSettings(max_output_chars=2048)
    oracle = make_policy("scripted:oracle", settings=PolicySettings())
    traj = run(long_task, oracle, spec, settings, MemoryOpener())
    assert (traj.status, traj.failure_category) == (
        EpisodeStatus.ENV_ERROR,
        FailureCategory.ENV_ERROR,
    )
    reason = traj.failure_reason or ""
    assert f"reference solution's step {at}" in reason and "2,048" in reason, reason
    assert "EPIFLOW_AGENT_LOOP_MAX_OUTPUT_CHARS" in reason
    assert traj.steps[-1].raw_output_truncated and traj.verifier_score is None
    # Any other policy's long answer is cut and scored as usual.
    texts = [render_tool_call("c1", "execute_shell", {"command": "echo " + "x" * 5000})]
    other = run(task, ScriptedTextPolicy(texts), spec, settings, MemoryOpener())
    assert other.status != EpisodeStatus.ENV_ERROR and other.steps[0].raw_output_truncated


def test_a_reference_solution_longer_than_max_steps_is_an_env_error(task, spec) -> None:
    oracle = make_policy("scripted:oracle", settings=PolicySettings())
    limit = len(task.reference_solution) - 1
    traj = run(task, oracle, spec, LoopSettings(max_steps=limit), MemoryOpener())
    assert (traj.status, traj.failure_category) == (
        EpisodeStatus.ENV_ERROR,
        FailureCategory.ENV_ERROR,
    )
    assert f"max_steps ({limit})" in (traj.failure_reason or ""), traj.failure_reason
    assert len(traj.steps) == limit


def test_broken_verifier_is_an_env_error(task, spec, loop_settings) -> None:
    async def broken(sandbox, task):
        return VerifierOutcome(score=0.0, reason="verifier error: crashed", error=True)

    traj = run(
        task,
        make_policy("scripted:oracle", settings=PolicySettings()),
        spec,
        loop_settings,
        MemoryOpener(),
        verify=broken,
    )
    assert traj.failure_category == FailureCategory.ENV_ERROR and "crashed" in (
        traj.failure_reason or ""
    )


def test_episode_timeout_in_the_loop(task, spec) -> None:
    class Slow(ScriptedTextPolicy):
        async def respond(self, request):
            await asyncio.sleep(5)
            return await super().respond(request)

    traj = run(
        task, Slow([render_final("x")]), spec, LoopSettings(episode_timeout_s=0.2), MemoryOpener()
    )
    assert traj.failure_category == FailureCategory.TIMEOUT


def test_policy_timeout_is_a_policy_error(task, spec) -> None:
    class Slow(ScriptedTextPolicy):
        async def respond(self, request):
            await asyncio.sleep(5)
            return await super().respond(request)

    traj = run(
        task, Slow([render_final("x")]), spec, LoopSettings(policy_timeout_s=0.2), MemoryOpener()
    )
    assert traj.failure_category == FailureCategory.POLICY_ERROR and "did not answer" in (
        traj.failure_reason or ""
    )


def test_trajectory_json_round_trip(task, spec, loop_settings) -> None:
    traj = run(
        task,
        make_policy("scripted:noisy?malformed=0.5", settings=PolicySettings()),
        spec,
        loop_settings,
        MemoryOpener(),
    )
    loaded = Trajectory.model_validate_json(traj.model_dump_json())
    assert loaded.model_dump() == traj.model_dump()
    assert json.loads(traj.model_dump_json(by_alias=True))["steps"][0]["return"] == 0.0


def test_system_prompt_renders_the_tool_schemas(task, spec, loop_settings) -> None:
    seen = []

    class Spy(ScriptedTextPolicy):
        async def respond(self, request):
            seen.append(request.messages)
            return await super().respond(request)

    run(task, Spy([render_final("x")]), spec, loop_settings, MemoryOpener())
    system = seen[0][0]["content"]
    for name in (
        "execute_shell",
        "read_file",
        "write_file",
        "list_dir",
        '"required"',
        "<tool_call",
        "<final>",
    ):
        assert name in system
    assert seen[0][1] == {"role": "user", "content": task.prompt}
