"""A generation replica: a copy of a model being trained, in the dtype it generates in,
its weights copied from the trainer's model at each policy version.

    replica = GenerationReplica("bfloat16")
    model = replica.sync(trainer_model)   # the trainer's current weights, in bf16
    policy = HFPolicy.from_loaded(model, tokenizer, …)

The trainer keeps fp32 master weights and, under bf16 autocast, casts each weight to
bf16 at every matmul. Generation from those weights either runs its matmuls in fp32 or,
under autocast, casts all 135 M weights again at every decoded token. On a 2-core Xeon
with AMX (SmolLM2-135M, 1,000-token prompts, load ~2): prefill of 8 rows 10.1 s in fp32,
4.5 s under autocast, **2.8 s** from a bf16 copy; decoding 52.6, 49.6 and **77.9**
tokens/s. So the rollouts of a bf16 run sample from a bf16 copy, like a vLLM server
with its weights synced from the trainer after each optimiser step (TRL's vLLM mode):
one copy built on the first sync (the model class of the trainer's config, no
download), then `load_state_dict` into it (a dtype-converting copy, ~0.2 s for SmolLM2)
whenever the trainer's model has taken a step.

What differs from generating with the trainer's model: the sampled tokens' logprobs are
the replica's (bf16 weights, bf16 norms and softmax), while the trainer scores them under
autocast (the same bf16 weights, fp32 norms and softmax). TRL's GRPO loss on CPU does not
use the sampler's logprobs (its importance-sampling correction is for vLLM mode); they
are stored with each step, as a vLLM server's would be.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from agent.errors import PolicyLoadError

__all__ = ["GenerationDtype", "GenerationReplica"]

GenerationDtype = Literal["float32", "bfloat16"]
"""A dtype the replica holds its weights in."""


class GenerationReplica:
    """One copy of the trainer's model in `dtype`, synced on demand (see the module)."""

    def __init__(self, dtype: GenerationDtype) -> None:
        self.dtype: GenerationDtype = dtype
        self._model: Any = None
        self._source: int | None = None
        self._version: int | None = None
        self.syncs = 0
        """Weight copies made so far (a test and a trainer can count them)."""

    def sync(self, model: Any, *, version: int | None = None) -> Any:
        """The replica holding `model`'s current weights, in eval mode without gradients.

        `version` (the policy version: optimiser steps taken) skips the copy when the
        replica already holds that version of the same model; None always copies.

        Raises:
            PolicyLoadError: the replica cannot be built from the model's config or its
                weights do not match (a model this replica was not built for).
        """
        import torch

        if self._model is None or self._source != id(model):
            self._model = self._build(model)
            self._source, self._version = id(model), None
        if version is None or version != self._version:
            try:
                with torch.no_grad():
                    self._model.load_state_dict(model.state_dict(), strict=True)
            except (RuntimeError, KeyError) as e:
                raise PolicyLoadError(
                    f"cannot copy the trainer's weights into its {self.dtype} replica: {e}"
                ) from e
            self._version = version
            self.syncs += 1
        return self._model

    def _build(self, model: Any) -> Any:
        import torch
        import transformers

        auto: Any = transformers.AutoModelForCausalLM  # untyped `from_config`
        dtype = getattr(torch, self.dtype)
        try:
            replica = auto.from_config(copy.deepcopy(model.config), dtype=dtype)
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            raise PolicyLoadError(
                f"cannot build a {self.dtype} generation replica of {type(model).__name__}: {e}"
            ) from e
        generation_config = getattr(model, "generation_config", None)
        if generation_config is not None:
            replica.generation_config = copy.deepcopy(generation_config)
        device = getattr(model, "device", None)
        if device is not None:
            replica.to(device)
        replica.eval()
        replica.requires_grad_(False)
        return replica

    def release(self) -> None:
        """Drop the copy (the next `sync` builds it again)."""
        self._model = self._source = self._version = None
