"""Copy warm-up: synthetic copying before SFT, so a model built from scratch can copy.

The loop's tasks are mostly copying: a file name from the task into a call, the paths of
a layout into a shell command, the rows of a CSV observation into a JSON file. A small
transformer copies with induction heads (attend to an earlier occurrence of the current
token, predict what followed it) and with heads that track structure (the k-th row, the
next field); trained on the task data alone it got to neither within the loop's budget:
the loss sat on a plateau where the protocol was learned and the copied values were
guessed from the training distribution (docs/training.md, "What made the loop learn").

The warm-up trains the freshly initialised model on chats whose answer is the question's
content copied, in three generic shapes, drawn from the vocabulary of the protocol
corpus (the texts the tokenizer was trained on), never from a task instance:

- `copy`: a run of corpus text, repeated verbatim;
- `join`: a list of values, one per line with a random marker, joined on one line with
  another separator and quoting;
- `json` / `keys`: a delimited table (random column names, random delimiter) rewritten as
  records, JSON objects or `key: value` blocks; numbers become JSON numbers.

The first line of the question names the shape. Only the answer is in the loss. The
warm-up is part of building the base model: the warmed model is what gets registered,
evaluated as the base and fine-tuned.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.errors import BaseModelError
from training.settings import TrainingSettings

if TYPE_CHECKING:
    from training.callbacks import MetricsCallback
    from training.trainers import TrainResult

__all__ = ["CopyGenerator", "warm_up_copying"]

SHAPES = ("copy", "join", "json", "keys")
"""The warm-up's chat shapes (see the module docstring)."""


class CopyGenerator:
    """Seeded copy chats from a corpus: its text for `copy`, its words for the others."""

    def __init__(self, corpus: Sequence[str], tokenizer: Any, *, span_tokens: int, seed: int):
        encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in corpus]
        self._texts = [ids for ids in encoded if len(ids) >= 8]
        self._words: list[str] = sorted(
            {str(w) for t in corpus for w in re.findall(r"[A-Za-z][A-Za-z_]+", t)}
        )
        if not self._texts or len(self._words) < 8:
            raise BaseModelError("the copy warm-up needs a corpus with text to copy")
        self._tokenizer = tokenizer
        self._span = span_tokens
        self._rng = random.Random(seed)

    def chat(self) -> list[dict[str, str]]:
        """One chat of a random shape: `[user, assistant]`."""
        shape = self._rng.choice(SHAPES)
        source, answer = getattr(self, f"_{shape}")()
        return [
            {"role": "user", "content": f"{shape}\n{source}"},
            {"role": "assistant", "content": answer},
        ]

    def _value(self) -> str:
        roll = self._rng.random()
        if roll < 0.3:
            return str(self._rng.randint(0, 999))
        if roll < 0.6:
            return f"{self._rng.choice(self._words)} {self._rng.choice(self._words)}"
        return self._rng.choice(self._words)

    def _copy(self) -> tuple[str, str]:
        ids: list[int] = []
        while len(ids) < self._span:
            text = self._rng.choice(self._texts)
            start = self._rng.randrange(len(text) - 4)
            ids += text[start : start + self._rng.randint(4, 24)]
        span = str(self._tokenizer.decode(ids[: self._span]))
        return span, span

    def _join(self) -> tuple[str, str]:
        items = [self._value() for _ in range(self._rng.randint(3, 8))]
        before = self._rng.choice(["", "  ", "- ", "* "])
        after = self._rng.choice(["", "/", ";", ":"])
        source = "\n".join(f"{before}{item}{after}" for item in items) + "\n"
        separator = self._rng.choice([" ", ", ", " | ", "\n"])
        quote = self._rng.choice(["", '"', "'"])
        return source, separator.join(f"{quote}{item}{quote}" for item in items)

    def _table(self) -> tuple[list[str], list[list[str]], str]:
        columns = self._rng.sample(self._words, self._rng.randint(2, 4))
        rows = [[self._value() for _ in columns] for _ in range(self._rng.randint(2, 5))]
        delimiter = self._rng.choice([",", ";", "|", "\t"])
        lines = [delimiter.join(columns), *(delimiter.join(r) for r in rows)]
        return columns, rows, "\n".join(lines) + "\n"

    def _json(self) -> tuple[str, str]:
        columns, rows, source = self._table()
        records = [
            {c: int(v) if v.isdigit() else v for c, v in zip(columns, row, strict=True)}
            for row in rows
        ]
        return source, json.dumps(records, indent=self._rng.choice([1, 2, 4]))

    def _keys(self) -> tuple[str, str]:
        columns, rows, source = self._table()
        blocks = ["\n".join(f"{c}: {v}" for c, v in zip(columns, row, strict=True)) for row in rows]
        return source, "\n\n".join(blocks)


def warm_up_copying(
    model_dir: Path,
    corpus: Sequence[str],
    *,
    output_dir: Path,
    settings: TrainingSettings,
    on_metrics: MetricsCallback | None = None,
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

    if not settings.copy_warmup_s:
        raise BaseModelError("copy_warmup_s is not set: nothing to warm up")
    generator = CopyGenerator(
        corpus,
        load_tokenizer(model_dir),
        span_tokens=settings.copy_warmup_span,
        seed=settings.seed,
    )
    chats = [generator.chat() for _ in range(settings.copy_warmup_examples)]
    warm = settings.model_copy(
        update={
            "max_time_s": settings.copy_warmup_s,
            "max_steps": -1,
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
