"""Named training recipes: model shape, prompt style, data recipe, schedule and budget in one place.

A recipe is what `bench/loop.py`, the demo and the train flow select by name so that
they train the same way: the data to collect (templates, oracle and noisy instances per
template), the `TrainingSettings` overrides (a small model trained from scratch on the
compact prompt, its optimiser and wall-time budget), and how to evaluate (held-out
instances per template, turn and token limits). The figures that chose each value are in
docs/training.md ("Recipes").

A recipe replaces `TrainingSettings` defaults only: a value set explicitly (an
`EPIFLOW_TRAINING_*` variable, or a field given to the constructor) wins over the recipe,
so a recipe never hides a setting from the operator.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from training.errors import TrainerError
from training.precision import EvalDtype, Precision
from training.settings import TrainingSettings

__all__ = ["RECIPES", "Recipe", "RlStage", "get_recipe"]


class RlStage(BaseModel):
    """Agentic GRPO after the SFT stage (`bench/loop.py`'s RL stage): its budget in
    optimiser steps and, per step, tokens or groups, never seconds, and its settings."""

    model_config = ConfigDict(frozen=True)

    steps: int = Field(ge=1)
    """Optimiser steps."""
    tokens_per_step: int | None = Field(default=None, ge=1)
    """The step's batch in tokens (seed 000 §4.4: 32k–128k; `rl_tokens_per_step`),
    converted into whole groups from the measured mean rollout length before the trainer
    is built (`training.token_budget`). Exactly one of this and `groups_per_step`."""
    groups_per_step: int | None = Field(default=None, ge=1)
    """Groups (tasks, each with `rollouts_per_task` rollouts) per optimiser step: the
    step's batch is `groups_per_step × rollouts_per_task` rollouts, one generation batch
    per step (TRL's `steps_per_generation` 1), so a run generates `steps ×
    groups_per_step` groups. Exactly one of this and `tokens_per_step`."""
    concurrency: int = Field(default=8, ge=1)
    """Rollout episodes at a time (the trainer's model generates their turns together)."""
    settings: dict[str, Any] = Field(default_factory=dict)
    """`TrainingSettings` overrides over the SFT stage's: seed 000 §4.4's knobs
    (`rl_learning_rate`, `beta`, `clip_epsilon`, `rollouts_per_task`), sampling, the new
    tokens per turn (`max_completion_length`)."""

    @model_validator(mode="after")
    def _one_batch_size(self) -> RlStage:
        if (self.tokens_per_step is None) == (self.groups_per_step is None):
            raise ValueError("an RL stage sizes its steps by tokens_per_step or groups_per_step")
        return self


class Recipe(BaseModel):
    """How to collect, train and evaluate for one purpose (bench, demo)."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Recipe name (`loop`, `demo`)."""
    summary: str
    """One line: what it is for."""
    templates: list[str]
    """Built-in task templates trained and evaluated."""
    oracle_tasks: int = Field(ge=0)
    """`scripted:oracle` training instances per template."""
    noisy_tasks: int = Field(ge=0)
    """`scripted:noisy` training instances per template (recovered mistakes; the gate
    admits those that still succeeded)."""
    noisy_policy: str = "scripted:noisy"
    """Policy spec of the noisy collection."""
    heldout: int = Field(ge=1)
    """Held-out instances per template for the evaluation (seeds disjoint from training)."""
    eval_max_steps: int = Field(default=4, ge=1)
    """Turns per evaluation episode."""
    eval_max_new_tokens: int = Field(default=256, ge=8)
    """New tokens per evaluation turn."""
    copy_warmup_share: float = Field(default=0.0, ge=0, lt=1)
    """Share of the training time spent on the copy warm-up when the base model is built
    (`training.pretrain`); the rest is SFT."""
    settings: dict[str, Any] = Field(default_factory=dict)
    """`TrainingSettings` overrides."""
    pretrained: str | None = None
    """A pretrained base (`training.pretrained.PRETRAINED` name, e.g. `smollm2`) trained
    from instead of a small model built from scratch (the shape settings then unused)."""
    eval_policy: Literal["hf", "openai"] = "hf"
    """How checkpoints are evaluated: the in-process `hf:` policy, or `openai:` against the
    checkpoint served by `transformers serve` (`agent.serving`)."""
    eval_concurrency: int = Field(default=2, ge=1)
    """Evaluation episodes at a time (with `openai:`, the server batches their turns)."""
    eval_max_parse_failures: int | None = Field(default=None, ge=1)
    """Unparsable turns in a row that end an evaluation episode (None: `eval_max_steps`)."""
    base_heldout: int | None = Field(default=None, ge=1)
    """Held-out instances per template for the base model (None: `bench/loop.py`'s
    `--base-heldout`)."""
    serve_threads: int | None = Field(default=None, ge=1)
    """The evaluation server's torch threads (`serve_checkpoint(torch_threads=…)`)."""
    bare_torch_steps: int = Field(default=0, ge=0)
    """Steps of the bare torch loop `bench/loop.py` times on the snapshot's own examples
    after training (tokens/s against the trainer's on the same model; 0: none)."""

    precision: Precision = "auto"
    """Training precision (`TrainingSettings.precision`): `fp32` where bf16 autocast was
    measured to learn less (the small models built from scratch, issue 46), `auto` where it
    learned as well and faster. `EPIFLOW_TRAINING_PRECISION` (or `_BF16`) wins."""
    eval_dtype: EvalDtype = "float32"
    """The dtype checkpoints are evaluated in: the saved one (fp32 master weights under any
    training precision), which the `hf:` policy and `transformers serve` load by default."""
    rl: RlStage | None = None
    """GRPO from the SFT checkpoint after the SFT stage, evaluated on the same held-out
    instances (None: no RL stage)."""

    def training_settings(self, base: TrainingSettings) -> TrainingSettings:
        """The recipe's settings and precision over the defaults of `base` (the entry point's
        `TrainingSettings`, read from the environment there); fields set explicitly in `base`
        are kept (an explicit `bf16` keeps the recipe's precision out too).

        Raises:
            TrainerError: an override is not a valid setting.
        """
        declared = {"precision": self.precision, **self.settings}
        explicit = base.model_fields_set | ({"precision"} if base.bf16 is not None else set())
        overrides = {k: v for k, v in declared.items() if k not in explicit}
        try:
            return TrainingSettings.model_validate({**base.model_dump(), **overrides})
        except ValueError as e:
            raise TrainerError(f"recipe {self.name!r}: invalid settings: {e}") from e

    def rl_settings(
        self,
        sft: TrainingSettings,
        *,
        explicit: frozenset[str] | set[str] = frozenset(),
        steps: int | None = None,
        groups_per_step: int | None = None,
        tokens_per_step: int | None = None,
    ) -> TrainingSettings:
        """The RL stage's settings: the stage's overrides over the SFT stage's settings
        `sft` (except the fields in `explicit`: those the entry point's settings were given
        explicitly, e.g. `TrainingSettings().model_fields_set`), and its budget: `steps`
        optimiser steps (default: the stage's), no wall-time budget.

        The step's batch, the first given of: `groups_per_step` (`--rl-groups`: groups win
        over tokens when given explicitly, the budget then unset), `tokens_per_step`
        (`--rl-tokens-per-step`), an explicit `rl_tokens_per_step`
        (`EPIFLOW_TRAINING_RL_TOKENS_PER_STEP`), the stage's. Groups set `batch_size` =
        groups × `rollouts_per_task` and no gradient accumulation; tokens set
        `rl_tokens_per_step`, which `collection.grpo_training` converts into groups before
        the trainer is built (`training.token_budget`).

        Raises:
            TrainerError: the recipe has no RL stage, or an override or budget is invalid.
        """
        if self.rl is None:
            raise TrainerError(f"recipe {self.name!r} has no RL stage")
        overrides = {k: v for k, v in self.rl.settings.items() if k not in explicit}
        merged = {**sft.model_dump(), **overrides}
        n_steps = steps if steps is not None else self.rl.steps
        tokens: int | None = None
        groups: int | None = groups_per_step
        if groups is None:
            if tokens_per_step is not None:
                tokens = tokens_per_step
            elif "rl_tokens_per_step" in explicit and sft.rl_tokens_per_step is not None:
                tokens = sft.rl_tokens_per_step
            elif self.rl.tokens_per_step is not None:
                tokens = self.rl.tokens_per_step
            else:
                groups = self.rl.groups_per_step
        if (
            n_steps < 1
            or (groups is not None and groups < 1)
            or (tokens is not None and tokens < 1)
        ):
            raise TrainerError(
                f"recipe {self.name!r}: the RL budget must be at least 1 step of 1 group or "
                f"1 token (--rl-steps, --rl-groups, --rl-tokens-per-step), got {n_steps} steps "
                f"of {groups if groups is not None else tokens}"
            )
        budget: dict[str, Any] = {
            "max_steps": n_steps,
            "gradient_accumulation_steps": 1,
            "max_time_s": None,
            "save_every_s": None,
            "save_steps": None,
            "rl_tokens_per_step": tokens,
        }
        if groups is not None:
            budget["batch_size"] = groups * int(merged["rollouts_per_task"])
        try:
            return TrainingSettings.model_validate({**merged, **budget})
        except ValueError as e:
            raise TrainerError(f"recipe {self.name!r}: invalid RL settings: {e}") from e


_SMALL_MODEL: dict[str, Any] = {
    "prompt_style": "compact",
    "architecture": "qwen3",
    "tokenizer_split": "words",
    "vocab_size": 4096,
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 4,
    "max_length": 1024,
    "max_position_embeddings": 2048,
    "sft_learning_rate": 3e-3,
    "lr_scheduler": "cosine",
    "min_lr_ratio": 0.1,
    "warmup_ratio": 0.03,
    "batch_size": 8,
    "epochs": 1.0,
    "logging_steps": 10,
}

SMOLLM2_TEMPLATES = [
    "largest_files",
    "jsonl_extract",
    "dir_tree",
    "checksums",
    "rename_files",
    "csv_to_json",
]
"""The smollm2 recipe's templates, with why each (docs/training.md, "The smollm2 recipe"):
largest_files and jsonl_extract are solved by one program that is the same for every
instance; dir_tree copies the paths of the prompt into one command; checksums runs one
fixed command and writes the names it reports as failed; rename_files lists a folder and
writes one `mv` per listed name; csv_to_json rewrites the file it read as JSON (the
hardest of the six: every value is copied into another format). Half the instances of
the last three demonstrate a command or script that computes the answer instead
(`suites.builtin.common.either_reference`, version 2 of those templates)."""

_LOOP = Recipe(
    name="loop",
    summary="bench/loop.py: the closed loop from a fresh model in 20 minutes on 2 cores",
    templates=["csv_to_json", "dir_tree"],
    oracle_tasks=1000,
    noisy_tasks=100,
    heldout=10,
    # Steps, not seconds (as the demo): the time-budgeted warm-up and SFT followed the
    # machine's load (warm-up 411 / 300 / 295 steps gave dir_tree 1.0 / 0.8 / 0.3);
    # 400 warm-up and 1,000 SFT steps are what the quiet run of the issue-15 note did.
    settings={
        **_SMALL_MODEL,
        "copy_warmup_steps": 400,
        "max_steps": 1000,
        "template_weights": {"csv_to_json": 1.5},
    },
    # fp32 on every CPU: 0.50 held-out completion in fp32 (3 of 3 runs) against
    # 0.20-0.25 under bf16 autocast on an AMX Xeon (issue 46).
    precision="fp32",
)

_SMOLLM2 = Recipe(
    name="smollm2",
    summary=(
        "bench/loop.py --recipe smollm2: SmolLM2-135M-Instruct fine-tuned on the loop's "
        "own data, served and evaluated through openai: in under 30 minutes on 2 cores"
    ),
    templates=SMOLLM2_TEMPLATES,
    oracle_tasks=30,
    noisy_tasks=6,
    heldout=4,
    base_heldout=2,
    eval_max_steps=5,
    eval_max_new_tokens=256,
    eval_max_parse_failures=2,
    eval_concurrency=6,
    pretrained="smollm2",
    eval_policy="openai",
    serve_threads=1,
    bare_torch_steps=3,
    # Steps and examples, not seconds. The compact prompt: ~90 SmolLM2 tokens against
    # ~800 for the full one, so an example costs ~600 tokens instead of ~1,300 to train
    # and each served turn prefills a seventh of the prompt; the openai: policy sends
    # it with `prompt_style=compact`. Full fine-tune (no LoRA: peft is not a
    # dependency, and the whole model is 134.5 M parameters) in bf16 autocast where
    # the CPU runs it natively: 0.583 held-out under bf16 (AMX) against 0.542 in fp32
    # (one run each, 14 vs 13 of 24 episodes), SFT ~170 against 29 tokens/s.
    precision="auto",
    settings={
        "prompt_style": "compact",
        "max_length": 1536,
        "sft_learning_rate": 1e-4,
        "lr_scheduler": "cosine",
        "min_lr_ratio": 0.1,
        "warmup_ratio": 0.05,
        "batch_size": 4,
        "max_steps": 45,
        "epochs": 1.0,
        "logging_steps": 5,
    },
)


_SEED_GRPO: dict[str, Any] = {
    # Seed 000 §4.4: lr 1e-6 … 5e-6 (the top: a run of tens of steps), KL β 0.01 … 0.1,
    # clip ε 0.2 … 0.3, 4 … 8 rollouts per task; a constant rate (no warm-up or decay over
    # so few steps) and one log line per optimiser step (the progress of the RL stage).
    "rl_learning_rate": 5e-6,
    "beta": 0.04,
    "clip_epsilon": 0.2,
    "rollouts_per_task": 6,
    "temperature": 1.0,
    "lr_scheduler": "constant",
    "warmup_ratio": 0.0,
    "logging_steps": 1,
}
"""The GRPO stage's settings shared by the RL recipes."""

_SMOLLM2_RL = Recipe.model_validate(
    {
        **_SMOLLM2.model_dump(),
        "name": "smollm2-rl",
        "summary": (
            "bench/loop.py --recipe smollm2-rl: the smollm2 recipe, then agentic GRPO from its "
            "SFT checkpoint; base, SFT and RL evaluated on the same 48 held-out episodes"
        ),
        # The same 8 held-out instances per template for the base, the SFT and the RL
        # checkpoint (issue 42: 48 episodes each).
        "heldout": 8,
        "base_heldout": 8,
        "rl": RlStage(
            # Batches in tokens at seed 000 §4.4's minimum, 32,768 a step: at the ~620
            # tokens a rollout the run measures from the oracle episodes, 9 groups × 6
            # rollouts. 12 steps (648 rollouts): 5 steps (270) moved no template from the
            # SFT checkpoint; 12 took run K's SFT 0.708 to RL 0.938 and 0.958 at lr 1e-5
            # (runs K, L) and to 0.917 at seed 000 §4.4's lr 5e-6 (run M), in 36.2-42.9
            # min on a 2-core AMX Xeon (docs/training.md, "Two ways to solve a task").
            steps=12,
            tokens_per_step=32_768,
            # 16 episodes at a time, their turns generated in one batch: SmolLM2 from a bf16
            # copy decoded 117.5 tokens/s at 16 rows against 78.5 at 8 (1,000-token
            # prompts, 2-core AMX Xeon; docs/training.md), and a step's 54 rollouts then
            # run in about 4 waves instead of 7.
            concurrency=16,
            # New tokens per turn as in the evaluation (`eval_max_new_tokens`); each
            # group's template drawn by its success variance (seed 000 §5.3: the SFT
            # checkpoint's sampled success per template spans 0.0 to 0.9, and a uniform
            # draw spent a third of the groups where every rollout agreed).
            settings={
                **_SEED_GRPO,
                "max_completion_length": 256,
                "task_sampling": "success_variance",
            },
        ),
    }
)

_LOOP_RL = Recipe.model_validate(
    {
        **_LOOP.model_dump(),
        "name": "loop-rl",
        "summary": (
            "bench/loop.py --recipe loop-rl: the loop recipe's small model, then the RL stage "
            "of smollm2-rl (a path check that runs in minutes, not a learning target)"
        ),
        "rl": RlStage(
            steps=8,
            groups_per_step=2,
            settings={**_SEED_GRPO, "rollouts_per_task": 4, "max_completion_length": 256},
        ),
    }
)


RECIPES: dict[str, Recipe] = {
    "loop": _LOOP,
    "demo": Recipe(
        name="demo",
        summary=(
            "epiflow demo: the same small model in a few minutes, on dir_tree (copying) and "
            "largest_files (one program solves every instance, learned first)"
        ),
        templates=["dir_tree", "largest_files"],
        oracle_tasks=200,
        noisy_tasks=20,
        heldout=4,
        eval_max_new_tokens=320,
        copy_warmup_share=0.25,
        # Steps, not seconds: the demo (and its test) must teach the same on a loaded
        # machine; at 180 s of SFT a fully loaded machine left too few steps to learn.
        settings={**_SMALL_MODEL, "max_steps": 200, "copy_warmup_steps": 160},
        # The loop's model and data: what held for it holds here (issue 46).
        precision="fp32",
    ),
    "smollm2": _SMOLLM2,
    "smollm2-rl": _SMOLLM2_RL,
    "loop-rl": _LOOP_RL,
}
"""The presets, by name."""


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`.

    Raises:
        TrainerError: no such recipe (the message lists the known ones).
    """
    try:
        return RECIPES[name]
    except KeyError as e:
        known = ", ".join(sorted(RECIPES))
        raise TrainerError(f"unknown training recipe {name!r} (known: {known})") from e
