"""`PlainSFTLossMixin`: on CPU, the same SFT loss, gradients and logged metrics as TRL's
own `SFTTrainer.compute_loss` (its fused LM head), on a tiny random Llama in fp32, with
right padding and masked prompt tokens. Both paths run on one real `SFTTrainer` built
with the mixin: TRL's is its `compute_loss` called past the mixin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from training.trainers.common import module
from training.trainers.cpu_sft_loss import PlainSFTLossMixin

VOCAB = 300
ROWS = [(2, 9), (4, 6), (3, 3)]  # (prompt, completion) tokens; padded to 11 on the right
LENGTH = 11
_MISSING = object()


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")


def _model() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).float()


def _build(base: type, output_dir: Path, *, bf16: bool = False) -> Any:
    from datasets import Dataset

    trl = module("trl")
    trainer_class = type("Trainer", (PlainSFTLossMixin, base), {})
    rows = [{"input_ids": [5, 6, 7, 1], "completion_mask": [0, 1, 1, 1]}]
    config = trl.SFTConfig(
        output_dir=str(output_dir),
        report_to="none",
        use_cpu=True,
        bf16=bf16,
        max_steps=1,
        save_strategy="no",
        activation_checkpointing=False,
        disable_tqdm=True,
        dataset_num_proc=None,
    )
    return trainer_class(
        model=_model(),
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=_tokenizer(),
    )


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    built = _build(module("trl").SFTTrainer, tmp_path_factory.mktemp("sft"))
    built.lm_head_ranks = []
    built.model.lm_head.register_forward_hook(
        lambda _m, args, _o: built.lm_head_ranks.append(args[0].dim())
    )
    return built


def _batch() -> dict[str, torch.Tensor]:
    """TRL's collator layout: right padding, labels -100 on prompt and padding tokens."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (len(ROWS), LENGTH), generator=generator)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, (prompt, completion) in enumerate(ROWS):
        mask[row, : prompt + completion] = 1
        labels[row, prompt : prompt + completion] = ids[row, prompt : prompt + completion]
    ids = ids.masked_fill(mask == 0, 0)
    position_ids = torch.arange(LENGTH).expand(len(ROWS), -1).clone()
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": labels,
        "position_ids": position_ids,
    }


def _run(trainer: Any, compute_loss: Any, batch: dict[str, torch.Tensor], **kwargs: Any) -> Any:
    """Loss, gradients and the metrics one call logged, from a fresh metric state."""
    model = trainer.model
    model.zero_grad(set_to_none=True)
    trainer._metrics["train"].clear()
    trainer._total_train_tokens = 0
    loss = compute_loss(model, dict(batch), **kwargs)
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    metrics = {key: list(values) for key, values in trainer._metrics["train"].items()}
    return loss.detach(), grads, metrics


def _trl(trainer: Any) -> Any:
    return lambda *args, **kwargs: module("trl").SFTTrainer.compute_loss(trainer, *args, **kwargs)


def _plain_calls(trainer: Any) -> list[int]:
    """The rank of each input to the LM head from now on (the fixture's hook): 2 is this
    path's flat rows; TRL's fused head never calls the module, the model's forward passes 3."""
    calls: list[int] = trainer.lm_head_ranks
    calls.clear()
    return calls


@pytest.mark.parametrize("budget", [1 << 30, 1])  # one head pass; one checkpointed row a chunk
@pytest.mark.parametrize("accumulated", [None, 40])  # num_items_in_batch: this batch's 18 of 40
def test_loss_gradients_and_metrics_equal_trls(
    trainer: Any, budget: int, accumulated: int | None
) -> None:
    trainer.model.train()
    trainer.logits_budget_bytes = budget
    batch = _batch()
    items = None if accumulated is None else torch.tensor(accumulated)
    calls = _plain_calls(trainer)
    ours = _run(trainer, trainer.compute_loss, batch, num_items_in_batch=items)
    assert calls and set(calls) == {2}
    theirs = _run(trainer, _trl(trainer), batch, num_items_in_batch=items)

    assert int((batch["labels"] != -100).sum()) == 18
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    assert len(ours[1]) == len(theirs[1]) == len(list(trainer.model.parameters()))
    for mine, trl in zip(ours[1], theirs[1], strict=True):
        torch.testing.assert_close(mine, trl, rtol=1e-4, atol=1e-6)
    assert set(ours[2]) == {"entropy", "mean_token_accuracy", "num_tokens"}
    assert ours[2]["num_tokens"] == theirs[2]["num_tokens"] == [int(batch["attention_mask"].sum())]
    assert ours[2]["mean_token_accuracy"] == theirs[2]["mean_token_accuracy"]
    assert ours[2]["entropy"] == pytest.approx(theirs[2]["entropy"], rel=1e-5)


def test_accumulated_batches_sum_to_the_loss_of_the_whole(trainer: Any) -> None:
    trainer.model.train()
    trainer.logits_budget_bytes = 1 << 30
    batch = _batch()
    halves = [
        {key: value[rows] for key, value in batch.items()} for rows in (slice(0, 1), slice(1, 3))
    ]
    total = torch.tensor(18)
    parts = [
        _run(trainer, trainer.compute_loss, half, num_items_in_batch=total)[0] for half in halves
    ]
    whole = _run(trainer, trainer.compute_loss, batch)[0]
    torch.testing.assert_close(sum(parts), whole, rtol=1e-5, atol=1e-6)


def test_under_bf16_autocast_the_head_runs_in_bf16_and_agrees_with_trls(tmp_path: Path) -> None:
    # The prepared model's forward runs TRL's fused head under the accelerator's autocast;
    # the override enters that autocast itself, around the backbone and the head.
    trainer = _build(module("trl").SFTTrainer, tmp_path, bf16=True)
    assert trainer.accelerator.native_amp
    dtypes: list[torch.dtype] = []
    trainer.model.lm_head.register_forward_hook(lambda _m, _a, output: dtypes.append(output.dtype))
    trainer.model.train()
    batch = _batch()
    ours = _run(trainer, trainer.compute_loss, batch)
    assert dtypes and set(dtypes) == {torch.bfloat16}
    with trainer.accelerator.autocast():
        theirs = _run(trainer, _trl(trainer), batch)
    torch.testing.assert_close(ours[0], theirs[0], rtol=2e-2, atol=1e-3)
    for mine, trl in zip(ours[1], theirs[1], strict=True):
        assert (mine - trl).norm() <= 0.05 * trl.norm()
    assert ours[2]["mean_token_accuracy"] == pytest.approx(theirs[2]["mean_token_accuracy"])


def test_a_batch_without_labels_gives_a_zero_loss_connected_to_the_model(trainer: Any) -> None:
    trainer.model.train()
    batch = _batch()
    batch["labels"] = torch.full_like(batch["labels"], -100)
    loss, grads, metrics = _run(trainer, trainer.compute_loss, batch)
    assert loss.item() == 0.0 and grads and all((g == 0).all() for g in grads)
    assert metrics["entropy"] == metrics["mean_token_accuracy"] == [0.0]


def test_evaluation_logs_eval_metrics_without_a_graph(trainer: Any) -> None:
    trainer.model.eval()
    trainer._metrics["eval"].clear()
    try:
        with torch.no_grad():
            ours = trainer.compute_loss(trainer.model, _batch())
            theirs = _trl(trainer)(trainer.model, _batch())
    finally:
        trainer.model.train()
    assert not ours.requires_grad
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    eval_metrics = trainer._metrics["eval"]
    assert len(eval_metrics["entropy"]) == len(eval_metrics["mean_token_accuracy"]) == 2


@pytest.mark.parametrize(
    "case",
    ["dft", "compute_loss_func", "label_smoother", "aux_loss", "padding_free", "images", "softcap"],
)
def test_what_the_override_does_not_cover_goes_to_trl(trainer: Any, case: str) -> None:
    from transformers.trainer_pt_utils import LabelSmoother

    batch = _batch()
    undo: list[tuple[Any, str, Any]] = []

    def put(target: Any, name: str, value: Any) -> None:
        undo.append((target, name, getattr(target, name, _MISSING)))
        setattr(target, name, value)

    if case == "dft":
        put(trainer.args, "loss_type", "dft")
    elif case == "compute_loss_func":
        put(trainer, "compute_loss_func", lambda *a, **k: None)
    elif case == "label_smoother":
        put(trainer, "label_smoother", LabelSmoother(epsilon=0.1))
    elif case == "aux_loss":
        put(trainer, "aux_loss_enabled", True)
    elif case == "padding_free":
        del batch["attention_mask"]
    elif case == "images":
        batch["pixel_values"] = torch.zeros(1)
    elif case == "softcap":
        put(trainer.model.config, "final_logit_softcapping", 30.0)
    try:
        assert trainer._plain_sft_parts(trainer.model, batch) is None
    finally:
        for target, name, value in reversed(undo):
            if value is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, value)
    assert trainer._plain_sft_parts(trainer.model, _batch()) is not None


def test_the_dft_loss_and_return_outputs_are_trls(trainer: Any) -> None:
    trainer.model.train()
    calls = _plain_calls(trainer)
    trainer.args.loss_type = "dft"
    try:
        ours = _run(trainer, trainer.compute_loss, _batch())[0]
        theirs = _run(trainer, _trl(trainer), _batch())[0]
    finally:
        trainer.args.loss_type = "nll"
    assert 2 not in calls
    torch.testing.assert_close(ours, theirs)
    with pytest.warns(FutureWarning, match="return_outputs"):
        _, outputs = trainer.compute_loss(trainer.model, _batch(), return_outputs=True)
    assert outputs.logits.shape == (len(ROWS), LENGTH, VOCAB) and 2 not in calls


def test_a_trl_whose_compute_loss_differs_is_refused(tmp_path: Path) -> None:
    class _Changed(module("trl").SFTTrainer):  # type: ignore[misc]
        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False) -> Any:
            return super().compute_loss(model, inputs, return_outputs=return_outputs)

    with pytest.raises(TypeError, match="re-read its source"):
        _build(_Changed, tmp_path)
