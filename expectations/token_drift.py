"""Re-encoding drift: how often a model's sampled token ids are not what its tokenizer
makes of the sampled text.

A figure in the gate's report, never a verdict: drift is normal (a byte-level model can
sample a split the tokenizer would merge), but it measures what a trainer that rebuilds
episodes from text would get wrong (the multi-turn RL bug of verl#3720, SkyRL#123), and
a jump in it says a policy records ids that do not belong to its text.

Per model (the trajectory's policy spec): of the steps that recorded completion ids, the
share whose ids, special tokens left out (the end-of-turn token the model sampled;
`raw_output` is decoded without them), differ from `encode(raw_output)`. Steps whose
`raw_output` the loop cut are not compared. Which tokenizer belongs to a model is the
caller's to say (`TokenizerResolver`); by default an `hf:<dir>` policy's directory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from agent.trajectory import Trajectory

__all__ = ["TokenDrift", "TokenizerResolver", "checkpoint_tokenizer", "token_drift"]

logger = logging.getLogger(__name__)

TokenizerResolver = Callable[[str], Any]
"""Policy spec → a transformers tokenizer for it, or None when there is none here."""


class TokenDrift(BaseModel):
    """One model's re-encoding drift over a batch."""

    model_config = ConfigDict(frozen=True)

    policy: str
    """The policy spec the steps came from."""
    steps_with_ids: int
    """Steps that recorded completion ids (cut answers left out)."""
    steps_differing: int | None
    """Of those, steps whose ids differ from the re-encoded text; None without a tokenizer."""

    @property
    def share(self) -> float | None:
        """`steps_differing / steps_with_ids`; None without a tokenizer or a step to compare."""
        if self.steps_differing is None or not self.steps_with_ids:
            return None
        return self.steps_differing / self.steps_with_ids


def checkpoint_tokenizer(policy: str) -> Any:
    """The tokenizer of an `hf:<dir>` policy whose directory is here; None otherwise (and
    when it does not load: one WARNING line)."""
    scheme, _, rest = policy.partition(":")
    if scheme != "hf" or not Path(rest).is_dir():
        return None
    try:
        # A QC worker installs `epiflow[collect]`, without transformers: the figure is n/a.
        import transformers

        return transformers.AutoTokenizer.from_pretrained(rest, local_files_only=True)
    except (ImportError, OSError, ValueError) as e:
        # A figure, not a check: without the tokenizer it reads n/a, the gate goes on.
        logger.warning("re-encoding drift of %s: cannot load its tokenizer: %s", policy, e)
        return None


def _differs(tokenizer: Any, text: str, ids: Sequence[int]) -> bool:
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    sampled = [i for i in ids if i not in special]
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) != sampled


def token_drift(
    trajectories: Sequence[Trajectory], *, tokenizer_for: TokenizerResolver = checkpoint_tokenizer
) -> list[TokenDrift]:
    """Re-encoding drift per policy that recorded completion ids, in policy order."""
    steps: dict[str, list[tuple[str, list[int]]]] = {}
    for t in trajectories:
        for s in t.steps:
            if s.completion_token_ids is not None and not s.raw_output_truncated:
                steps.setdefault(t.policy, []).append((s.raw_output, s.completion_token_ids))
    out: list[TokenDrift] = []
    for policy in sorted(steps):
        tokenizer = tokenizer_for(policy)
        rows = steps[policy]
        differing = (
            None if tokenizer is None else sum(_differs(tokenizer, text, ids) for text, ids in rows)
        )
        out.append(TokenDrift(policy=policy, steps_with_ids=len(rows), steps_differing=differing))
    return out
