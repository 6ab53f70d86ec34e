"""The `hf:` policy with a tiny, randomly initialised Qwen2 checkpoint built here (no downloads).

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
from agent.settings import LoopSettings, PolicySettings
from agent.trajectory import EpisodeStatus, ParseKind
from sandbox.tool_specs import BUILTIN_TOOLS
from tests.agent.conftest import MemoryOpener, memory_verify

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    trl = pytest.importorskip("trl")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    template = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    if not template.is_file():
        pytest.skip(f"TRL ships no {template.name} in this version")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [
        '<tool_call id="c1" name="read_file">\n<arg name="path">data/in.txt</arg>\n</tool_call>',
        "<final>done</final> system user assistant tool You are an agent working inside a sandbox.",
    ] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = template.read_text()
    path = tmp_path_factory.mktemp("tiny-qwen2")
    fast.save_pretrained(path)
    config = transformers.Qwen2Config(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16384,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(path)
    return path


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
    policy = make_policy(f"hf:{tmp_path / 'nope'}")
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
