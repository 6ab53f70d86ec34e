"""GRPO reward functions: the protocol's format check, and the sandbox with the task's verifier.

A GRPO rollout here is one assistant turn answering the task prompt (system prompt +
task, as the episode loop shows them). TRL's own `environment_factory` speaks the model's
native JSON tool-calling format, not protocol v1, so training through it would teach a
format deployment never parses (seed 000 §4.5); the rewards below parse with the loop's
parser instead.

- `ProtocolReward`: +1 for a valid tool call or final answer, 0 for no block, -1 for a
  protocol error. Deterministic, needs no sandbox (tests, warm-up).
- `SandboxReward`: the turn runs for real, as a one-turn episode of the episode loop
  (`agent.loop.run_episode`: a fresh nsjail sandbox holding the task's workspace, the
  call, then the one verifier runner), rewarded by `scoring.rewards.apply_rewards` — the
  function every stored episode is rewarded with. The GRPO reward is that episode's
  `total_reward`: `scoring.rewards.final_reward` of the verifier score plus the step's
  shaping (format, exploration; seed 000 §4.3), so GRPO optimises exactly the reward
  stored with an episode of the same turn. A broken sandbox or verifier raises
  `RewardEnvironmentError` instead of becoming a reward.

Both follow TRL's reward-function shape: `f(prompts, completions, **columns) -> list[float]`,
the snapshot's `task_id`, `suite`, `template`, `instance_seed` columns arriving as lists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from agent.errors import ProtocolError
from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from agent.protocol import ParsedMessage, parse_message
from agent.settings import LoopSettings
from agent.trajectory import INFRASTRUCTURE_STATUSES, ParseKind, Trajectory
from sandbox.tool_specs import BUILTIN_TOOLS, ToolSpec
from scoring.settings import RewardSettings
from tasks.types import TaskInstance
from training.errors import RewardEnvironmentError

if TYPE_CHECKING:
    from sandbox.settings import SandboxSettings
    from suites.settings import SuitesSettings

__all__ = [
    "ProtocolReward",
    "RewardFunction",
    "SandboxReward",
    "TaskResolver",
    "completion_text",
    "format_reward",
    "rollout_loop",
    "suite_task_resolver",
]

TaskResolver = Callable[[str, str, int, str], TaskInstance]
"""`(suite, template, instance_seed, task_id) -> TaskInstance`: regenerates a snapshot's task."""


class RewardFunction(Protocol):
    """TRL's reward-function shape."""

    def __call__(
        self, prompts: list[Any], completions: list[Any], **kwargs: Any
    ) -> list[float]: ...


def completion_text(completion: Any) -> str:
    """The assistant text of a TRL completion (a string, or a list of chat messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, Mapping))
    return str(completion)


def _parse(text: str, tools: Mapping[str, ToolSpec]) -> ParsedMessage | None:
    try:
        return parse_message(text, tools)
    except ProtocolError:
        return None


def format_reward(parsed: ParsedMessage | None) -> float:
    """+1 for a valid call or final answer, 0 for no block, -1 for a protocol error."""
    if parsed is None:
        return -1.0
    return 0.0 if parsed.kind == ParseKind.NONE else 1.0


class ProtocolReward:
    """Format reward from the protocol v1 parser (with the built-in tools' schemas)."""

    __name__ = "protocol_reward"

    def __init__(self, tools: Mapping[str, ToolSpec] | None = None) -> None:
        self.tools = dict(tools if tools is not None else BUILTIN_TOOLS)

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        return [format_reward(_parse(completion_text(c), self.tools)) for c in completions]


def suite_task_resolver(suites: SuitesSettings, sandbox: SandboxSettings) -> TaskResolver:
    """Regenerate tasks from the installed suites (built-in and user suites, found with
    `suites`; user generators run in jails of `sandbox`), cached per suite."""
    from suites.registry import load_suite
    from suites.suite import Suite

    cache: dict[str, Suite] = {}

    def resolve(suite: str, template: str, seed: int, task_id: str) -> TaskInstance:
        if suite not in cache:
            cache[suite] = load_suite(suite, settings=suites, sandbox=sandbox)
        task = cache[suite].generate(template, seed)
        if task.task_id != task_id:
            raise ValueError(
                f"task {task_id} regenerates as {task.task_id}: the suite changed since the "
                "snapshot was taken"
            )
        return task

    return resolve


SandboxOpener = Callable[..., Awaitable[Any]]
"""`open_sandbox(spec, *, files=…) -> Sandbox` (the sandbox package's signature)."""


def rollout_loop(loop: LoopSettings) -> LoopSettings:
    """The loop of a GRPO rollout: the entry point's `loop`, for one assistant turn; the
    verifier still scores it (`verify_after_limits`)."""
    return loop.model_copy(update={"max_steps": 1, "max_consecutive_parse_failures": 1})


class _RolloutTurn(Policy):
    """The policy of a rollout's episode: it answers the sampled completion, once."""

    spec = "grpo:rollout"

    def __init__(self, text: str) -> None:
        self.text = text

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        return PolicyResponse(text=self.text)


class SandboxReward:
    """Run the turn as a one-turn episode in a real sandbox; its stored reward is the GRPO reward.

    The entry point's settings: `rewards` (the episode rewards), `loop` (limits, as
    `rollout_loop` narrows them), `sandbox` (the jails: default opener) and `suites` (the
    default task resolver); `resolve_task` and `open_sandbox` replace the defaults."""

    __name__ = "sandbox_reward"

    def __init__(
        self,
        rewards: RewardSettings,
        *,
        loop: LoopSettings,
        sandbox: SandboxSettings,
        suites: SuitesSettings,
        resolve_task: TaskResolver | None = None,
        spec: Any = None,
        open_sandbox: SandboxOpener | None = None,
        tools: Mapping[str, ToolSpec] | None = None,
        concurrency: int = 4,
    ) -> None:
        from sandbox import SandboxSpec, sandbox_opener

        self.rewards = rewards
        self.loop = rollout_loop(loop)
        self.resolve_task = (
            resolve_task if resolve_task is not None else suite_task_resolver(suites, sandbox)
        )
        self.spec = spec if spec is not None else SandboxSpec()
        self.open_sandbox = open_sandbox if open_sandbox is not None else sandbox_opener(sandbox)
        self.tools = dict(tools if tools is not None else BUILTIN_TOOLS)
        self.concurrency = concurrency

    async def episode(self, task: TaskInstance, text: str) -> Trajectory:
        """The rewarded one-turn episode of `text` on `task` (what a collection would store).

        Raises:
            RewardEnvironmentError: the sandbox or the verifier broke (an environment
                problem, not a policy failure: it must not be turned into a reward).
        """
        from agent.loop import run_episode
        from scoring.rewards import apply_rewards

        trajectory = await run_episode(
            task,
            _RolloutTurn(text),
            spec=self.spec,
            run_key="grpo-rollout",
            settings=self.loop,
            open_sandbox=self.open_sandbox,
            tools=self.tools,
        )
        if trajectory.status in INFRASTRUCTURE_STATUSES:
            raise RewardEnvironmentError(
                f"GRPO rollout on {task.task_id} could not be scored: {trajectory.failure_reason}"
            )
        return apply_rewards(trajectory, self.rewards)

    async def score_one(self, task: TaskInstance, text: str) -> float:
        """The reward of one assistant turn on `task`: its episode's `total_reward`.

        Raises:
            RewardEnvironmentError: as `episode`.
        """
        total = (await self.episode(task, text)).total_reward
        assert total is not None  # apply_rewards always sets it
        return total

    async def score_all(self, tasks: Sequence[TaskInstance], texts: Sequence[str]) -> list[float]:
        gate = asyncio.Semaphore(self.concurrency)

        async def bounded(task: TaskInstance, text: str) -> float:
            async with gate:
                return await self.score_one(task, text)

        return list(
            await asyncio.gather(*(bounded(t, x) for t, x in zip(tasks, texts, strict=True)))
        )

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        tasks = [
            self.resolve_task(suite, template, int(seed), task_id)
            for suite, template, seed, task_id in zip(
                kwargs["suite"],
                kwargs["template"],
                kwargs["instance_seed"],
                kwargs["task_id"],
                strict=True,
            )
        ]
        texts = [completion_text(c) for c in completions]
        return asyncio.run(self.score_all(tasks, texts))
