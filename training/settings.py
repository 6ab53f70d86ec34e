"""Training settings (pydantic-settings, env prefix `EPIFLOW_TRAINING_`), one class for all trainers.

Defaults follow seed 000 §4.4 where it gives one: RL learning rate 1e-6 … 5e-6, KL
coefficient 0.01 … 0.1, clip range 0.2, 4 … 8 rollouts per task, 2 … 3 epochs. SFT gets
its own, higher learning rate: the seed's "an order of magnitude below SFT" puts SFT
around 1e-5 for real models, and the tiny locally built model needs ~1e-3 to move at all
in a handful of steps (set `EPIFLOW_TRAINING_SFT_LEARNING_RATE=1e-5` for a real model).

Built at the entry point (a flow, the CLI, a test) and passed down; never read at import.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.prompt import PromptStyle
from training.task_sampling import TaskSampling

__all__ = ["TrainingSettings"]


class TrainingSettings(BaseSettings):
    """Every training knob: optimisation, lengths, RL coefficients, the tiny model's shape."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_TRAINING_", extra="forbid")

    seed: int = 0
    """Seed of model initialisation, data order and sampling."""

    # optimisation
    sft_learning_rate: float = Field(default=1e-3, gt=0)
    """SFT learning rate. High for the tiny demo model; use ~1e-5 for a real model."""
    rl_learning_rate: float = Field(default=2e-6, gt=0)
    """Learning rate of DPO, KTO and GRPO (seed 000 §4.4: 1e-6 … 5e-6)."""
    epochs: float = Field(default=2.0, gt=0)
    """Passes over the dataset (seed 000 §4.4: 2 … 3; more overfits tools and paths)."""
    max_steps: int = Field(default=-1, ge=-1)
    """Optimizer steps; > 0 overrides `epochs` (tests and demos), -1 trains by epochs."""
    batch_size: int = Field(default=4, ge=1)
    """Examples per device per optimizer micro-step."""
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    """Micro-steps accumulated per optimizer step."""
    template_weights: dict[str, float] = Field(default_factory=dict)
    """SFT sampling weight multiplier per task template (rows' `template`); 1 when absent.
    The data mix: a template that takes longer to learn can be drawn more often."""
    warmup_ratio: float = Field(default=0.0, ge=0, lt=1)
    """Fraction of training spent warming the learning rate up."""
    lr_scheduler: Literal["linear", "cosine", "constant"] = "linear"
    """Learning-rate decay after the warm-up: linear or cosine to `min_lr_ratio`, or constant."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Final learning rate as a fraction of the peak (cosine and linear decay)."""
    max_time_s: float | None = Field(default=None, gt=0)
    """Wall-time budget of `trainer.train()`, seconds: training stops at the first step
    boundary past it (`training.callbacks.WallTimeStop`) and the learning-rate schedule
    runs on elapsed time instead of steps, so the decay ends exactly at the budget; the
    model is saved as usual. None: train for `max_steps` / `epochs`."""
    save_steps: int | None = Field(default=None, ge=1)
    """Save an intermediate checkpoint (`checkpoint-<step>` under the output directory)
    every N optimizer steps; None saves only the final model."""
    save_every_s: float | None = Field(default=None, gt=0)
    """Also save one every N seconds of training (`training.callbacks.TimedSaves`; each
    save records its elapsed seconds in `epiflow_elapsed.json`): completion against
    training minutes."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradient clipping norm."""
    activation_checkpointing: bool | None = None
    """Recompute activations in the backward pass (saves memory on real models, slows tiny
    ones). None: on for GRPO over whole episodes, whose micro-batches are a group of long
    multi-turn rollouts (SmolLM2, 6 rollouts × 1,500 tokens under bf16 autocast: peak RSS
    16.8 GiB without, 9.4 GiB with, no slower; `smollm2-rl` was killed for memory at its
    first optimiser step without it, docs/training.md), off elsewhere."""
    rollout_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The dtype GRPO's in-process rollouts generate in (`EPIFLOW_TRAINING_ROLLOUT_DTYPE`):
    `auto` samples from a bf16 copy of the trainer's model, its weights copied at each
    optimiser step (`agent.policies.hf_replica`), when training runs under bf16 autocast,
    and from the trainer's model itself otherwise; `float32` / `bfloat16` force a copy in
    that dtype. On a 2-core AMX Xeon a bf16 copy prefilled 3.6x and decoded 1.5x faster
    than the fp32 master weights (docs/training.md)."""
    bf16: bool | None = None
    """bf16 autocast (fp32 master weights), the older spelling of `precision`: when set it
    decides (and must agree with a `precision` other than `auto`); None: `precision` decides."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Training precision (`EPIFLOW_TRAINING_PRECISION`): `fp32`; `bf16` (bf16 autocast over
    fp32 master weights; the saved weights stay fp32); `auto`: bf16 where the hardware runs
    it natively (CUDA with bf16, CPUs with AVX512-BF16/AMX), fp32 elsewhere. The recipes set
    it (`training.recipes`: fp32 for the small models, which learned less under bf16
    autocast, issue 46); a value given here wins over the recipe (`training.precision`)."""
    torch_threads: int = Field(default=0, ge=0)
    """Intra-op threads of the trainer. 0: automatic (`training.threads`): every core on an
    idle machine, one thread when other processes already keep the cores busy (two
    OpenMP threads on two oversubscribed cores run several times slower than one)."""
    prompt_style: PromptStyle = PromptStyle.FULL
    """System prompt the model is trained and deployed with (`agent.prompt`): `full` for
    real models, `compact` for small models built from scratch. Recorded in the
    checkpoint's training config; the `hf:` policy shows that style."""

    # lengths
    max_length: int = Field(default=2048, ge=64)
    """Token budget of one training sequence (prompt + completion). Must fit the system
    prompt with its tool schemas, or every example is cut inside the prompt."""
    max_completion_length: int = Field(default=256, ge=8)
    """New tokens per GRPO rollout (one assistant turn)."""

    # RL / preference coefficients
    beta: float = Field(default=0.05, ge=0)
    """KL coefficient toward the reference model (seed 000 §4.4: 0.01 … 0.1); also DPO/KTO β."""
    clip_epsilon: float = Field(default=0.2, gt=0, lt=1)
    """PPO-style clip range of GRPO (seed 000 §4.4: 0.2, up to 0.3 for hard tasks)."""
    rollouts_per_task: int = Field(default=4, ge=2)
    """GRPO rollouts per task prompt (seed 000 §4.4: 4 … 8); the group for the advantage."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature of GRPO rollouts."""
    grpo_iterations: int = Field(default=1, ge=1)
    """Optimiser steps GRPO takes on each generation batch (TRL's `num_iterations`, μ; seed
    000 §4.4: 2 … 3 epochs over a batch). Above 1 the clip range ε matters (the ratio to the
    batch's old log-probabilities, scored once after generation, moves off 1) and a run of
    `max_steps` optimiser steps generates `max_steps / grpo_iterations` batches."""
    rl_tokens_per_step: int | None = None
    """Agentic GRPO's batch in tokens (`EPIFLOW_TRAINING_RL_TOKENS_PER_STEP`; seed 000 §4.4:
    32,768 … 131,072): prompt and completion tokens of an optimiser step's rollouts. When
    set it wins over `batch_size`: converted once, before the trainer is built, into whole
    groups per step from the measured mean rollout length (`training.token_budget`). None:
    `batch_size` rollouts a step."""
    rl_rollout_tokens_estimate: int = Field(default=600, ge=1)
    """Tokens of a rollout assumed by the token budget when no stored source episode can be
    measured (600: the smollm2 recipe's SFT examples of the same episodes, 400–650)."""
    zero_variance_warn_share: float = Field(default=0.5, ge=0, le=1)
    """Share of judged GRPO groups dropped for zero reward variance above which the run
    warns (`training.groups.zero_variance_warning`). Past half, most of the generation is
    wasted: seed 000 §5.3 wants a task difficulty of 30-70 % success, where most groups of
    4-8 rollouts see both outcomes."""
    returns_gamma: float | None = None
    """Per-turn discounted returns for agentic GRPO (seed 000 §4.3: γ 0.95 … 0.99): each
    assistant turn's tokens get the advantage of its reward-to-go, normalised by the
    group's start returns (`training.returns`). None (the default): one advantage per
    episode, from its total reward. Must be in (0, 1]; not the default because it was not
    measured at the recipe's scale (docs/training.md, "Per-turn returns")."""
    rollout_batch_window_s: float = Field(default=0.0, ge=0)
    """How long the idle rollout policy of agentic GRPO waits for more episodes' turns, at
    most, before it starts decoding (`HFGeneration.batch_window_s`; it starts at once when
    the rollout concurrency's worth wait). Turns that arrive while others decode join
    them at the next step without a window. 0: at once."""
    task_sampling: TaskSampling = TaskSampling.UNIFORM
    """How agentic GRPO draws each batch's tasks (`training.task_sampling`): `uniform`
    (TRL's shuffled pass over the tasks, the default) or `success_variance` (each group's
    template weighted by p̂(1 − p̂) of its success in the run so far, seed 000 §5.3's
    30-70 % tasks drawn most)."""
    kto_desirable_weight: float = Field(default=1.0, gt=0)
    """KTO weight of desirable (successful) examples."""
    kto_undesirable_weight: float = Field(default=1.0, gt=0)
    """KTO weight of undesirable (failed) examples."""

    # the locally built base model (training.base_model)
    architecture: Literal["qwen2", "qwen3"] = "qwen2"
    """Decoder family of the locally built model: `qwen2` (QKV bias) or `qwen3` (QK-norm).
    A `words` tokenizer needs `qwen3`: transformers rebuilds a qwen2 checkpoint's tokenizer
    with Qwen2's own pre-tokenizer on load, which would split text differently from training."""
    tokenizer_split: Literal["qwen", "words"] = "qwen"
    """Pre-tokenizer of the locally trained BPE. `qwen`: Qwen2's (a leading space or one
    punctuation mark sticks to the word that follows). `words`: letters, single digits,
    punctuation runs and whitespace runs always apart, so a word is the same token wherever
    it stands and copying it from the prompt or an observation is copying one id."""
    vocab_size: int = Field(default=2048, ge=300)
    """Target vocabulary of the locally trained BPE tokenizer (specials included)."""
    hidden_size: int = Field(default=64, ge=8)
    """Hidden size of the tiny Qwen2-style model."""
    intermediate_size: int = Field(default=256, ge=8)
    """MLP width of the tiny model."""
    num_layers: int = Field(default=2, ge=1)
    """Decoder layers of the tiny model."""
    num_heads: int = Field(default=4, ge=1)
    """Attention heads of the tiny model."""
    num_kv_heads: int = Field(default=2, ge=1)
    """Key/value heads of the tiny model (grouped-query attention)."""
    max_position_embeddings: int = Field(default=4096, ge=64)
    """Longest sequence the tiny model accepts."""

    # copy warm-up of a model built from scratch (training.pretrain)
    copy_warmup_s: float | None = Field(default=None, gt=0)
    """Seconds of synthetic copy training when the base model is built (None: none). The
    tasks are mostly copying; a model from scratch learned it from them too slowly."""
    copy_warmup_steps: int | None = Field(default=None, ge=1)
    """Optimizer steps of the copy warm-up instead of `copy_warmup_s` (a budget that
    teaches the same on a loaded machine as on a quiet one, only slower)."""
    copy_warmup_span: int = Field(default=48, ge=4)
    """Tokens per copied span."""
    copy_warmup_batch_size: int = Field(default=16, ge=1)
    """Copy chats per warm-up step."""
    copy_warmup_examples: int = Field(default=4000, ge=1)
    """Distinct copy chats generated (drawn with replacement past one pass)."""

    # bookkeeping
    logging_steps: int = Field(default=1, ge=1)
    """Log (and collect metrics) every N optimizer steps."""
    progress_every_s: float = Field(default=20.0, gt=0)
    """Longest silence of training on the terminal, seconds: a progress line (step /
    planned, last loss, rate, ETA) at least this often, a heartbeat while one step runs
    longer (`core.progress`, `training.callbacks.TrainingProgress`)."""

    @field_validator("rl_tokens_per_step", mode="before")
    @classmethod
    def _check_tokens_per_step(cls, value: object) -> object:
        if value is None:
            return None
        try:
            number = int(str(value).strip().replace("_", ""))
        except ValueError:
            number = 0
        if number < 1 or isinstance(value, bool | float):
            raise ValueError(
                "EPIFLOW_TRAINING_RL_TOKENS_PER_STEP (rl_tokens_per_step) must be a positive "
                "integer (tokens per GRPO optimiser step, seed 000 §4.4: 32768 … 131072), "
                f"got {value!r}"
            )
        return number

    @field_validator("returns_gamma")
    @classmethod
    def _check_returns_gamma(cls, gamma: float | None) -> float | None:
        if gamma is not None and not 0 < gamma <= 1:
            raise ValueError(
                f"EPIFLOW_TRAINING_RETURNS_GAMMA must be in (0, 1] (seed 000 §4.3: 0.95 … "
                f"0.99), or unset for one advantage per episode; got {gamma}"
            )
        return gamma

    @model_validator(mode="after")
    def _check_precision(self) -> TrainingSettings:
        forced = self.precision != "auto"
        if self.bf16 is not None and forced and self.bf16 != (self.precision == "bf16"):
            raise ValueError(
                f"bf16={self.bf16} contradicts precision={self.precision!r}: set one of them"
            )
        return self

    @model_validator(mode="after")
    def _check_shapes(self) -> TrainingSettings:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size must be a multiple of num_heads, got {self.hidden_size} and "
                f"{self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads must be a multiple of num_kv_heads, got {self.num_heads} and "
                f"{self.num_kv_heads}"
            )
        if self.tokenizer_split == "words" and self.architecture == "qwen2":
            raise ValueError(
                "tokenizer_split 'words' needs architecture 'qwen3' (transformers reloads a "
                "qwen2 checkpoint's tokenizer with Qwen2's own pre-tokenizer)"
            )
        if self.max_length > self.max_position_embeddings:
            raise ValueError(
                f"max_length ({self.max_length}) must not exceed max_position_embeddings "
                f"({self.max_position_embeddings})"
            )
        return self
