"""Re-encoding drift in the gate's report: per model, the share of steps whose sampled ids
are not the tokenizer's encoding of the answer text; a figure, never a verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.trajectory import Trajectory
from expectations.gate import run_gate
from expectations.report import render_markdown
from expectations.settings import QcConfig
from expectations.token_drift import TokenDrift, token_drift
from tests.scoring.qc_builders import oracle

pytestmark = pytest.mark.slow  # builds a tokenizer (transformers import)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained here on protocol text (no downloads)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ['<tool_call id="c1" name="list_dir">', "<final>Done.</final> The total is 42."] * 20
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    path = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(path)
    return path


def _with_ids(t: Trajectory, tokenizer, *, split_step: int | None) -> Trajectory:
    """`t` as an `hf:` policy records it: each answer's ids and the sampled end of turn;
    at `split_step`, the answer sampled byte by byte (same text, other ids)."""
    for step in t.steps:
        if step.index == split_step:
            pieces = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(step.raw_output)
            ids = [tokenizer.convert_tokens_to_ids(ch) for piece, _ in pieces for ch in piece]
            assert tokenizer.decode(ids) == step.raw_output
        else:
            ids = tokenizer(step.raw_output, add_special_tokens=False)["input_ids"]
        step.completion_token_ids = [*ids, tokenizer.eos_token_id]
        step.logprobs = [-1.0] * len(step.completion_token_ids)
    return t


def test_drift_is_a_figure_per_model_and_never_a_verdict(
    config: QcConfig, tokenizer_dir: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    hf = f"hf:{tokenizer_dir}"
    plain = [oracle(rollout=i) for i in range(4)]
    recorded = [
        _with_ids(oracle(rollout=i).model_copy(update={"policy": hf}), tokenizer, split_step=None)
        for i in range(3)
    ]
    recorded.append(
        _with_ids(oracle(rollout=3).model_copy(update={"policy": hf}), tokenizer, split_step=0)
    )
    served = _with_ids(
        oracle(rollout=9).model_copy(update={"policy": "openai:http://x/v1#m"}),
        tokenizer,
        split_step=None,
    )
    n = sum(len(t.steps) for t in recorded)

    report = run_gate([*recorded, served], config=config, engine="polars")
    assert report.token_drift == [
        TokenDrift(policy=hf, steps_with_ids=n, steps_differing=1),
        TokenDrift(
            policy="openai:http://x/v1#m", steps_with_ids=len(served.steps), steps_differing=None
        ),
    ]
    assert report.token_drift[0].share == pytest.approx(1 / n)
    assert report.token_drift[1].share is None  # no tokenizer for a served model here
    markdown = render_markdown(report)
    assert "## Sampled ids that re-encoding would change" in markdown
    assert f"| {hf} | {n} | 1 | {1 / n:.1%} |" in markdown
    assert "n/a (no tokenizer here)" in markdown

    # The same episodes without ids get the same verdicts, and no drift section.
    bare = run_gate([*plain, oracle(rollout=9)], config=config, engine="polars")
    assert bare.token_drift == [] and "re-encoding" not in render_markdown(bare)
    assert sorted(report.verdicts["verdict"].to_list()) == sorted(
        bare.verdicts["verdict"].to_list()
    )


def test_a_resolver_supplies_the_tokenizer_and_cut_answers_are_not_compared(
    tokenizer_dir: Path,
) -> None:
    """A trainer names its in-memory tokenizer for its spec; a cut answer is skipped."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    t = _with_ids(oracle().model_copy(update={"policy": "hf:run@step-3"}), tokenizer, split_step=0)
    t.steps[1].raw_output_truncated = True
    (drift,) = token_drift([t], tokenizer_for=lambda spec: tokenizer)
    assert (drift.steps_with_ids, drift.steps_differing) == (len(t.steps) - 1, 1)
