"""The `hf:` policy with a tiny, randomly initialised Qwen2 checkpoint (`tests/agent/conftest.py`).

The tokenizer is a byte-level BPE trained on a few protocol strings; the chat template is
TRL's `qwen2_5.jinja` from the installed package. The model's output is garbage by
design: the test asserts the episode runs, records what the model said and its parse
errors, and does not succeed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.errors import PolicyError
from agent.loop import run_episode
from agent.policies import HFPolicy, PolicyRequest, make_policy
from agent.policies.hf import HFGeneration, HFTokenStats
from agent.prompt import PromptStyle
from agent.settings import LoopSettings, PolicySettings
from agent.trajectory import EpisodeStatus, ParseKind, Trajectory
from sandbox import SandboxSettings, sandbox_opener
from sandbox.tool_specs import BUILTIN_TOOLS
from tests.agent.conftest import MemoryOpener, memory_verify

pytestmark = pytest.mark.slow


def test_generates_text_with_token_counts(tiny_checkpoint: Path, task) -> None:
    policy = make_policy(f"hf:{tiny_checkpoint}", settings=PolicySettings(max_tokens=12))
    assert isinstance(policy, HFPolicy)
    request = PolicyRequest(
        task=task,
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": task.prompt}],
        tools=list(BUILTIN_TOOLS.values()),
    )

    async def go():
        try:
            return await policy.respond(request), await policy.respond(request)
        finally:
            await policy.aclose()

    first, second = asyncio.run(go())
    assert first.text == second.text  # greedy decoding is deterministic
    assert first.prompt_tokens and first.prompt_tokens > 10
    assert first.completion_tokens is not None and 0 < first.completion_tokens <= 12


def test_episode_with_the_tiny_model_records_parse_errors(
    tiny_checkpoint: Path, task, spec
) -> None:
    policy = make_policy(f"hf:{tiny_checkpoint}", settings=PolicySettings(max_tokens=16))
    settings = LoopSettings(max_steps=3)

    async def go():
        try:
            return await run_episode(
                task,
                policy,
                spec=spec,
                run_key="hf",
                settings=settings,
                open_sandbox=MemoryOpener(),
                verify=memory_verify,
            )
        finally:
            await policy.aclose()

    traj = asyncio.run(go())
    assert traj.status != EpisodeStatus.SUCCESS
    assert traj.status not in (EpisodeStatus.POLICY_ERROR, EpisodeStatus.ENV_ERROR), (
        traj.failure_reason
    )
    assert len(traj.steps) == 3
    for step in traj.steps:
        assert step.completion_tokens and step.prompt_tokens and step.generation_latency_ms
        assert step.parse_kind in (ParseKind.NONE, ParseKind.ERROR)
        assert step.parse_error and step.observation and step.observation.startswith("<tool_error")


def test_missing_checkpoint_is_a_policy_error(tmp_path: Path, task, spec) -> None:
    policy = make_policy(f"hf:{tmp_path / 'nope'}", settings=PolicySettings())
    traj = asyncio.run(
        run_episode(
            task,
            policy,
            spec=spec,
            run_key="hf",
            settings=LoopSettings(),
            open_sandbox=MemoryOpener(),
            verify=memory_verify,
        )
    )
    assert traj.status == EpisodeStatus.POLICY_ERROR and "not a directory" in (
        traj.failure_reason or ""
    )


def test_generation_never_runs_past_the_model_context(
    tiny_checkpoint: Path, task, tmp_path: Path
) -> None:
    """Answers are cut to the positions left; a full context is a policy error, not a crash."""
    import json
    import shutil

    small = tmp_path / "small-context"
    shutil.copytree(tiny_checkpoint, small)
    config = json.loads((small / "config.json").read_text())
    config["max_position_embeddings"] = 160
    (small / "config.json").write_text(json.dumps(config))
    policy = make_policy(f"hf:{small}", settings=PolicySettings(max_tokens=200))

    def request(content: str) -> PolicyRequest:
        return PolicyRequest(
            task=task,
            messages=[{"role": "user", "content": content}],
            tools=list(BUILTIN_TOOLS.values()),
        )

    async def go() -> tuple[object, BaseException | None]:
        try:
            short = await policy.respond(request("hi"))
            try:
                await policy.respond(request("word " * 400))
            except PolicyError as e:
                return short, e
            return short, None
        finally:
            await policy.aclose()

    short, error = asyncio.run(go())
    assert short.prompt_tokens + short.completion_tokens <= 160  # type: ignore[attr-defined]
    assert isinstance(error, PolicyError) and "context" in str(error)


# Token-exact capture (issue 42 item 4): the ids the model sampled, and prompts that extend.


def _episodes(policy, tasks, spec, *, steps: int, open_sandbox=None, verify=None):
    """Run one episode per task concurrently with `policy`, then close it."""
    extra = (
        {"open_sandbox": sandbox_opener(SandboxSettings())}
        if open_sandbox is None
        else {"open_sandbox": open_sandbox, "verify": verify}
    )

    async def go():
        try:
            return await asyncio.gather(
                *(
                    run_episode(
                        t,
                        policy,
                        spec=spec,
                        run_key="hf-tokens",
                        rollout_index=i,
                        settings=LoopSettings(max_steps=steps),
                        **extra,
                    )
                    for i, t in enumerate(tasks)
                )
            )
        finally:
            await policy.aclose()

    return asyncio.run(go())


def _assert_token_exact(traj) -> None:
    """Every step recorded its ids and logprobs, and each prompt extends the last turn's."""
    assert traj.status not in (EpisodeStatus.POLICY_ERROR, EpisodeStatus.ENV_ERROR), (
        traj.failure_reason
    )
    for step in traj.steps:
        assert step.prompt_token_ids and step.completion_token_ids
        assert step.logprobs is not None and len(step.logprobs) == len(step.completion_token_ids)
        assert all(lp <= 0.0 for lp in step.logprobs)
        assert step.prompt_tokens == len(step.prompt_token_ids)
        assert step.completion_tokens == len(step.completion_token_ids)
    for before, after in zip(traj.steps, traj.steps[1:], strict=False):
        sent = before.prompt_token_ids + before.completion_token_ids
        assert after.prompt_token_ids[: len(sent)] == sent
        assert len(after.prompt_token_ids) > len(sent)  # the observation turn follows


def test_multi_turn_episode_in_a_real_jail_is_token_exact(tiny_checkpoint: Path, task, spec):
    """Turn k+1's prompt ids start with turn k's prompt and completion ids, in a real jail;
    the tail between them is the template's end of turn and the observation, encoded."""
    pytest.importorskip("sandbox")
    policy = HFPolicy(tiny_checkpoint, PolicySettings(max_tokens=16))
    (traj,) = _episodes(policy, [task], spec, steps=3)
    if traj.status == EpisodeStatus.ENV_ERROR and "unavailable" in (traj.failure_reason or ""):
        pytest.skip(f"nsjail cannot start here: {traj.failure_reason}")
    assert len(traj.steps) == 3
    _assert_token_exact(traj)
    stats = policy.token_stats
    assert (stats.answers, stats.extended_prompts, stats.full_renders) == (3, 2, 0)
    # Turns 2 and 3 were prefilled from the cache the turn before left: the earlier
    # turns' prompt and answer ids but the last answer token (which was never fed).
    sent = [len(s.prompt_token_ids) + len(s.completion_token_ids) - 1 for s in traj.steps[:2]]
    assert stats.cached_prompt_tokens == sum(sent)
    # The observation the loop fed back is in the tail, as the template renders it.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint), local_files_only=True)
    first, second = traj.steps[0], traj.steps[1]
    tail = second.prompt_token_ids[len(first.prompt_token_ids) + len(first.completion_token_ids) :]
    text = str(tokenizer.decode(tail))
    assert first.observation and first.observation in text
    assert text.endswith("<|im_start|>assistant\n")


def test_recorded_logprobs_are_the_model_s(tiny_checkpoint: Path, task):
    """The logprob of each sampled token equals a teacher-forced pass over prompt + answer
    (what a trainer recomputes), at the sampling temperature."""
    import torch
    from transformers import AutoModelForCausalLM

    for generation in (HFGeneration(), HFGeneration(do_sample=True, temperature=0.7, seed=3)):
        policy = HFPolicy(tiny_checkpoint, PolicySettings(max_tokens=10), generation=generation)
        request = PolicyRequest(
            task=task,
            messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}],
            tools=list(BUILTIN_TOOLS.values()),
        )
        answer = asyncio.run(policy.respond(request))
        asyncio.run(policy.aclose())
        assert answer.prompt_token_ids and answer.completion_token_ids and answer.logprobs
        model = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), local_files_only=True)
        ids = torch.tensor([answer.prompt_token_ids + answer.completion_token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(answer.prompt_token_ids) - 1 : -1]
        temperature = generation.temperature if generation.do_sample else 1.0
        expected = torch.log_softmax(logits.float() / temperature, dim=-1)
        picked = expected.gather(1, torch.tensor(answer.completion_token_ids)[:, None])[:, 0]
        assert torch.allclose(picked, torch.tensor(answer.logprobs), atol=1e-4)


def test_sampled_rollouts_batch_across_episodes_and_repeat_with_a_seed(tiny_checkpoint: Path, spec):
    """Concurrent episodes share generate calls (left-padded); each stays token-exact; a
    seeded sampler repeats the same rollouts; sampling differs from greedy."""
    from tests.agent.conftest import make_copy_task

    tasks = [make_copy_task(seed) for seed in range(3)]
    # The window lets the three episodes' turns meet in one batch on a loaded machine too.
    generation = HFGeneration(do_sample=True, seed=11, batch_window_s=0.5, max_batch_size=4)

    def run() -> tuple[list[Trajectory], HFTokenStats]:
        policy = HFPolicy(tiny_checkpoint, PolicySettings(max_tokens=12), generation=generation)
        trajs = _episodes(
            policy, tasks, spec, steps=2, open_sandbox=MemoryOpener(), verify=memory_verify
        )
        return trajs, policy.token_stats

    first, stats = run()
    for traj in first:
        _assert_token_exact(traj)
    assert stats.largest_batch > 1 and stats.batches < stats.answers
    again, _ = run()
    assert [[s.completion_token_ids for s in t.steps] for t in again] == [
        [s.completion_token_ids for s in t.steps] for t in first
    ]


def test_a_full_batch_runs_without_waiting_out_its_window(tiny_checkpoint: Path, task):
    """`batch_window_s` holds a batch open for more requests only while fewer than
    `max_batch_size` wait: four requests arriving together run as one batch at once, not
    after the (here one-minute) window."""
    import time

    generation = HFGeneration(do_sample=True, seed=3, batch_window_s=60.0, max_batch_size=4)
    policy = HFPolicy(tiny_checkpoint, PolicySettings(max_tokens=6), generation=generation)
    request = PolicyRequest(
        task=task,
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": task.prompt}],
        tools=list(BUILTIN_TOOLS.values()),
    )

    async def go() -> float:
        started = time.monotonic()
        try:
            answers = await asyncio.gather(*(policy.respond(request) for _ in range(4)))
            assert all(a.completion_token_ids for a in answers)
            return time.monotonic() - started
        finally:
            await policy.aclose()  # no request left: the worker ends without a window

    elapsed = asyncio.run(go())
    stats = policy.token_stats
    assert (stats.batches, stats.largest_batch, stats.answers) == (1, 4, 4)
    assert elapsed < 30.0  # far below the window: the full batch did not wait for it


def test_a_loaded_model_is_driven_in_place(tiny_checkpoint: Path, task):
    """`from_loaded` generates with the caller's model and tokenizer, restores its training
    mode, and leaves both to the caller after `aclose`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint), local_files_only=True)
    model.train()
    policy = HFPolicy.from_loaded(
        model,
        tokenizer,
        PolicySettings(max_tokens=8),
        spec="hf:trainer@step-0",
        prompt_style=PromptStyle.COMPACT,
    )
    assert policy.system_prompt(BUILTIN_TOOLS.values()).startswith("Protocol v")
    request = PolicyRequest(
        task=task,
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}],
        tools=list(BUILTIN_TOOLS.values()),
    )

    async def go():
        try:
            return await policy.respond(request)
        finally:
            await policy.aclose()

    answer = asyncio.run(go())
    assert answer.completion_token_ids and model.training
    greedy = HFPolicy(tiny_checkpoint, PolicySettings(max_tokens=8))
    assert asyncio.run(greedy.respond(request)).completion_token_ids == answer.completion_token_ids
    asyncio.run(greedy.aclose())
    assert asyncio.run(policy.respond(request)).text == answer.text  # still usable


def test_atif_export_carries_the_sampled_tokens(tiny_checkpoint: Path, task, spec):
    """An `hf:` episode's ids and logprobs go into ATIF step metrics and come back."""
    import json

    from agent.export import from_atif, to_atif

    policy = HFPolicy(tiny_checkpoint, PolicySettings(max_tokens=8))
    (traj,) = _episodes(
        policy, [task], spec, steps=2, open_sandbox=MemoryOpener(), verify=memory_verify
    )
    document = json.loads(json.dumps(to_atif(traj)))
    agent_steps = [s for s in document["steps"] if s["source"] == "agent"]
    assert [s["metrics"]["completion_token_ids"] for s in agent_steps] == [
        s.completion_token_ids for s in traj.steps
    ]
    assert [s["metrics"]["logprobs"] for s in agent_steps] == [s.logprobs for s in traj.steps]
    assert from_atif(document).model_dump() == traj.model_dump()


def test_an_episode_reads_back_as_one_masked_stream(tiny_checkpoint: Path, task, spec):
    """`episode_tokens`: the first prompt, then answers (mask 1, their logprobs) and the
    tails between them (mask 0); the last prompt and answer are the whole stream. A step
    whose prompt was a full render breaks the stream, and says so."""
    from agent.errors import TokenStreamError
    from agent.policies.hf_tokens import episode_tokens

    policy = HFPolicy(tiny_checkpoint, PolicySettings(max_tokens=8))
    (traj,) = _episodes(
        policy, [task], spec, steps=3, open_sandbox=MemoryOpener(), verify=memory_verify
    )
    tokens = episode_tokens(traj.steps)
    last = traj.steps[-1]
    assert tokens.prompt_ids == traj.steps[0].prompt_token_ids
    assert (
        tokens.prompt_ids + tokens.completion_ids
        == last.prompt_token_ids + last.completion_token_ids
    )
    assert len(tokens.sampled_mask) == len(tokens.logprobs) == len(tokens.completion_ids)
    assert sum(tokens.sampled_mask) == sum(len(s.completion_token_ids) for s in traj.steps)
    sampled = [lp for lp, m in zip(tokens.logprobs, tokens.sampled_mask, strict=True) if m]
    assert sampled == [lp for s in traj.steps for lp in s.logprobs]
    broken = [traj.steps[0], traj.steps[1].model_copy(update={"prompt_token_ids": [1, 2, 3]})]
    with pytest.raises(TokenStreamError, match="step 1's prompt does not extend"):
        episode_tokens(broken)


def test_greedy_by_default_generates_one_request_at_a_time(tiny_checkpoint: Path, spec):
    """Without `max_batch_size`, concurrent episodes queue as before batching existed."""
    from tests.agent.conftest import make_copy_task

    policy = HFPolicy(tiny_checkpoint, PolicySettings(max_tokens=6))
    tasks = [make_copy_task(seed) for seed in range(2)]
    trajs = _episodes(
        policy, tasks, spec, steps=2, open_sandbox=MemoryOpener(), verify=memory_verify
    )
    assert all(len(t.steps) == 2 for t in trajs)
    stats = policy.token_stats
    assert (stats.largest_batch, stats.batches, stats.answers) == (1, 4, 4)


REWRITING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and not loop.last %}[earlier answer]"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A template that rewrites earlier answers once later turns follow (as templates that
drop an earlier turn's reasoning do): the prefix cannot hold."""


def test_a_template_that_rewrites_earlier_turns_falls_back_to_a_full_render(
    tiny_checkpoint: Path, task, spec, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import shutil

    from transformers import AutoTokenizer

    rewriting = tmp_path / "rewriting"
    shutil.copytree(tiny_checkpoint, rewriting)
    tokenizer = AutoTokenizer.from_pretrained(str(rewriting), local_files_only=True)
    tokenizer.chat_template = REWRITING_TEMPLATE
    tokenizer.save_pretrained(rewriting)
    policy = HFPolicy(rewriting, PolicySettings(max_tokens=6))
    with caplog.at_level(logging.WARNING, logger="agent.policies.hf"):
        (traj,) = _episodes(
            policy, [task], spec, steps=3, open_sandbox=MemoryOpener(), verify=memory_verify
        )
    assert len(traj.steps) == 3
    stats = policy.token_stats
    assert (stats.extended_prompts, stats.full_renders) == (0, 2)
    warnings = [r.getMessage() for r in caplog.records if "do not extend" in r.getMessage()]
    assert len(warnings) == 1 and "renders an earlier turn differently" in warnings[0]
    # The fallback prompt is the whole history rendered and encoded, as before.
    assert traj.steps[2].prompt_token_ids is not None
    assert tokenizer.decode(traj.steps[2].prompt_token_ids).count("[earlier answer]") == 2


def test_a_generation_replica_holds_the_trainers_current_weights(tiny_checkpoint: Path, task):
    """`GenerationReplica`: a copy of the trainer's model in the generation dtype, its
    weights copied again when the policy version changes (not when it does not); an fp32
    replica answers exactly as the model; a bf16 one holds the weights rounded to bf16."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent.policies.hf_replica import GenerationReplica

    model = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint), local_files_only=True)
    model.train()
    request = PolicyRequest(
        task=task,
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}],
        tools=list(BUILTIN_TOOLS.values()),
    )

    def answer(m):
        policy = HFPolicy.from_loaded(m, tokenizer, PolicySettings(max_tokens=8), spec="hf:t")

        async def go():
            try:
                return await policy.respond(request)
            finally:
                await policy.aclose()

        return asyncio.run(go())

    fp32 = GenerationReplica("float32")
    replica = fp32.sync(model, version=0)
    assert replica is not model and not replica.training
    assert not any(p.requires_grad for p in replica.parameters())
    assert answer(replica).completion_token_ids == answer(model).completion_token_ids
    with torch.no_grad():  # an optimiser step
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    assert fp32.sync(model, version=0) is replica and fp32.syncs == 1  # same version: no copy
    assert not torch.equal(replica.lm_head.weight, model.lm_head.weight)
    assert fp32.sync(model, version=1) is replica and fp32.syncs == 2
    theirs = model.state_dict()
    for name, mine in replica.state_dict().items():
        assert torch.equal(mine, theirs[name]), name
    assert answer(replica).completion_token_ids == answer(model).completion_token_ids
    assert model.training  # the trainer's model is left as it was

    bf16 = GenerationReplica("bfloat16").sync(model, version=1)
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    assert torch.equal(bf16.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))
    assert answer(bf16).completion_token_ids  # it generates, token ids recorded


def test_a_replica_refuses_weights_of_another_model(tiny_checkpoint: Path):
    """Weights that do not fit the replica's model are a `PolicyLoadError`, not a crash."""
    import torch
    from transformers import AutoModelForCausalLM

    from agent.errors import PolicyLoadError
    from agent.policies.hf_replica import GenerationReplica

    model = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), local_files_only=True)
    replica = GenerationReplica("float32")
    replica.sync(model, version=0)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(torch.zeros(3, 3))
    with pytest.raises(PolicyLoadError, match="float32 replica"):
        replica.sync(model, version=1)


def test_a_cancelled_turn_leaves_the_decoding_batch(tiny_checkpoint: Path, task):
    """A turn whose caller stops waiting (the loop's policy timeout, a stop) is not decoded
    to its budget: its row leaves at the next step, unanswered, and the worker ends."""
    policy = HFPolicy(tiny_checkpoint, PolicySettings(max_tokens=4000))
    request = PolicyRequest(
        task=task,
        # Greedy, this checkpoint answers this prompt without an end of turn: 4,000 tokens.
        messages=[
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "tool user assistant"},
        ],
        tools=list(BUILTIN_TOOLS.values()),
    )

    async def go() -> None:
        turn = asyncio.ensure_future(policy.respond(request))
        await asyncio.sleep(1.0)
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        await asyncio.wait_for(policy.aclose(), timeout=30)

    asyncio.run(go())
    stats = policy.token_stats
    assert stats.answers == 0
    assert 0 < stats.decode_steps < 4000
