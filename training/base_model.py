"""A base model without any download: a BPE tokenizer trained on the protocol corpus, a tiny Qwen2.

The tokenizer is byte-level BPE (every string round-trips, like Qwen's), trained with
`tokenizers` on protocol text: the system prompt with the tool schemas, task prompts,
rendered tool calls, observations and finals. It carries the special tokens Qwen's chat
template needs and TRL's `qwen2_5.jinja` chat template, verbatim: TRL recognises that
exact text and swaps in its `{% generation %}` twin for assistant-only loss.

The model is a Qwen2 (or Qwen3) causal LM built from a config (random init, seeded). Any
local HF directory (a real Qwen2.5, …) can be used instead wherever a base model path is
taken. `TrainingSettings.tokenizer_split` picks the pre-tokenizer: Qwen2's, or `words`
(every word one id wherever it stands; qwen3 models only, see `WORDS_PRETOKENIZE_REGEX`).
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.prompt import PromptStyle
from agent.render import render_final, render_tool_call
from training.conversations import system_prompt_for
from training.errors import BaseModelError
from training.settings import TrainingSettings
from training.trainers.common import module

__all__ = [
    "CHAT_TEMPLATE_NAME",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "build_base_model",
    "build_tokenizer",
    "protocol_corpus",
    "qwen_chat_template",
]

EOS_TOKEN = "<|im_end|>"
"""End of an assistant turn; generation stops there (as in Qwen2.5-Instruct)."""
PAD_TOKEN = "<|endoftext|>"
"""Padding (and document separator for continued pretraining)."""
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", EOS_TOKEN]
"""Special tokens the Qwen chat template writes."""
CHAT_TEMPLATE_NAME = "qwen2_5.jinja"
"""TRL's shipped chat template used verbatim."""
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen2's pre-tokenization split (transformers `tokenization_qwen2.PRETOKENIZE_REGEX`)."""
WORDS_PRETOKENIZE_REGEX = r"""\p{L}+|\p{N}|[^\s\p{L}\p{N}]+|\s+"""
"""The `words` split: letter runs, single digits, punctuation runs, whitespace runs.

Under Qwen2's split, `Lisbon` is one token after a quote (`"Lisbon` in JSON) and another
after a comma (`,Lisbon` in CSV), and `guests` differs from ` guests`: copying a value
from an observation meant learning a mapping per value. Here every word is one id
wherever it stands."""


def qwen_chat_template() -> str:
    """TRL's Qwen2.5 chat template, byte for byte (edited templates defeat TRL's matching)."""
    return (importlib.resources.files("trl") / "chat_templates" / CHAT_TEMPLATE_NAME).read_text(
        encoding="utf-8"
    )


def protocol_corpus(
    tasks: Iterable[Any] = (),
    trajectories: Iterable[Any] = (),
    *,
    prompt_style: PromptStyle | str = PromptStyle.FULL,
) -> list[str]:
    """Texts to train the tokenizer on: the system prompt, tasks, calls, finals, observations.

    `tasks` are `tasks.types.TaskInstance`s (prompt and reference solution rendered as
    the protocol writes them); `trajectories` are `agent.trajectory.Trajectory`s (their
    raw outputs and observations). Both may be empty: the system prompt (in
    `prompt_style`) alone still teaches the tokenizer the protocol's tags and tools.
    """
    from sandbox.tool_specs import BUILTIN_TOOLS

    texts = [system_prompt_for(BUILTIN_TOOLS.values(), prompt_style)]
    for task in tasks:
        texts.append(task.prompt)
        for i, call in enumerate(task.reference_solution):
            texts.append(render_tool_call(f"c{i + 1}", call.tool, call.args))
        texts.append(render_final(task.reference_final))
        texts.extend(task.files.values())
    for traj in trajectories:
        texts.append(traj.prompt)
        for step in traj.steps:
            texts.append(step.raw_output)
            if step.observation:
                texts.append(step.observation)
    return [t for t in texts if t]


def build_tokenizer(corpus: Iterable[str], *, settings: TrainingSettings) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` with Qwen's specials and chat template.

    Raises:
        BaseModelError: the corpus is empty or the tokenizer cannot be trained.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    texts = list(corpus)
    if not texts:
        raise BaseModelError("the tokenizer corpus is empty: pass at least the system prompt")
    tokenizer = Tokenizer(models.BPE())
    # `qwen`: the same normalizer and pre-tokenizer as transformers' Qwen2Tokenizer:
    # AutoTokenizer rebuilds a qwen2 checkpoint's tokenizer with them, so training with
    # anything else would make the saved merges disagree with how the text is split at
    # load time. `words` is only built for qwen3 models, whose tokenizer loads as saved.
    split = (
        QWEN2_PRETOKENIZE_REGEX if settings.tokenizer_split == "qwen" else WORDS_PRETOKENIZE_REGEX
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=settings.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    try:
        tokenizer.train_from_iterator(texts, trainer=trainer)
    except Exception as e:  # tokenizers raises bare Exceptions from Rust
        raise BaseModelError(f"cannot train the tokenizer: {e}") from e
    fast = module("transformers").PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=settings.max_position_embeddings,
    )
    fast.chat_template = qwen_chat_template()
    return fast


def build_base_model(dest: Path, corpus: Iterable[str], *, settings: TrainingSettings) -> Path:
    """Train the tokenizer on `corpus`, build a tiny Qwen2 from `settings`, save both to `dest`.

    Returns `dest`, an HF directory that `AutoTokenizer` / `AutoModelForCausalLM` (and so
    the `hf:` policy) load with `local_files_only=True`.

    Raises:
        BaseModelError: the tokenizer or the model cannot be built or saved.
    """
    import torch

    transformers = module("transformers")

    tokenizer = build_tokenizer(corpus, settings=settings)
    family = "Qwen3" if settings.architecture == "qwen3" else "Qwen2"
    config = getattr(transformers, f"{family}Config")(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=settings.num_kv_heads,
        head_dim=settings.hidden_size // settings.num_heads,
        max_position_embeddings=settings.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(settings.seed)
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    try:
        dest.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(dest)
        tokenizer.save_pretrained(dest)
    except OSError as e:
        raise BaseModelError(f"cannot save the base model to {dest}: {e.strerror}") from e
    from training.trainers import write_training_config

    # The directory alone is a complete `hf:` policy, its prompt style included.
    write_training_config(dest, settings=settings, algo=None)
    return dest
