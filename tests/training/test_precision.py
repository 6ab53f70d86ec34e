"""Precision (issue 46): each recipe declares it, the environment forces it, and the tiny
model trained under bf16 autocast gives the greedy answers the fp32 one gives.

The training test copies (the loop's copy warm-up task, `training.pretrain`): the same
base, the same 2,400 chats, 300 steps in fp32 (the `loop` recipe's default) and under
bf16 autocast (native on a CPU with AVX512-BF16/AMX, emulated by torch elsewhere: slower,
same rounding), then 32 held-out copy prompts answered greedily. What was measured on
an AMD EPYC with AVX512-BF16 (native bf16, torch 2.13): fp32 copied 20/32 exactly, bf16
19/32, and a second fp32 run that differed only in data order 18/32; fp32 and bf16 gave
the same answer on 18 of 32 prompts, exactly as often as the two fp32 runs did. So a run
of the tiny model is chaotic at this scale, and bf16 moves it no further than a data
order does: the tolerance below is that of two fp32 runs. Evaluating one checkpoint in
bf16 autocast instead of fp32 changed 0-2 of 32 answers (the evaluation's dtype is not
what moved issue 46's rates), and both checkpoints are saved, and evaluated, in float32.
The 1,400-step `loop` run is where bf16 learned less (0.20-0.25 against 0.50); it is
too long for a test, so the recipes keep fp32 for the small models and this test checks
they do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from suites.builtin import builtin_suite
from training.base_model import build_base_model, protocol_corpus
from training.errors import TrainerError
from training.precision import bf16_native, checkpoint_dtype, precision_report, use_bf16
from training.pretrain import CopyGenerator
from training.recipes import RECIPES
from training.settings import TrainingSettings
from training.trainers import TrainResult, run_training
from training.trainers.common import load_model, load_tokenizer

STEPS = 300
SPAN = 12
PROMPTS = 32
SAME_ANSWERS_MIN = 12
"""fp32 and bf16 give the same greedy answer on at least this many of the 32 prompts
(measured: 18, as two fp32 runs in different data orders)."""
COPY_GAP_MAX = 4
"""Exact copies of the two precisions differ by at most this many of 32 (measured: 1;
two fp32 runs in different data orders: 2)."""

_SHAPE: dict[str, Any] = {
    "vocab_size": 800,
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 4,
    "max_length": 256,
    "max_position_embeddings": 512,
    "max_steps": STEPS,
    "logging_steps": 50,
    "torch_threads": 1,
}
"""A smaller model than the recipe's, one thread (the same sums in the same order on every
run); everything else (optimiser, schedule, batch, prompt, tokenizer) is the recipe's."""


@pytest.fixture(autouse=True)
def _no_precision_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EPIFLOW_TRAINING_PRECISION", raising=False)
    monkeypatch.delenv("EPIFLOW_TRAINING_BF16", raising=False)


def test_small_model_recipes_train_in_fp32_and_smollm2_where_bf16_is_native() -> None:
    for name in ("loop", "demo"):
        settings = RECIPES[name].training_settings(TrainingSettings())
        assert settings.precision == "fp32" and not use_bf16(settings)
        assert RECIPES[name].eval_dtype == "float32"
    smollm2 = RECIPES["smollm2"].training_settings(TrainingSettings())
    assert smollm2.precision == "auto" and use_bf16(smollm2) == bf16_native()


def test_the_environment_forces_a_precision_over_the_recipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPIFLOW_TRAINING_PRECISION", "bf16")
    forced = RECIPES["loop"].training_settings(TrainingSettings())
    assert forced.precision == "bf16" and use_bf16(forced)
    monkeypatch.setenv("EPIFLOW_TRAINING_PRECISION", "fp32")
    assert not use_bf16(RECIPES["smollm2"].training_settings(TrainingSettings()))
    # The older spelling still decides, and keeps the recipe's precision out.
    monkeypatch.delenv("EPIFLOW_TRAINING_PRECISION")
    monkeypatch.setenv("EPIFLOW_TRAINING_BF16", "true")
    assert use_bf16(RECIPES["loop"].training_settings(TrainingSettings()))


def test_bf16_and_precision_must_agree() -> None:
    with pytest.raises(ValueError, match="contradicts precision='fp32'"):
        TrainingSettings(bf16=True, precision="fp32")
    with pytest.raises(TrainerError, match="invalid settings"):
        RECIPES["loop"].model_copy(update={"settings": {"precision": "fp16"}}).training_settings(
            TrainingSettings()
        )


def _greedy_answers(model_dir: Path, chats: list[list[dict[str, str]]], *, bf16: bool) -> list[str]:
    import torch

    model, tokenizer = load_model(model_dir).eval(), load_tokenizer(model_dir)
    tokenizer.padding_side = "left"
    texts = [
        tokenizer.apply_chat_template(chat[:1], add_generation_prompt=True, tokenize=False)
        for chat in chats
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model.generate(
            **batch,
            max_new_tokens=SPAN + 4,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    prompt_width = batch["input_ids"].shape[1]
    return [
        tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in out[:, prompt_width:]
    ]


@pytest.mark.slow
def test_fp32_and_bf16_autocast_give_the_same_greedy_answers(tmp_path: Path) -> None:
    settings = RECIPES["loop"].training_settings(TrainingSettings(**_SHAPE))
    tasks = builtin_suite().instances(4, templates=RECIPES["loop"].templates)
    corpus = protocol_corpus(tasks, prompt_style=settings.prompt_style)
    base = build_base_model(tmp_path / "base", corpus, settings=settings)
    tokenizer = load_tokenizer(base)
    train = CopyGenerator(corpus, tokenizer, span_tokens=SPAN, seed=1)
    chats = [train.chat() for _ in range(STEPS * settings.batch_size)]
    heldout = CopyGenerator(corpus, tokenizer, span_tokens=SPAN, seed=99)
    prompts = [heldout.chat() for _ in range(PROMPTS)]
    frame = pl.DataFrame({"messages": chats, "weight": [1.0] * len(chats)})

    def trained(name: str, run_settings: TrainingSettings) -> TrainResult:
        return run_training(
            "sft",
            dataset=frame,
            base_model_dir=base,
            output_dir=tmp_path / name,
            settings=run_settings,
        )

    fp32 = trained("fp32", settings)  # the recipe's default
    bf16 = trained("bf16", settings.model_copy(update={"precision": "bf16"}))
    assert not fp32.bf16 and bf16.bf16
    # fp32 master weights: both are saved, and so evaluated, in float32.
    for result in (fp32, bf16):
        assert checkpoint_dtype(result.output_dir) == "float32"
        report = precision_report(settings, bf16=result.bf16, eval_model_dir=result.output_dir)
        assert report["eval_dtype"] == "float32" and report["bf16"] == result.bf16

    expected = [chat[1]["content"].strip() for chat in prompts]
    answers = {
        (name, autocast): _greedy_answers(tmp_path / name, prompts, bf16=autocast)
        for name in ("fp32", "bf16")
        for autocast in (False, True)
    }
    copies = {
        name: sum(a == e for a, e in zip(answers[(name, False)], expected, strict=True))
        for name in ("fp32", "bf16")
    }
    same = sum(
        a == b for a, b in zip(answers[("fp32", False)], answers[("bf16", False)], strict=True)
    )
    # Both learned to copy (the untrained model copies none), and equally well.
    assert min(copies.values()) >= PROMPTS // 4, copies
    assert abs(copies["fp32"] - copies["bf16"]) <= COPY_GAP_MAX, copies
    assert same >= SAME_ANSWERS_MIN, (same, copies)
    # The evaluation's dtype barely matters: one checkpoint, fp32 against bf16 autocast.
    for name in ("fp32", "bf16"):
        moved = sum(
            a != b for a, b in zip(answers[(name, False)], answers[(name, True)], strict=True)
        )
        assert moved <= PROMPTS // 8, (name, moved)


def test_rollouts_sample_from_a_bf16_copy_when_training_runs_under_bf16() -> None:
    """`rollout_dtype`: `auto` is a bf16 copy exactly when training autocasts to bf16,
    else the trainer's model itself (None); a dtype given wins."""
    from training.precision import rollout_dtype

    assert rollout_dtype(TrainingSettings(precision="bf16")) == "bfloat16"
    assert rollout_dtype(TrainingSettings(precision="fp32")) is None
    assert rollout_dtype(TrainingSettings(precision="auto")) == (
        "bfloat16" if bf16_native() else None
    )
    assert rollout_dtype(TrainingSettings(precision="fp32", rollout_dtype="bfloat16")) == (
        "bfloat16"
    )
    assert rollout_dtype(TrainingSettings(precision="bf16", rollout_dtype="float32")) == ("float32")
    with pytest.raises(ValueError, match="rollout_dtype"):
        TrainingSettings(rollout_dtype="float16")
