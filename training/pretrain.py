"""Copy warm-up: synthetic copying before SFT, so a model built from scratch can copy.

The loop's tasks are mostly copying: a file name from the task into a call, the paths of
a layout into a shell command, the rows of a CSV observation into a JSON file. A small
transformer copies with induction heads (attend to an earlier occurrence of the current
token, predict what followed it) and with heads that track structure (the k-th row, the
next field); trained on the task data alone it got to neither within the loop's budget:
the loss sat on a plateau where the protocol was learned and the copied values were
guessed from the training distribution (docs/training.md, "What made the loop learn").

The warm-up trains the freshly initialised model on chats whose answer repeats the
question verbatim: the user turn is a run of protocol text (random pieces of the corpus
the tokenizer was trained on: task prompts, calls, observations; never a whole task
instance), the assistant turn the same text. Only the answer is in the loss. Plain
copying is learned within a few hundred steps and is what transfers: with it, the SFT
that follows copies file names and paths from the task; without it, it did not within
the budget. Richer shapes (lists rejoined with other separators, tables rewritten as
JSON records) were tried and learned more slowly than the tasks themselves
(docs/training.md). The warm-up is part of building the base model: the warmed model is
what gets registered, evaluated as the base and fine-tuned.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.errors import BaseModelError
from training.settings import TrainingSettings

if TYPE_CHECKING:
    from training.callbacks import MetricsHook
    from training.trainers import TrainResult

__all__ = ["CopyGenerator", "warm_up_copying"]


class CopyGenerator:
    """Seeded copy chats cut from a corpus."""

    def __init__(self, corpus: Sequence[str], tokenizer: Any, *, span_tokens: int, seed: int):
        encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in corpus]
        self._texts = [ids for ids in encoded if len(ids) >= 8]
        if not self._texts:
            raise BaseModelError("the copy warm-up needs corpus texts of at least 8 tokens")
        self._tokenizer = tokenizer
        self._span = span_tokens
        self._rng = random.Random(seed)

    def chat(self) -> list[dict[str, str]]:
        """One chat: `[user, assistant]`, the assistant repeating `span_tokens` tokens made of
        random pieces (4 to 24 tokens each) of the corpus."""
        ids: list[int] = []
        while len(ids) < self._span:
            text = self._rng.choice(self._texts)
            start = self._rng.randrange(len(text) - 4)
            ids += text[start : start + self._rng.randint(4, 24)]
        span = str(self._tokenizer.decode(ids[: self._span]))
        return [{"role": "user", "content": span}, {"role": "assistant", "content": span}]


def warm_up_copying(
    model_dir: Path,
    corpus: Sequence[str],
    *,
    output_dir: Path,
    settings: TrainingSettings,
    on_metrics: MetricsHook | None = None,
) -> TrainResult:
    """Train `model_dir` on copy chats for `settings.copy_warmup_s` seconds; save to `output_dir`.

    The SFT trainer (assistant-only loss) with `copy_warmup_batch_size` chats per step,
    `copy_warmup_examples` distinct chats, the SFT learning rate and schedule over the
    warm-up's own time budget.

    Raises:
        BaseModelError: no warm-up time set, or an unusable corpus.
        TrainerError: training failed.
    """
    import polars as pl

    from training.trainers import run_training
    from training.trainers.common import load_tokenizer

    if not settings.copy_warmup_s and not settings.copy_warmup_steps:
        raise BaseModelError("neither copy_warmup_s nor copy_warmup_steps is set: no warm-up")
    generator = CopyGenerator(
        corpus,
        load_tokenizer(model_dir),
        span_tokens=settings.copy_warmup_span,
        seed=settings.seed,
    )
    chats = [generator.chat() for _ in range(settings.copy_warmup_examples)]
    warm = settings.model_copy(
        update={
            # A step count, when given, wins over the time budget.
            "max_time_s": None if settings.copy_warmup_steps else settings.copy_warmup_s,
            "max_steps": settings.copy_warmup_steps or -1,
            "batch_size": settings.copy_warmup_batch_size,
            "save_steps": None,
            "save_every_s": None,
        }
    )
    frame = pl.DataFrame({"messages": chats, "weight": [1.0] * len(chats)})
    return run_training(
        "sft",
        dataset=frame,
        base_model_dir=model_dir,
        output_dir=output_dir,
        settings=warm,
        on_metrics=on_metrics,
    )
