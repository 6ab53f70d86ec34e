"""Continuous decoding for the `hf:` policy: rows join and leave a running batch at any step.

A multi-turn rollout alternates a turn of generation with a tool call, so the episodes
that share a model fall out of step. One `model.generate` over whoever waits runs until
its longest row ends: a row that finished early idles until then, and a turn that arrives
meanwhile waits for the whole call (issue 42's rollouts: 6.9 rows a call of 16, 47 % of
the row-steps used, a turn waiting 29.5 s on average). Here a row leaves the batch the
step it ends, and waiting prompts join at the next step:

- **join** (`DecodeBatch.admit`): the new prompts are prefilled together (left-padded,
  logits of the last position only), their first token is sampled, and their KV cache is
  merged into the running one: both are left-padded with zeros to the longer length and
  stacked on the batch axis; the attention mask keeps the padding out;
- **step** (`DecodeBatch.step`): one forward of every live row's last token, each at its
  own position (`position_ids` count the row's real tokens, not the padded columns);
- **leave** (`DecodeBatch.finished`): rows that sampled the end-of-sequence token or used
  their budget are cut out of the cache and mask; columns that are padding in every row
  left are dropped.

What a row gets does not depend on who shares its batch, beyond floating-point noise: its
positions, its mask and its sampling are its own. Each row samples from its own generator
when seeded (`Row.generator`), by inverse CDF over the scores divided by the temperature,
after top-p; its logprob is taken before top-p (what TRL recomputes). Greedy rows take the
argmax.

A multi-turn episode's next prompt is its last prompt and answer plus a tail (the
observation turn: `hf_tokens`), so with `keep_kv` a row that ends keeps its KV cache
(`Row.kv`: its prompt and every answer token but the last, which was never fed), and the
policy hands it back with the episode's next turn (`Row.prefix`): only the tail is
prefilled, from the end of the prefix.

Only caches made of plain `DynamicLayer`s (full attention: Llama, Qwen2, SmolLM2) can be
merged; for any other (`can_join` false) rows join only an empty batch, which is a batch
per admission as `generate` ran it, and no row keeps its cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DecodeBatch", "Row", "Sampling"]


@dataclass(frozen=True)
class Sampling:
    """How every row picks its next token."""

    do_sample: bool = False
    temperature: float = 1.0
    """Scores are divided by it before sampling and before the logprob (1 when greedy)."""
    top_p: float = 1.0


@dataclass
class Row:
    """One request decoding in the batch."""

    key: Any
    """The caller's handle (the policy's job)."""
    prompt: list[int]
    budget: int
    """New tokens at most."""
    generator: Any = None
    """A seeded `torch.Generator` for this row's draws; None: the process's generator."""
    prefix: Any = None
    """The KV cache of the prompt's first `prefix_len` tokens, per layer (keys, values) of
    batch 1, kept from an earlier turn (`DecodeBatch.keep_kv`); None: prefill it all."""
    prefix_len: int = 0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False
    dropped: bool = False
    """Leaves unanswered (its caller stopped waiting): done, and its cache is not kept."""
    kv: Any = None
    """Set when the row ends in a batch that keeps them: the KV cache of its prompt and
    tokens but the last (which was never fed), per layer (keys, values) of batch 1."""


class DecodeBatch:
    """Rows decoding together over one KV cache; they join and leave between steps.

    Not thread-safe: one thread drives it (the policy's worker). Every method runs its
    torch work under `torch.inference_mode()`.
    """

    def __init__(
        self, model: Any, *, eos: int | None, pad: int, sampling: Sampling, keep_kv: bool = False
    ) -> None:
        self.model = model
        self.keep_kv = keep_kv
        """Give each row that ends its KV cache (`Row.kv`), for its episode's next turn."""
        self.eos = eos
        self.pad = pad
        self.sampling = sampling
        self.rows: list[Row] = []
        self._cache: Any = None
        self._mask: Any = None  # (rows, columns) long: 1 where the cache holds a real token
        self.steps = 0
        """Decode forwards run (joins' prefills not counted)."""
        self.row_steps = 0
        """Sum over decode forwards of the rows in them."""
        self.prefills = 0
        """Joins: prefill forwards run."""

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def can_join(self) -> bool:
        """Whether new rows can join while others decode (a mergeable cache, or none)."""
        if self._cache is None:
            return True
        from transformers.cache_utils import DynamicLayer

        return all(type(layer) is DynamicLayer for layer in self._cache.layers)

    def admit(self, rows: list[Row]) -> list[Row]:
        """Prefill `rows`, sample each one's first token and merge them into the batch;
        returns those already finished (their first token ended them). Rows without a
        cached prefix are prefilled together; a row with one (`Row.prefix`), alone, from
        the end of its prefix."""
        import torch

        fresh = [r for r in rows if r.prefix is None]
        with torch.inference_mode():
            if fresh:
                self._prefill(fresh)
            for row in rows:
                if row.prefix is not None:
                    self._prefill_after(row)
        return self.finished()

    def _prefill(self, rows: list[Row]) -> None:
        import torch

        device = self.model.device
        width = max(len(r.prompt) for r in rows)
        ids = torch.tensor(
            [[self.pad] * (width - len(r.prompt)) + r.prompt for r in rows],
            dtype=torch.long,
            device=device,
        )
        mask = torch.tensor(
            [[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in rows],
            dtype=torch.long,
            device=device,
        )
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        self._joined(rows, out, mask)

    def _prefill_after(self, row: Row) -> None:
        """Prefill the part of `row`'s prompt after its cached prefix."""
        import torch
        from transformers.cache_utils import DynamicCache

        device = self.model.device
        start, total = row.prefix_len, len(row.prompt)
        out = self.model(
            input_ids=torch.tensor([row.prompt[start:]], dtype=torch.long, device=device),
            attention_mask=torch.ones((1, total), dtype=torch.long, device=device),
            position_ids=torch.arange(start, total, device=device)[None, :],
            cache=DynamicCache(ddp_cache_data=row.prefix),
            use_cache=True,
            logits_to_keep=1,
        )
        row.prefix = None  # merged: the batch's cache holds it now
        self._joined([row], out, torch.ones((1, total), dtype=torch.long, device=device))

    def _joined(self, rows: list[Row], out: Any, mask: Any) -> None:
        self.prefills += 1
        self._merge(out.cache, mask)
        self.rows.extend(rows)
        self._pick(rows, out.logits[:, -1, :])

    def step(self) -> list[Row]:
        """One forward of every live row's last token; returns the rows that ended."""
        import torch

        if not self.rows:
            return []
        device = self.model.device
        with torch.inference_mode():
            last = torch.tensor(
                [[r.tokens[-1]] for r in self.rows], dtype=torch.long, device=device
            )
            positions = self._mask.sum(-1, keepdim=True)
            self._mask = torch.cat(
                [self._mask, torch.ones((len(self.rows), 1), dtype=torch.long, device=device)], -1
            )
            out = self.model(
                input_ids=last,
                attention_mask=self._mask,
                position_ids=positions,
                cache=self._cache,
                use_cache=True,
            )
            self._cache = out.cache
            self.steps += 1
            self.row_steps += len(self.rows)
            self._pick(self.rows, out.logits[:, -1, :])
        return self.finished()

    def finished(self) -> list[Row]:
        """Cut the rows that ended out of the batch and return them."""
        import torch

        ended = [r for r in self.rows if r.done]
        if not ended:
            return []
        keep = [i for i, r in enumerate(self.rows) if not r.done]
        with torch.inference_mode():
            if self.keep_kv and self.can_join:
                for i, row in enumerate(self.rows):
                    if row.done and not row.dropped:
                        start = self._mask.shape[1] - int(self._mask[i].sum().item())
                        row.kv = [
                            (
                                layer.keys[i : i + 1, :, start:].clone(),
                                layer.values[i : i + 1, :, start:].clone(),
                            )
                            for layer in self._cache.layers
                        ]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self._cache = self._mask = None
            return ended
        with torch.inference_mode():
            index = torch.tensor(keep, dtype=torch.long, device=self._mask.device)
            self._mask = self._mask.index_select(0, index)
            # Columns that are padding in every row left: the longest rows have gone.
            start = int((self._mask.sum(0) > 0).nonzero()[0].item())
            self._mask = self._mask[:, start:]
            for layer in self._cache.layers:
                layer.keys = layer.keys.index_select(0, index)[:, :, start:]
                layer.values = layer.values.index_select(0, index)[:, :, start:]
        return ended

    def _merge(self, cache: Any, mask: Any) -> None:
        """Stack a prefilled cache (and its mask) under the running one, both left-padded
        to the longer of the two."""
        import torch

        if self._cache is None:
            self._cache, self._mask = cache, mask
            return
        if not self.can_join:
            raise ValueError("this model's cache cannot take rows while others decode")
        have, new = self._mask.shape[1], mask.shape[1]
        width = max(have, new)

        def pad(t: Any, columns: int) -> Any:
            if columns == 0:
                return t
            shape = list(t.shape)
            shape[-2 if t.dim() == 4 else -1] = columns
            zeros = torch.zeros(shape, dtype=t.dtype, device=t.device)
            return torch.cat([zeros, t], dim=-2 if t.dim() == 4 else -1)

        self._mask = torch.cat([pad(self._mask, width - have), pad(mask, width - new)], 0)
        for old, add in zip(self._cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([pad(old.keys, width - have), pad(add.keys, width - new)], 0)
            old.values = torch.cat([pad(old.values, width - have), pad(add.values, width - new)], 0)

    def _pick(self, rows: list[Row], logits: Any) -> None:
        """Each row's next token from its logits (rows × vocabulary), and its logprob."""
        import torch

        options = self.sampling
        temperature = options.temperature if options.do_sample else 1.0
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
        chosen = self._sample(rows, logprobs) if options.do_sample else logprobs.argmax(-1)
        picked = logprobs.gather(1, chosen[:, None])[:, 0].tolist()
        for row, token, logprob in zip(rows, chosen.tolist(), picked, strict=True):
            row.tokens.append(int(token))
            row.logprobs.append(float(logprob))
            row.done = len(row.tokens) >= row.budget or (self.eos is not None and token == self.eos)

    def _sample(self, rows: list[Row], logprobs: Any) -> Any:
        """Inverse-CDF draws, one uniform per row from the row's own generator."""
        import torch

        probs = logprobs.exp()
        order = None
        if self.sampling.top_p < 1.0:
            probs, order = probs.sort(dim=-1, descending=True)
            before = probs.cumsum(-1) - probs  # mass of the tokens ranked above
            probs = probs.masked_fill(before >= self.sampling.top_p, 0.0)
        cdf = probs.cumsum(-1)
        draws = torch.stack(
            [torch.rand((), generator=r.generator, device=probs.device) for r in rows]
        ).to(cdf.dtype)
        # The first entry whose cumulative mass exceeds the draw: a token of zero probability
        # (cut by top-p) adds no mass, so it is never the first to exceed it.
        index = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None], right=True)
        index = index.clamp(max=cdf.shape[-1] - 1)
        chosen = index[:, 0]
        if order is not None:
            chosen = order.gather(1, index)[:, 0]
        return chosen
