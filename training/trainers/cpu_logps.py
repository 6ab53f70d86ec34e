"""Completion log-probabilities for TRL's `GRPOTrainer` on CPU, without its fused LM head.

TRL 1.16 patches every GRPO policy with a fused, chunked log-probability head
(`trl.trainer.utils.add_fused_lm_head`) and always scores through it
(`fused_lm_head=True` in `GRPOTrainer._get_per_token_logps_and_entropies`). With Triton
it scores only the completion positions; without (CPU) it scores every position of the
batch, prompt and padding included, recomputes each logits tile in the backward and
folds it with fp32 torch ops, which measured 0.72× of a plain loop's speed on SmolLM2
(docs/training.md, "The GRPO update on SmolLM2").

`ChunkedLogpsMixin` overrides that method on CPU with what a plain loop does: the
backbone over the batch, then the LM head over the completion positions only
(`logits_to_keep`), at the sampling temperature, in row chunks. Elsewhere (CUDA, Triton)
and for what it does not cover (images, MoE auxiliary loss, `cast_lm_head_to_fp32`,
scaled or soft-capped logits) it calls TRL's own method.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ChunkedLogpsMixin",
    "PaddingSpan",
    "completion_logps_and_entropies",
    "padding_spans",
    "plain_parts",
]

# Config fields by which a model scales its logits inside its own forward; TRL's fused
# head reproduces them, this path does not (it calls TRL's method for such models).
_LOGIT_SCALING_FIELDS = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)

FP32_BYTES = 4

PADDING_SLACK = 0.1
"""Rows run through the backbone together while their padded area is at most 10 % more
than their tokens (`padding_spans`)."""


def completion_logps_and_entropies(
    backbone: Any,
    lm_head: Any,
    input_ids: Any,
    attention_mask: Any,
    logits_to_keep: int,
    *,
    temperature: float,
    compute_entropy: bool,
    entropy_grad: bool,
    budget_bytes: int,
    batch_size: int | None = None,
) -> tuple[Any, Any]:
    """Log-probabilities (and entropies) of the last `logits_to_keep` tokens of each row.

    Same values and layout as TRL's fused head: `[rows, logits_to_keep]`, the logits of
    position t−1 divided by `temperature` score token t, and positions whose
    `attention_mask` is 0 (completion padding) hold 0.

    Memory: the backbone runs over `batch_size` rows at a time (all by default); the LM
    head runs over row chunks of at most `budget_bytes / (logits_to_keep × vocabulary × 4)`
    rows (at least one), so the fp32 logits alive at once are one chunk's, about
    `budget_bytes` (one row's `[logits_to_keep × vocabulary]` if a row alone is larger),
    and the forward's peak is about 3× that (bf16 logits, fp32 logits, exp). Under
    autograd, when the whole batch's fp32 logits exceed `budget_bytes`, each chunk's head
    is checkpointed (`torch.utils.checkpoint`): only its `[rows, logits_to_keep, hidden]`
    states are kept and its logits are recomputed in the backward, chunk by chunk; below
    the budget the logits are kept for the backward, as a plain loop keeps them.

    Entropies are computed only when `compute_entropy`, and outside autograd unless
    `entropy_grad` (an entropy bonus trains on them); otherwise the second value is None.
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    rows = input_ids.size(0)
    vocabulary = lm_head.weight.size(0)
    row_bytes = logits_to_keep * vocabulary * FP32_BYTES
    head_rows = max(1, budget_bytes // row_bytes)
    recompute = torch.is_grad_enabled() and rows * row_bytes > budget_bytes
    step = batch_size or rows

    def head(hidden: Any, targets: Any) -> tuple[Any, Any]:
        logits = lm_head(hidden).float() / temperature
        normaliser = torch.logsumexp(logits, dim=-1)
        logps = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - normaliser
        entropy = None
        if compute_entropy:
            with nullcontext() if entropy_grad else torch.no_grad():
                probs = torch.exp(logits - normaliser.unsqueeze(-1))
                entropy = normaliser - (probs * logits).sum(-1)
        return logps, entropy

    width = input_ids.size(1)
    completion_start = width - logits_to_keep
    all_logps, all_entropies, order = [], [], []
    for start in range(0, rows, step):
        for span in padding_spans(attention_mask[start : start + step], completion_start):
            picked = torch.tensor([start + r for r in span.rows], dtype=torch.long)
            ids = input_ids.index_select(0, picked)[:, span.first : span.end]
            mask = attention_mask.index_select(0, picked)[:, span.first : span.end]
            kept = span.end - completion_start  # completion columns that hold a token
            states = backbone(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            # The state at t−1 scores the token at t: the completion's states end one early.
            states = states[:, -kept - 1 : -1]
            targets = ids[:, -kept:]
            for first in range(0, ids.size(0), head_rows):
                hidden, chunk_targets = (
                    states[first : first + head_rows],
                    targets[first : first + head_rows],
                )
                if recompute:
                    logps, entropy = checkpoint(head, hidden, chunk_targets, use_reentrant=False)
                else:
                    logps, entropy = head(hidden, chunk_targets)
                # Back to the batch's width: the trimmed padding columns hold 0.
                all_logps.append(torch.nn.functional.pad(logps, (0, logits_to_keep - kept)))
                if entropy is not None:
                    all_entropies.append(
                        torch.nn.functional.pad(entropy, (0, logits_to_keep - kept))
                    )
            order += [start + r for r in span.rows]
    back = torch.empty(rows, dtype=torch.long)
    back[torch.tensor(order, dtype=torch.long)] = torch.arange(rows)
    padding = attention_mask[:, -logits_to_keep:] == 0
    logps = torch.cat(all_logps).index_select(0, back).masked_fill(padding, 0.0)
    entropies = (
        torch.cat(all_entropies).index_select(0, back).masked_fill(padding, 0.0)
        if compute_entropy
        else None
    )
    return logps, entropies


@dataclass(frozen=True)
class PaddingSpan:
    """Rows of a padded batch that run through the backbone together, on the columns
    `[first, end)`: the padding columns none of them uses are not computed."""

    rows: tuple[int, ...]
    first: int
    """The first column any of the rows uses (left padding before it)."""
    end: int
    """One past the last column any of the rows uses (right padding from it)."""


def padding_spans(
    attention_mask: Any, completion_start: int, *, slack: float = PADDING_SLACK
) -> list[PaddingSpan]:
    """The rows of a left-padded prompt + right-padded completion batch, grouped by
    length so that each group's padded area is at most `1 + slack` times its tokens.

    Why: TRL pads a whole generation batch to its longest rollout (and shuffles it
    before cutting micro-batches), so a micro-batch of multi-turn episodes was about half
    padding (smollm2-rl: 46-50 % of the completion columns held a token). A token's
    log-probability does not depend on the columns trimmed: the right padding comes after
    it (causal attention), and dropping leading padding shifts every position of a row
    by the same amount, which rotary position embeddings do not see (they depend on
    position differences; the backbone is called without `position_ids`, as TRL calls it).
    Each span keeps at least one completion column (`end > completion_start`)."""
    import torch

    valid = attention_mask.bool()
    rows = attention_mask.size(0)
    width = attention_mask.size(1)
    columns = torch.arange(width)
    used = valid.any(dim=1)
    first_used = torch.where(valid, columns, width).min(dim=1).values
    last_used = torch.where(valid, columns + 1, 0).max(dim=1).values
    firsts: list[int] = torch.where(used, first_used, 0).tolist()
    ends = [max(int(e), completion_start + 1) for e in last_used.tolist()]
    by_length = sorted(range(rows), key=lambda r: ends[r] - firsts[r])
    spans: list[PaddingSpan] = []
    group: list[int] = []
    for r in by_length:
        candidate = [*group, r]
        first = min(firsts[i] for i in candidate)
        end = max(ends[i] for i in candidate)
        tokens = sum(ends[i] - firsts[i] for i in candidate)
        if group and len(candidate) * (end - first) > (1 + slack) * tokens:
            spans.append(_span(group, firsts, ends))
            candidate = [r]
        group = candidate
    if group:
        spans.append(_span(group, firsts, ends))
    return spans


def _span(rows: list[int], firsts: list[int], ends: list[int]) -> PaddingSpan:
    return PaddingSpan(
        rows=tuple(sorted(rows)),
        first=min(firsts[i] for i in rows),
        end=max(ends[i] for i in rows),
    )


class ChunkedLogpsMixin:
    """Put before `trl.GRPOTrainer` in a trainer's bases: on CPU, its per-token
    log-probabilities come from `completion_logps_and_entropies` instead of TRL's fused
    head (TRL's `__init__` still installs that head; this path never calls it)."""

    logits_budget_bytes: int = 1 << 30
    """fp32 logits alive at once in the LM head (see `completion_logps_and_entropies`)."""

    # Set by `trl.GRPOTrainer.__init__`.
    accelerator: Any
    args: Any
    temperature: float

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: Any,
        attention_mask: Any,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        pixel_values: Any = None,
        image_grid_thw: Any = None,
        num_images: Any = None,
        pixel_attention_mask: Any = None,
        spatial_shapes: Any = None,
        num_tiles: Any = None,
        image_sizes: Any = None,
        token_type_ids: Any = None,
        mm_token_type_ids: Any = None,
        image_position_ids: Any = None,
    ) -> tuple[Any, Any, Any]:
        """TRL's method, same signature and results (log-probabilities, entropies or
        None, auxiliary loss or None); on CPU without TRL's fused head."""
        extra = {
            "pixel_values": pixel_values,
            "image_grid_thw": image_grid_thw,
            "num_images": num_images,
            "pixel_attention_mask": pixel_attention_mask,
            "spatial_shapes": spatial_shapes,
            "num_tiles": num_tiles,
            "image_sizes": image_sizes,
            "token_type_ids": token_type_ids,
            "mm_token_type_ids": mm_token_type_ids,
            "image_position_ids": image_position_ids,
        }
        parts = self._plain_parts(model)
        if (
            parts is None
            or input_ids.device.type != "cpu"
            or compute_aux_loss
            or any(value is not None for value in extra.values())
        ):
            return super()._get_per_token_logps_and_entropies(  # type: ignore[misc, no-any-return]
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **extra,
            )
        backbone, lm_head = parts
        with self.accelerator.autocast():
            logps, entropies = completion_logps_and_entropies(
                backbone,
                lm_head,
                input_ids,
                attention_mask,
                logits_to_keep,
                temperature=self.temperature,
                compute_entropy=compute_entropy,
                entropy_grad=bool(getattr(self, "_entropy_bonus_enabled", True)),
                budget_bytes=self.logits_budget_bytes,
                batch_size=batch_size,
            )
        return logps, entropies, None

    def _plain_parts(self, model: Any) -> tuple[Any, Any] | None:
        """`plain_parts` of `model`, or None with an fp32-cast head."""
        if getattr(self.args, "cast_lm_head_to_fp32", False):
            return None
        return plain_parts(model, self.accelerator)


def plain_parts(model: Any, accelerator: Any) -> tuple[Any, Any] | None:
    """The backbone and LM head of `model` (unwrapped by `accelerator`), or None when a
    plain backbone-then-head forward would not compute what TRL's fused head computes:
    a PEFT or wrapped model, a model whose text config is not its config (vision-language
    models), or logits scaled or soft-capped in the model's forward."""
    unwrapped = accelerator.unwrap_model(model)
    config = getattr(unwrapped, "config", None)
    if config is None or hasattr(unwrapped, "peft_config"):
        return None
    text_config = config.get_text_config()
    if text_config is not config or any(
        getattr(text_config, name, None) is not None for name in _LOGIT_SCALING_FIELDS
    ):
        return None
    lm_head = unwrapped.get_output_embeddings()
    backbone = getattr(unwrapped, "base_model", None)
    if lm_head is None or backbone is None or backbone is unwrapped:
        return None
    return backbone, lm_head
