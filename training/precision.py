"""Numeric precision of training and evaluation: one rule for autocast, one for the eval dtype.

Training keeps fp32 master weights; `bf16` adds bf16 autocast around the forward pass
(TRL's `bf16=True`: linear layers, attention and the logits run in bf16, the optimiser
step in fp32). The saved weights are therefore fp32 whatever the training precision, and
evaluation loads the dtype the checkpoint's `config.json` names (`from_pretrained`'s
default `dtype="auto"` in transformers 5, for the `hf:` policy and `transformers serve`
alike): float32.

Which precision learns depends on the model, not only on the CPU (issue 46): the tiny
`loop` model (1.17 M parameters) reached 0.50 held-out completion in fp32 and 0.20-0.25
under bf16 autocast, with a lower training loss, so the small-model recipes train in fp32
on every CPU; SmolLM2 learned as well under bf16 autocast (0.583) as in fp32 (0.542) at
about six times the speed, so its recipe keeps `auto`. docs/training.md ("Precision").

`TrainingSettings.precision` (`EPIFLOW_TRAINING_PRECISION`) forces either; `auto` turns
autocast on where the hardware runs bf16 natively (CUDA with bf16, CPUs with
AVX512-BF16 or AMX) and off elsewhere, where emulated bf16 is slower than fp32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from training.settings import TrainingSettings

__all__ = [
    "EvalDtype",
    "Precision",
    "bf16_native",
    "checkpoint_dtype",
    "precision_report",
    "rollout_dtype",
    "use_bf16",
]

Precision = Literal["auto", "fp32", "bf16"]
"""Training precision: `fp32`; `bf16` (bf16 autocast over fp32 master weights); `auto`
(bf16 where the hardware runs it natively, fp32 elsewhere)."""

EvalDtype = Literal["float32", "bfloat16"]
"""The dtype a checkpoint is evaluated in (the one its `config.json` names)."""


def bf16_native() -> bool:
    """Whether this machine runs bf16 matmuls natively: CUDA with bf16, or a CPU whose
    oneDNN has bf16 kernels (AVX512-BF16 or AMX)."""
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def use_bf16(settings: TrainingSettings) -> bool:
    """Whether training runs under bf16 autocast: `settings.bf16` when set (the older
    spelling, kept), else `settings.precision`, `auto` meaning `bf16_native()`."""
    if settings.bf16 is not None:
        return settings.bf16
    if settings.precision == "auto":
        return bf16_native()
    return settings.precision == "bf16"


def rollout_dtype(settings: TrainingSettings) -> EvalDtype | None:
    """The dtype of the copy GRPO's in-process rollouts sample from
    (`TrainingSettings.rollout_dtype`), None for the trainer's model itself: `auto` is a
    bf16 copy when training runs under bf16 autocast (`use_bf16`), else None."""
    if settings.rollout_dtype == "auto":
        return "bfloat16" if use_bf16(settings) else None
    return settings.rollout_dtype


def checkpoint_dtype(model_dir: Path) -> str:
    """The dtype a checkpoint directory loads in with `dtype="auto"` (the `hf:` policy's
    and `transformers serve`'s default): `config.json`'s `dtype` (`torch_dtype` before
    transformers 5), float32 when it names none."""
    try:
        config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    value = config.get("dtype") or config.get("torch_dtype") or "float32"
    return str(value)


def precision_report(
    settings: TrainingSettings, *, bf16: bool, eval_model_dir: Path | None
) -> dict[str, Any]:
    """What a benchmark's JSON says about precision: the setting asked for (`precision`),
    whether autocast was on (`bf16`; `autocast` names its dtype, None when off), whether
    the hardware runs bf16 natively, and the dtype the evaluated checkpoint loads in."""
    return {
        "precision": settings.precision if settings.bf16 is None else f"bf16={settings.bf16}",
        "bf16": bf16,
        "autocast": "bfloat16" if bf16 else None,
        "bf16_native": bf16_native(),
        "eval_dtype": checkpoint_dtype(eval_model_dir) if eval_model_dir is not None else None,
    }
