"""`bench/train.py`'s GRPO update: TRL's `GRPOTrainer` (set up as the episode GRPO sets it
up) and the bare torch loop compute the same objective on the same fixed rollouts, on the
tiny local model. Nothing here is timed: the losses and gradient norms are compared."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from suites.builtin import builtin_suite
from training.base_model import build_base_model, protocol_corpus
from training.errors import TrainerError
from training.recipes import get_recipe
from training.settings import TrainingSettings
from training.trainers.common import load_tokenizer

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench(name: str) -> ModuleType:
    # bench/ is scripts, not a package: loaded by path (as `python bench/train.py` runs it)
    module = sys.modules.get(f"bench_{name}")
    if module is None:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"bench_{name}"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def settings() -> TrainingSettings:
    # fp32 so both paths agree to float rounding; a learning rate and β large enough that
    # the second step's loss carries a KL term the first step's update made.
    return TrainingSettings(
        vocab_size=4096,
        max_length=512,
        max_position_embeddings=1024,
        precision="fp32",
        torch_threads=1,
        rl_learning_rate=1e-3,
        lr_scheduler="constant",
        warmup_ratio=0.0,
        beta=0.5,
        clip_epsilon=0.2,
        rollouts_per_task=2,
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, settings: TrainingSettings) -> Path:
    corpus = protocol_corpus(builtin_suite().instances(1), prompt_style="compact")
    return build_base_model(tmp_path_factory.mktemp("base") / "model", corpus, settings=settings)


# Raised inside transformers when TRL's GRPO trainer reads the old attribute (docs/training.md, "Warnings").
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_trl_and_the_bare_loop_compute_the_same_grpo_update(
    base: Path, settings: TrainingSettings, tmp_path: Path
) -> None:
    train, grpo = _bench("train"), _bench("train_grpo")
    templates = ["dir_tree", "largest_files"]
    chats = train.conversations(2, templates, "compact")
    examples = train.tokenized(base, chats, settings.max_length)
    batch = grpo.fixed_rollouts(examples, group_size=2, groups=1)
    # The observation tokens are in the completion and out of the loss.
    assert all(0 < sum(r.env_mask) < len(r.completion_ids) for r in batch.rollouts)
    assert batch.advantages[0] > 0 > batch.advantages[1]
    run_settings = grpo.grpo_settings(settings, batch, 2)

    trl = grpo.trl_grpo(base, batch, run_settings, tmp_path / "trl", steps=2)
    bare = grpo.torch_grpo(
        base,
        batch,
        run_settings,
        steps=2,
        pad_id=int(load_tokenizer(base).pad_token_id),
        bf16=False,
        threads=1,
    )

    assert len(trl.losses) == len(bare.losses) == 2
    # Step 1: ratio 1 and no KL yet, the loss is -mean(A) over the trained tokens; the
    # gradient norm checks the log-probabilities, the mask and the normalisation.
    assert trl.losses[0] == pytest.approx(bare.losses[0], rel=1e-4, abs=1e-6)
    assert trl.grad_norms[0] == pytest.approx(bare.grad_norms[0], rel=1e-3)
    # Step 2: the KL to the reference after one update enters both the same way.
    assert bare.losses[1] != pytest.approx(bare.losses[0], rel=1e-6)
    assert trl.losses[1] == pytest.approx(bare.losses[1], rel=1e-3)
    assert trl.tokens_per_s > 0 and bare.tokens_per_s > 0


def test_a_recipe_without_grpo_settings_is_refused_by_name() -> None:
    grpo = _bench("train_grpo")
    with pytest.raises(TrainerError, match=r"demo.*--part sft"):
        grpo.rl_settings_of(get_recipe("demo"), TrainingSettings())
    smollm2 = grpo.rl_settings_of(get_recipe("smollm2"), TrainingSettings())
    assert smollm2.rollouts_per_task == get_recipe("smollm2-rl").rl.settings["rollouts_per_task"]  # type: ignore[union-attr]
