"""The episode loop: task and tools to the policy, its call to the sandbox, the observation back.

`run_episode` owns one sandbox for one episode and returns a complete `Trajectory` in
every case the environment or the policy can cause (a policy error, a crashed jail, a
timeout are statuses, not exceptions). Only programming errors and cancellation
propagate; the sandbox is closed on every path.

How an episode ends (status / failure category):

- `<final>` and a verifier score that `settings.success` calls a success → success / success
- `<final>` and a lower score → failed / verifier_failed; but the task's reference
  solution (`scripted:oracle`) failing on a substituted base → env_error / env_error,
  reason `substituted-base: …` (`agent/substituted_base.py`)
- `max_steps` turns, or the same call `repeat_abort_after` times in a row → failed / max_steps
- `max_consecutive_parse_failures` unparsable turns in a row → failed / parse_failures
- the model endpoint fails (down, timing out, 429/5xx or garbage after the retries, or a
  policy with an endpoint passing `policy_timeout_s`) → endpoint_error / endpoint_error:
  infrastructure, like env_error
- the policy fails otherwise (a refused request, an in-process policy's timeout or load
  failure) → policy_error / policy_error
- the sandbox cannot start or crashes, or the verifier is broken → env_error / env_error
- the sandbox's hard timeout or the loop's `episode_timeout_s` → timeout / timeout

The verifier also runs after max_steps and parse_failures (partial credit) unless
`verify_after_limits` is off; the category stays what ended the episode.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent.errors import (
    EndpointError,
    EndpointTimeout,
    PolicyError,
    PolicyTimeout,
    ProtocolError,
)
from agent.native_calls import parse_native_tool_calls
from agent.policies.base import Policy, PolicyRequest
from agent.protocol import parse_message
from agent.recording import (
    assistant_message,
    observation_messages,
    record_parse,
    record_parse_error,
    record_response,
    record_result,
)
from agent.settings import LoopSettings
from agent.substituted_base import substituted_base_failure
from agent.trajectory import (
    EpisodeStatus,
    FailureCategory,
    HistoryHash,
    ParseKind,
    Step,
    Trajectory,
    episode_id_for,
    utcnow,
)
from sandbox.errors import EpisodeHardTimeout, SandboxCrashed, SandboxError
from sandbox.faults import FaultProfile
from sandbox.interface import Sandbox
from sandbox.spec import SandboxSpec
from sandbox.tool_specs import BUILTIN_TOOLS, ToolSpec
from tasks.types import TaskInstance
from tasks.verify import Verifier, run_verifier

__all__ = ["SandboxOpener", "run_episode"]

SandboxOpener = Callable[..., Awaitable[Sandbox]]
"""`open_sandbox(spec, *, files=…, faults=…, fault_seed=…) -> Sandbox` (the sandbox package's signature)."""


class _EpisodeEnd(Exception):
    """Internal: stop the loop with this status, category and reason."""

    def __init__(
        self, status: EpisodeStatus, category: FailureCategory, reason: str | None
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.category = category
        self.reason = reason


def _call_key(step: Step) -> str:
    return json.dumps([step.tool, step.args], sort_keys=True, ensure_ascii=False, default=str)


class _Episode:
    """State of one running episode; `run_episode` is its only user."""

    def __init__(
        self,
        task: TaskInstance,
        policy: Policy,
        traj: Trajectory,
        sandbox: Sandbox,
        tools: Mapping[str, ToolSpec],
        settings: LoopSettings,
        policy_seed: int,
    ) -> None:
        self.task = task
        self.policy = policy
        self.traj = traj
        self.sandbox = sandbox
        self.tools = tools
        self.settings = settings
        self.policy_seed = policy_seed
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": policy.system_prompt(tools.values())},
            {"role": "user", "content": task.prompt},
        ]
        self.history = HistoryHash(self.messages)
        """`history_hash` of `messages`, kept as they grow (each turn encoded once)."""
        self.parse_failures = 0
        self.last_call_key: str | None = None
        self.repeat = 0

    async def ask_policy(self, step: Step) -> str:
        request = PolicyRequest(
            task=self.task,
            messages=list(self.messages),
            tools=list(self.tools.values()),
            steps=list(self.traj.steps),
            step_index=step.index,
            seed=self.policy_seed,
        )
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.settings.policy_timeout_s):
                response = await self.policy.respond(request)
        except TimeoutError as e:
            limit = f"{self.settings.policy_timeout_s:g} s"
            endpoint = self.policy.endpoint
            if endpoint is not None:
                late: PolicyError = EndpointTimeout(
                    f"the endpoint {endpoint} did not answer within {limit}", endpoint=endpoint
                )
                raise _EpisodeEnd(
                    EpisodeStatus.ENDPOINT_ERROR, FailureCategory.ENDPOINT_ERROR, str(late)
                ) from e
            late = PolicyTimeout(f"policy did not answer within {limit}")
            raise _EpisodeEnd(
                EpisodeStatus.POLICY_ERROR, FailureCategory.POLICY_ERROR, str(late)
            ) from e
        except EndpointError as e:
            reason = f"{type(e).__name__}: {e}"
            raise _EpisodeEnd(
                EpisodeStatus.ENDPOINT_ERROR, FailureCategory.ENDPOINT_ERROR, reason
            ) from e
        except PolicyError as e:
            reason = f"{type(e).__name__}: {e}"
            raise _EpisodeEnd(
                EpisodeStatus.POLICY_ERROR, FailureCategory.POLICY_ERROR, reason
            ) from e
        latency_ms = (time.perf_counter() - started) * 1000.0
        text = record_response(step, response, latency_ms=latency_ms, settings=self.settings)
        if step.raw_output_truncated and self.policy.replays_reference:
            # A cut reference step cannot be replayed whole: the oracle would be scored on
            # half a solution, which says nothing about the task or an agent.
            cap = self.settings.max_output_chars
            raise _EpisodeEnd(
                EpisodeStatus.ENV_ERROR,
                FailureCategory.ENV_ERROR,
                f"the reference solution's step {step.index} is {len(response.text):,} "
                f"characters, over the loop's cap of {cap:,} (max_output_chars): it cannot "
                "be replayed whole (raise EPIFLOW_AGENT_LOOP_MAX_OUTPUT_CHARS)",
            )
        return text

    def parse(self, step: Step, text: str) -> None:
        started = time.perf_counter()
        try:
            if step.native_tool_calls:
                parsed = parse_native_tool_calls(
                    text, step.native_tool_calls, self.tools, fallback_id=f"call_{step.index}"
                )
            else:
                parsed = parse_message(text, self.tools)
        except ProtocolError as e:
            record_parse_error(step, e, latency_ms=(time.perf_counter() - started) * 1000.0)
            return
        record_parse(step, parsed, latency_ms=(time.perf_counter() - started) * 1000.0)

    async def execute(self, step: Step) -> None:
        key = _call_key(step)
        self.repeat = self.repeat + 1 if key == self.last_call_key else 1
        self.last_call_key = key
        step.repeat_count = self.repeat
        if self.repeat >= self.settings.repeat_abort_after:
            reason = f"repetition: the same {step.tool} call {self.repeat} times in a row"
            raise _EpisodeEnd(EpisodeStatus.FAILED, FailureCategory.MAX_STEPS, reason)
        assert step.tool is not None
        try:
            result = await self.sandbox.call_tool(step.tool, step.args or {})
        except SandboxCrashed as e:
            step.error_type = "sandbox_crashed"
            raise _EpisodeEnd(
                EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR, f"sandbox crashed: {e}"
            ) from e
        except EpisodeHardTimeout as e:
            step.error_type = "episode_timeout"
            raise _EpisodeEnd(
                EpisodeStatus.TIMEOUT, FailureCategory.TIMEOUT, f"hard timeout: {e}"
            ) from e
        except KeyError as e:
            step.error_type = "unknown_tool"
            reason = f"the sandbox does not offer tool {step.tool!r}"
            raise _EpisodeEnd(EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR, reason) from e
        except SandboxError as e:
            step.error_type = "sandbox_error"
            reason = f"sandbox failed: {type(e).__name__}: {e}"
            raise _EpisodeEnd(EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR, reason) from e
        warn = self.repeat >= self.settings.repeat_warn_after
        record_result(step, result, settings=self.settings, repetition_warning=warn)

    async def one_step(self, index: int) -> bool:
        """Run step `index`; True when the agent gave its final answer."""
        step = Step(index=index, history_hash=self.history.hexdigest())
        try:
            text = await self.ask_policy(step)
            self.parse(step, text)
            if step.parse_kind == ParseKind.TOOL_CALL:
                self.parse_failures = 0
                await self.execute(step)
            elif step.parse_kind == ParseKind.FINAL:
                self.traj.final_answer = step.final_answer
            else:
                self.parse_failures += 1
        except _EpisodeEnd:
            if step.raw_output or step.parse_kind != ParseKind.NONE:
                self.traj.steps.append(step)
            raise
        self.traj.steps.append(step)
        turn = [assistant_message(step), *observation_messages(step)]
        self.messages.extend(turn)
        self.history.extend(turn)
        if self.parse_failures >= self.settings.max_consecutive_parse_failures:
            reason = (
                f"{self.parse_failures} unparsable messages in a row (last: {step.parse_error})"
            )
            raise _EpisodeEnd(EpisodeStatus.FAILED, FailureCategory.PARSE_FAILURES, reason)
        return step.parse_kind == ParseKind.FINAL

    async def run_steps(self) -> None:
        for index in range(self.settings.max_steps):
            if await self.one_step(index):
                return
        limit = self.settings.max_steps
        if self.policy.replays_reference:
            raise _EpisodeEnd(
                EpisodeStatus.ENV_ERROR,
                FailureCategory.ENV_ERROR,
                f"the reference solution has more steps than the loop's max_steps ({limit}): "
                "it cannot be replayed whole (raise EPIFLOW_AGENT_LOOP_MAX_STEPS)",
            )
        reason = f"no <final> after {limit} steps"
        raise _EpisodeEnd(EpisodeStatus.FAILED, FailureCategory.MAX_STEPS, reason)

    async def run_verifier(self, verify: Verifier) -> None:
        traj = self.traj
        try:
            outcome = await verify(self.sandbox, self.task)
        except SandboxCrashed as e:
            raise _EpisodeEnd(
                EpisodeStatus.ENV_ERROR,
                FailureCategory.ENV_ERROR,
                f"sandbox crashed in the verifier: {e}",
            ) from e
        except EpisodeHardTimeout as e:
            raise _EpisodeEnd(
                EpisodeStatus.TIMEOUT, FailureCategory.TIMEOUT, f"hard timeout in the verifier: {e}"
            ) from e
        except SandboxError as e:
            reason = f"sandbox failed in the verifier: {type(e).__name__}: {e}"
            raise _EpisodeEnd(EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR, reason) from e
        traj.verifier_score = outcome.score
        traj.verifier_reason = outcome.reason
        traj.verifier_details = dict(getattr(outcome, "details", None) or {}) or None
        if outcome.error:
            raise _EpisodeEnd(EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR, outcome.reason)


def _finish(
    traj: Trajectory, status: EpisodeStatus, category: FailureCategory, reason: str | None
) -> None:
    traj.status = status
    traj.failure_category = category
    traj.failure_reason = reason


async def run_episode(
    task: TaskInstance,
    policy: Policy,
    *,
    spec: SandboxSpec,
    run_key: str,
    settings: LoopSettings,
    rollout_index: int = 0,
    policy_seed: int | None = None,
    faults: FaultProfile | None = None,
    fault_seed: int = 0,
    verify: Verifier = run_verifier,
    open_sandbox: SandboxOpener,
    tools: Mapping[str, ToolSpec] | None = None,
) -> Trajectory:
    """Run one episode of `task` with `policy` in a fresh sandbox and return its trajectory.

    Args:
        spec: the `sandbox.SandboxSpec` of the jail.
        run_key, rollout_index: identify the episode (`episode_id_for`).
        settings: limits and caps (`LoopSettings`).
        policy_seed: seed handed to the policy; defaults to `rollout_index`, so the
            rollouts of one task differ and a re-run repeats them.
        faults, fault_seed: the `sandbox.FaultProfile` and its seed (None: no faults).
        verify: the verifier; defaults to `run_verifier`, the one runner of a `VerifierSpec`.
        open_sandbox: sandbox factory, built by the entry point with its settings
            (`sandbox.sandbox_opener(settings)`, a warm pool's; tests pass a double).
        tools: tools offered to the agent; defaults to the built-in tools.

    Raises:
        asyncio.CancelledError: the caller cancelled; the sandbox is closed first.
    """
    tools = dict(tools if tools is not None else BUILTIN_TOOLS)
    if task.environment is not None:  # a Harbor task: its own image and limits
        spec = task.environment.sandbox_spec(spec)
    seed = rollout_index if policy_seed is None else policy_seed
    fault_profile: dict[str, Any] = faults.model_dump(mode="json") if faults is not None else {}
    traj = Trajectory(
        episode_id=episode_id_for(run_key, task.task_id, rollout_index),
        run_key=run_key,
        task_id=task.task_id,
        rollout_index=rollout_index,
        suite=task.suite,
        suite_version=task.suite_version,
        template=task.template,
        task_version=task.template_version,
        instance_seed=task.seed,
        prompt=task.prompt,
        policy=policy.spec,
        policy_seed=seed,
        tool_versions={name: t.version for name, t in tools.items()},
        sandbox_spec_hash=spec.spec_hash(),
        fault_profile=fault_profile,
        fault_seed=fault_seed if faults is not None else None,
    )
    if task.environment is not None and task.environment.build_error:
        _finish(
            traj,
            EpisodeStatus.ENV_ERROR,
            FailureCategory.ENV_ERROR,
            f"the task's image could not be built: {task.environment.build_error}",
        )
        traj.ended_at = utcnow()
        return traj
    try:
        sandbox = await open_sandbox(spec, files=task.files, faults=faults, fault_seed=fault_seed)
    except SandboxError as e:
        _finish(
            traj, EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR, f"sandbox unavailable: {e}"
        )
        traj.ended_at = utcnow()
        return traj
    try:
        traj.sandbox_spec_hash = sandbox.spec_hash
        traj.tool_versions = {
            name: sandbox.tool_versions.get(name, t.version) for name, t in tools.items()
        }
        episode = _Episode(task, policy, traj, sandbox, tools, settings, seed)
        await _drive(episode, verify)
    finally:
        traj.ended_at = utcnow()
        await sandbox.close()
    return traj


async def _drive(episode: _Episode, verify: Verifier) -> None:
    traj, settings = episode.traj, episode.settings
    ended: _EpisodeEnd | None = None
    try:
        async with asyncio.timeout(settings.episode_timeout_s):
            try:
                await episode.run_steps()
            except _EpisodeEnd as e:
                ended = e
            verifiable = ended is None or (
                settings.verify_after_limits
                and ended.category in (FailureCategory.MAX_STEPS, FailureCategory.PARSE_FAILURES)
            )
            if verifiable:
                await episode.run_verifier(verify)
    except _EpisodeEnd as e:
        ended = e
    except TimeoutError:
        limit = settings.episode_timeout_s
        ended = _EpisodeEnd(
            EpisodeStatus.TIMEOUT,
            FailureCategory.TIMEOUT,
            f"episode passed {limit:g} s in the loop",
        )
    if ended is not None:
        _finish(traj, ended.status, ended.category, ended.reason)
        return
    if settings.success.is_success(traj.verifier_score):
        _finish(traj, EpisodeStatus.SUCCESS, FailureCategory.SUCCESS, None)
        return
    substituted = substituted_base_failure(episode.task, episode.policy, traj.verifier_reason)
    if substituted is not None:
        _finish(traj, EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR, substituted)
        return
    _finish(traj, EpisodeStatus.FAILED, FailureCategory.VERIFIER_FAILED, traj.verifier_reason)
