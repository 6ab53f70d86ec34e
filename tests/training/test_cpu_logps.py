"""`ChunkedLogpsMixin`: on CPU, the same per-token log-probabilities, entropies and
gradients as TRL's own `GRPOTrainer._get_per_token_logps_and_entropies` (its fused LM
head), on a tiny random Llama in fp32, with left-padded prompts and right-padded
completions. The trainer around the method is a stand-in holding only what the method
reads (`accelerator`, `args`, `temperature`): building a whole `GRPOTrainer` adds nothing
to what is compared."""

from __future__ import annotations

import functools
import inspect
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from training.trainers import cpu_logps
from training.trainers.common import module
from training.trainers.cpu_logps import ChunkedLogpsMixin, padding_spans

TEMPERATURE = 0.7
PROMPT, COMPLETION = 5, 7


def _trl_method() -> Any:
    return module("trl").GRPOTrainer._get_per_token_logps_and_entropies


class _Trainer:
    """What the method reads from a `GRPOTrainer`; the method itself is TRL's, undecorated
    (its profiling decorator reads a whole trainer's state)."""

    _get_per_token_logps_and_entropies = _trl_method().__wrapped__

    def __init__(self, entropy_bonus: bool = False) -> None:
        self.accelerator = SimpleNamespace(autocast=nullcontext, unwrap_model=lambda m: m)
        self.args = SimpleNamespace(cast_lm_head_to_fp32=False)
        self.temperature = TEMPERATURE
        self._entropy_bonus_enabled = entropy_bonus


class _Chunked(ChunkedLogpsMixin, _Trainer):
    pass


@pytest.fixture(scope="module")
def model() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).float()
    # As `GRPOTrainer.__init__` patches its policy.
    add_fused_lm_head(model, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows: prompts left-padded, completions right-padded (TRL's layout)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 300, (3, PROMPT + COMPLETION), generator=generator)
    mask = torch.ones_like(ids)
    for row, (prompt, completion) in enumerate([(5, 7), (3, 4), (4, 1)]):
        mask[row, : PROMPT - prompt] = 0
        mask[row, PROMPT + completion :] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def test_the_override_keeps_trls_signature() -> None:
    # A TRL upgrade that changes the method makes this fail: re-read its source then.
    def shape(method: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]

    assert shape(ChunkedLogpsMixin._get_per_token_logps_and_entropies) == shape(_trl_method())


@pytest.mark.parametrize(
    ("budget", "batch_size"),
    [
        (1 << 30, None),  # one head pass, logits kept for the backward
        (1, None),  # one row per head chunk, each checkpointed
        (2 * COMPLETION * 300 * 4, 2),  # two-row backbone and head chunks, checkpointed
    ],
)
@pytest.mark.parametrize("entropy_bonus", [False, True])
# Rows trimmed of their padding one by one (these three differ in length), or together.
@pytest.mark.parametrize("slack", [0.1, 10.0])
def test_log_probs_entropies_and_gradients_equal_trls(
    model: Any,
    budget: int,
    batch_size: int | None,
    entropy_bonus: bool,
    slack: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cpu_logps, "padding_spans", functools.partial(padding_spans, slack=slack))
    ids, mask = _batch()
    weights = torch.randn(3, COMPLETION, generator=torch.Generator().manual_seed(2))

    def run(trainer: Any) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        logps, entropies, aux = trainer._get_per_token_logps_and_entropies(
            model, ids, mask, COMPLETION, batch_size=batch_size, compute_entropy=True
        )
        assert aux is None
        objective = (logps * weights).sum()
        if entropy_bonus:
            objective = objective + (entropies * weights).sum()
        objective.backward()
        grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        return logps.detach(), entropies.detach(), grads

    chunked = _Chunked(entropy_bonus)
    chunked.logits_budget_bytes = budget
    ours, theirs = run(chunked), run(_Trainer(entropy_bonus))

    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-5)
    padding = mask[:, -COMPLETION:] == 0
    assert padding.any() and (ours[0][padding] == 0).all() and (ours[1][padding] == 0).all()
    assert len(ours[2]) == len(theirs[2])
    for mine, trl in zip(ours[2], theirs[2], strict=True):
        torch.testing.assert_close(mine, trl, rtol=1e-4, atol=1e-6)


def test_padding_spans_cover_every_token_once_and_bound_the_padding() -> None:
    # Eight rows of a multi-turn batch: prompts of 3-6 tokens left-padded to 6,
    # completions of 0-40 tokens right-padded to 40.
    prompt_width, completion_width = 6, 40
    shapes = [(6, 40), (3, 2), (5, 38), (4, 0), (6, 10), (3, 11), (6, 39), (5, 9)]
    mask = torch.zeros(len(shapes), prompt_width + completion_width, dtype=torch.long)
    for row, (prompt, completion) in enumerate(shapes):
        mask[row, prompt_width - prompt : prompt_width + completion] = 1

    spans = padding_spans(mask, prompt_width, slack=0.1)

    assert sorted(r for span in spans for r in span.rows) == list(range(len(shapes)))
    for span in spans:
        rows = list(span.rows)
        assert mask[rows, : span.first].sum() == 0 and mask[rows, span.end :].sum() == 0
        assert span.end > prompt_width  # a completion column to score, even when empty
        lengths = [
            max(prompt_width + c, prompt_width + 1) - (prompt_width - p)
            for p, c in (shapes[r] for r in rows)
        ]
        assert len(rows) * (span.end - span.first) <= 1.1 * sum(lengths) or len(rows) == 1
    # The long rows go together, apart from the short ones.
    assert any({0, 2, 6} <= set(span.rows) for span in spans)
    assert not any({0, 1} <= set(span.rows) for span in spans)


def test_no_entropy_unless_asked_and_the_reference_pass_needs_no_graph(model: Any) -> None:
    ids, mask = _batch()
    with torch.no_grad():
        logps, entropies, _ = _Chunked()._get_per_token_logps_and_entropies(
            model, ids, mask, COMPLETION
        )
    assert entropies is None and not logps.requires_grad
    with torch.no_grad():
        expected, _, _ = _Trainer()._get_per_token_logps_and_entropies(model, ids, mask, COMPLETION)
    torch.testing.assert_close(logps, expected, rtol=1e-5, atol=1e-5)


def test_what_the_override_does_not_cover_goes_to_trl(model: Any) -> None:
    calls: list[dict[str, Any]] = []

    class _Recorder(_Trainer):
        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return "trl", None, None

    class _Chunked2(ChunkedLogpsMixin, _Recorder):
        pass

    ids, mask = _batch()
    trainer = _Chunked2()
    assert (
        trainer._get_per_token_logps_and_entropies(
            model, ids, mask, COMPLETION, compute_aux_loss=True
        )[0]
        == "trl"
    )
    assert (
        trainer._get_per_token_logps_and_entropies(
            model, ids, mask, COMPLETION, pixel_values=torch.zeros(1)
        )[0]
        == "trl"
    )
    trainer.args.cast_lm_head_to_fp32 = True
    assert trainer._get_per_token_logps_and_entropies(model, ids, mask, COMPLETION)[0] == "trl"
    assert len(calls) == 3
