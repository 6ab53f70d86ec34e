"""The trainer's model as a rollout policy: prompts that extend, ids and logprobs recorded."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

from agent.policies.base import PolicyRequest
from agent.prompt import PromptStyle, render_system_prompt
from sandbox.tool_specs import BUILTIN_TOOLS
from suites.builtin import builtin_suite
from tests.training.factory import call_step, episode, final_step
from tests.training.trainer_policy import TrainerModelPolicy
from training.rollout_tokens import token_rollout
from training.trainers.common import load_model, load_tokenizer


def test_turns_extend_the_previous_prompt_and_are_recorded(tiny_base_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_base_model)
    policy = TrainerModelPolicy(
        load_model(tiny_base_model),
        tokenizer,
        spec="hf:grpo/test@0",
        prompt_style=PromptStyle.COMPACT,
        max_new_tokens=8,
    )
    task = builtin_suite().instances(1, templates=["dir_tree"])[0]
    tools = list(BUILTIN_TOOLS.values())
    system = policy.system_prompt(tools)
    assert system == render_system_prompt(tools, PromptStyle.COMPACT)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]

    def ask(index: int) -> str:
        request = PolicyRequest(
            task=task, messages=list(messages), tools=tools, step_index=index, seed=5
        )
        response = asyncio.run(policy.respond(request))
        assert response.completion_tokens is not None and 0 < response.completion_tokens <= 8
        return response.text

    first = ask(0)
    messages += [
        {"role": "assistant", "content": first},
        {"role": "user", "content": '<tool_error code="no_block">no block</tool_error>'},
    ]
    ask(1)

    traj = episode(rollout=5, steps=[call_step(0, "ls"), final_step(1)])
    traj.task_id, traj.policy_seed = task.task_id, 5
    policy.record_tokens(traj)
    s0, s1 = traj.steps
    assert s0.prompt_token_ids is not None and s0.completion_token_ids is not None
    assert s1.prompt_token_ids is not None and s1.logprobs is not None
    seen = s0.prompt_token_ids + s0.completion_token_ids
    assert s1.prompt_token_ids[: len(seen)] == seen  # prefix-extending, never re-rendered
    observation = tokenizer.decode(s1.prompt_token_ids[len(seen) :])
    assert "no block" in observation and observation.rstrip().endswith("assistant")
    assert (
        s0.prompt_token_ids
        == tokenizer(
            tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
    )
    assert all(lp <= 0.0 and math.isfinite(lp) for lp in s1.logprobs)
    rollout = token_rollout(traj)  # the module GRPO reads it with accepts it
    assert rollout.sampled_ids == s0.completion_token_ids + (s1.completion_token_ids or [])
    assert not policy._turns  # recorded turns are handed over once
