"""The training config: what deployment must reproduce exactly (seed 000 §4.5).

Stored as `training_config.json` next to every checkpoint (base models included): the
tool schemas, the rendered system prompt, the protocol version, the chat template and
tokenizer facts, the dataset it was trained on and the settings. `check_deployment` tells
a deployment (the `evaluate` flow, the `hf:` policy's caller) whether what it is about to
show the model is what the model was trained on.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from agent.policies.hf import TRAINING_CONFIG_FILE
from agent.prompt import PromptStyle
from agent.trajectory import PROTOCOL_VERSION, utcnow
from sandbox.tool_specs import ToolSpec
from training.conversations import system_prompt_for
from training.settings import TrainingSettings

__all__ = [
    "CONFIG_FILE",
    "TokenizerInfo",
    "TrainingConfig",
    "build_training_config",
    "check_deployment",
    "load_training_config_file",
]

CONFIG_FILE = TRAINING_CONFIG_FILE
"""File name of the training config, in the model directory and next to it in the object store
(the `hf:` policy reads `prompt_style` from it)."""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class TokenizerInfo(BaseModel):
    """Tokenizer facts deployment can check without loading weights."""

    tokenizer_class: str
    """Class that loaded it."""
    vocab_size: int
    """Tokens, added ones included."""
    eos_token: str | None
    """End-of-turn token generation stops at."""
    pad_token: str | None
    """Padding token."""
    chat_template_sha256: str | None
    """sha256 of the chat template (None when the tokenizer has none)."""


class TrainingConfig(BaseModel):
    """Everything the model was trained to see, versioned with the checkpoint."""

    protocol_version: str
    """Tool-call protocol version the training data spoke."""
    tools: list[ToolSpec]
    """Tool schemas offered (name, description, JSON schema, version)."""
    prompt_style: PromptStyle = PromptStyle.FULL
    """System prompt style trained on; the `hf:` policy shows the same style."""
    system_prompt: str
    """The rendered system prompt (protocol rules and tool sections)."""
    system_prompt_sha256: str
    """sha256 of `system_prompt`."""
    chat_template: str | None
    """The tokenizer's chat template, verbatim."""
    tokenizer: TokenizerInfo
    """Tokenizer facts."""
    algo: str | None
    """sft, dpo, kto or grpo; None for a base model."""
    base_model: str | None
    """Base model path or checkpoint id it was trained from; None for a base model."""
    dataset_id: uuid.UUID | None
    """Snapshot trained on; None for a base model."""
    dataset_kind: str | None = None
    """Kind of that snapshot."""
    dataset_sha256: str | None = None
    """sha256 of that snapshot's parquet file."""
    settings: dict[str, Any] = Field(default_factory=dict)
    """The `TrainingSettings` used."""
    created_at: datetime = Field(default_factory=utcnow)
    """When the training config was written (UTC)."""


def _tokenizer_info(model_dir: Path) -> tuple[TokenizerInfo, str | None]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    template = getattr(tokenizer, "chat_template", None)
    template_text = template if isinstance(template, str) else None
    info = TokenizerInfo(
        tokenizer_class=type(tokenizer).__name__,
        vocab_size=len(tokenizer),
        eos_token=tokenizer.eos_token,
        pad_token=tokenizer.pad_token,
        chat_template_sha256=_sha256(template_text) if template_text is not None else None,
    )
    return info, template_text


def build_training_config(
    model_dir: Path,
    *,
    tools: Iterable[ToolSpec],
    settings: TrainingSettings,
    algo: str | None = None,
    base_model: str | None = None,
    dataset_id: uuid.UUID | None = None,
    dataset_kind: str | None = None,
    dataset_sha256: str | None = None,
) -> TrainingConfig:
    """The training config for the model in `model_dir` (its tokenizer is read from there)."""
    specs = list(tools)
    prompt = system_prompt_for(specs, settings.prompt_style)
    tokenizer, template = _tokenizer_info(model_dir)
    return TrainingConfig(
        protocol_version=PROTOCOL_VERSION,
        tools=specs,
        prompt_style=settings.prompt_style,
        system_prompt=prompt,
        system_prompt_sha256=_sha256(prompt),
        chat_template=template,
        tokenizer=tokenizer,
        algo=algo,
        base_model=base_model,
        dataset_id=dataset_id,
        dataset_kind=dataset_kind,
        dataset_sha256=dataset_sha256,
        settings=settings.model_dump(mode="json"),
    )


def load_training_config_file(model_dir: Path) -> TrainingConfig:
    """The training config stored in a checkpoint directory (`training_config.json`).

    Raises:
        OSError: the directory has no training config.
        ValueError: the file is not a valid training config.
    """
    return TrainingConfig.model_validate_json((model_dir / CONFIG_FILE).read_bytes())


def check_deployment(
    config: TrainingConfig,
    tools: Iterable[ToolSpec],
    *,
    system_prompt: str | None = None,
) -> list[str]:
    """Differences between what the model was trained on and what `tools` would show it.

    `system_prompt` is what the deployment actually shows (e.g. the `hf:` policy's
    `system_prompt(tools)`); by default, the prompt rendered in the trained style.
    Empty when the protocol version, the tool schemas and the system prompt all match.
    """
    specs = list(tools)
    problems: list[str] = []
    if config.protocol_version != PROTOCOL_VERSION:
        problems.append(
            f"protocol version: trained on {config.protocol_version}, deployed {PROTOCOL_VERSION}"
        )
    trained = {t.name: t for t in config.tools}
    deployed = {t.name: t for t in specs}
    for name in sorted(trained.keys() | deployed.keys()):
        if name not in deployed:
            problems.append(f"tool {name}: trained with it, not offered now")
        elif name not in trained:
            problems.append(f"tool {name}: offered now, never seen in training")
        elif trained[name] != deployed[name]:
            problems.append(
                f"tool {name}: schema or version changed ({trained[name].version} → "
                f"{deployed[name].version})"
            )
    shown = (
        system_prompt
        if system_prompt is not None
        else system_prompt_for(specs, config.prompt_style)
    )
    if _sha256(shown) != config.system_prompt_sha256:
        problems.append(
            f"system prompt: the deployed prompt differs from the trained one "
            f"({config.prompt_style.value} style)"
        )
    return problems
