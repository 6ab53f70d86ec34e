"""The SFT loss of TRL's `SFTTrainer` on CPU, without its fused LM head.

TRL 1.16's `SFTTrainer.__init__` patches the model with a fused, chunked log-probability
head (`trl.trainer.utils.add_fused_lm_head`, with entropy and top-1 outputs) and its
`compute_loss` scores every batch through it (`model(**inputs, fused_lm_head=True)`).
Without Triton (CPU) that head scores every position, padding and masked prompt
included, recomputes each logits tile in the backward, folds it with fp32 torch ops and
computes each position's entropy and top-1 for the metrics; the SFT step measured
0.67–0.80× of a plain loop (docs/training.md, "The SFT step on SmolLM2").

`PlainSFTLossMixin.compute_loss` does on CPU what a plain loop does: the backbone over the
batch, then the LM head over the positions whose next-token label is not -100 only, in
row chunks, and the cross-entropy normalised as TRL normalises it. TRL's logged metrics
(`entropy`, `mean_token_accuracy`, `num_tokens`) come from the same logits, without
gradient. Elsewhere, and where TRL does not score the loss through its fused head or
computes something this path does not (`compute_loss_func`, label smoothing, the DFT
loss, an MoE auxiliary loss, sequence or context parallelism, padding-free or
multimodal batches, `return_outputs`, PEFT, scaled or soft-capped logits), it calls
TRL's own `compute_loss`.

Private API: the override mirrors the body of TRL 1.16's `SFTTrainer.compute_loss` and
writes the trainer's private metric state (`_metrics`, `_total_train_tokens`, `_tp_size`;
it reads `aux_loss_enabled`). `__init__` raises TypeError when TRL's `compute_loss`
signature or that state differs; tests/training/test_cpu_sft_loss.py compares the loss,
gradients and metrics of both paths.
"""

from __future__ import annotations

import inspect
from typing import Any

from training.trainers.cpu_logps import FP32_BYTES, plain_parts

__all__ = ["PlainSFTLossMixin", "masked_token_losses"]

# What the override reads and writes on TRL's trainer besides the public `Trainer` API.
_TRL_STATE = ("_metrics", "_total_train_tokens", "_tp_size", "aux_loss_enabled")
_TRL_PARAMETERS = ("self", "model", "inputs", "return_outputs", "num_items_in_batch")
# The keys of a padded (not padding-free) text batch from TRL's SFT collator.
_BATCH_KEYS = frozenset({"input_ids", "attention_mask", "position_ids", "labels", "use_cache"})


def masked_token_losses(
    hidden: Any, lm_head: Any, targets: Any, *, budget_bytes: int
) -> tuple[Any, Any, Any]:
    """Negative log-likelihoods of `targets` `[N]` under `lm_head(hidden)` (`hidden`
    `[N, hidden size]`), with each row's entropy and whether its target is the first
    argmax (TRL's `is_top1`), both without gradient.

    The head runs over row chunks of at most `budget_bytes / (vocabulary × 4)` rows (at
    least one), on fp32 logits. Under autograd, when all rows' fp32 logits exceed
    `budget_bytes`, each chunk is checkpointed (`torch.utils.checkpoint`): its logits
    are recomputed in the backward (the entropy and argmax with them); below the budget
    they are kept for the backward, as a plain loop keeps them.
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    rows = hidden.size(0)
    row_bytes = lm_head.weight.size(0) * FP32_BYTES
    head_rows = max(1, budget_bytes // row_bytes)
    recompute = torch.is_grad_enabled() and rows * row_bytes > budget_bytes

    def head(chunk: Any, chunk_targets: Any) -> tuple[Any, Any, Any]:
        logits = lm_head(chunk).float()
        normaliser = torch.logsumexp(logits, dim=-1)
        losses = normaliser - logits.gather(-1, chunk_targets.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            probs = torch.exp(logits - normaliser.unsqueeze(-1))
            entropy = normaliser - (probs * logits).sum(-1)
            top1 = logits.argmax(-1) == chunk_targets
        return losses, entropy, top1

    parts = []
    # No row at all still runs the head once (on zero rows), so that a batch without
    # labels gives a loss connected to the model, as TRL's does.
    for first in range(0, rows, head_rows) or [0]:
        chunk, chunk_targets = hidden[first : first + head_rows], targets[first : first + head_rows]
        if recompute:
            parts.append(checkpoint(head, chunk, chunk_targets, use_reentrant=False))
        else:
            parts.append(head(chunk, chunk_targets))
    losses, entropies, top1 = (torch.cat(column) for column in zip(*parts, strict=True))
    return losses, entropies, top1


class PlainSFTLossMixin:
    """Put before `trl.SFTTrainer` in a trainer's bases: on CPU, the loss and metrics of
    `compute_loss` come from a plain forward (`masked_token_losses`) instead of TRL's
    fused head (TRL's `__init__` still installs that head; this path never calls it)."""

    logits_budget_bytes: int = 1 << 30
    """fp32 logits alive at once in the LM head (see `masked_token_losses`)."""

    # Set by `trl.SFTTrainer.__init__` / `transformers.Trainer.__init__`.
    accelerator: Any
    args: Any
    model: Any
    compute_loss_func: Any
    label_smoother: Any
    aux_loss_enabled: bool
    _metrics: Any
    _total_train_tokens: int
    _tp_size: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        parameters = tuple(inspect.signature(super().compute_loss).parameters)  # type: ignore[misc]
        missing = [name for name in _TRL_STATE if not hasattr(self, name)]
        if ("self", *parameters) != _TRL_PARAMETERS or missing:
            raise TypeError(
                "PlainSFTLossMixin mirrors TRL 1.16's SFTTrainer.compute_loss; this TRL has "
                f"compute_loss{('self', *parameters)} and lacks {missing}: re-read its source"
            )

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """TRL's `compute_loss`, same loss and metrics; on CPU without its fused head."""
        parts = None if return_outputs else self._plain_sft_parts(model, inputs)
        if parts is None:
            return super().compute_loss(  # type: ignore[misc]
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        import torch

        backbone, lm_head = parts
        mode = "train" if self.model.training else "eval"
        forward = {key: value for key, value in inputs.items() if key != "labels"}
        forward["use_cache"] = False
        with self.accelerator.autocast():
            states = backbone(**forward).last_hidden_state[:, :-1]
            # The state at t−1 scores the token at t.
            targets = inputs["labels"][:, 1:]
            mask = targets != -100
            losses, entropies, top1 = masked_token_losses(
                states[mask], lm_head, targets[mask], budget_bytes=self.logits_budget_bytes
            )
        count = mask.sum()
        # As TRL: the batch's label count unless the trainer passes the count of the whole
        # accumulated batch, clamped so that a batch without labels gives a zero loss.
        normaliser = count if num_items_in_batch is None else num_items_in_batch
        loss = losses.sum() / torch.as_tensor(normaliser).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())  # type: ignore[attr-defined]

        gather = self.accelerator.gather_for_metrics
        valid = gather(count).sum()
        entropy_sum = gather(entropies.sum()).sum()
        correct = gather(top1.sum()).sum()
        metrics = self._metrics[mode]
        metrics["entropy"].append((entropy_sum / valid).item() if valid > 0 else 0.0)
        metrics["mean_token_accuracy"].append((correct / valid).item() if valid > 0 else 0.0)
        if mode == "train":
            tokens = gather(inputs["attention_mask"].sum()).sum().item()
            self._total_train_tokens += tokens // self._tp_size
        metrics["num_tokens"] = [self._total_train_tokens]
        return loss

    def _plain_sft_parts(self, model: Any, inputs: dict[str, Any]) -> tuple[Any, Any] | None:
        """`plain_parts` of `model`, or None where TRL's own `compute_loss` must run: not on
        CPU, a loss TRL does not take from its fused head or that this path does not
        compute, parallelism, a batch that is not a padded text batch, an MoE model."""
        parallelism = getattr(self.accelerator, "parallelism_config", None)
        if (
            "input_ids" not in inputs
            or "attention_mask" not in inputs
            or not _BATCH_KEYS.issuperset(inputs)
            or inputs["input_ids"].device.type != "cpu"
            or self.compute_loss_func is not None
            or self.label_smoother is not None
            or self.args.loss_type != "nll"
            or self.aux_loss_enabled
            or parallelism is not None
        ):
            return None
        parts = plain_parts(model, self.accelerator)
        if parts is None:
            return None
        text_config = self.accelerator.unwrap_model(model).config.get_text_config()
        if getattr(text_config, "output_router_logits", False):
            return None
        return parts
