"""Settings of the real-jail GRPO tests on the tiny base model (`tiny_base_model`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from agent.prompt import PromptStyle
from agent.settings import LoopSettings, PolicySettings
from config.settings import Settings, load_settings
from training.settings import TrainingSettings


def tiny_grpo_training(**overrides: Any) -> TrainingSettings:
    """GRPO on the tiny model: its shape (4,096 tokens, 1,024 positions), 16-token turns,
    the compact prompt, a log line per optimiser step; `overrides` win."""
    return TrainingSettings(
        **{
            "vocab_size": 4096,
            "max_length": 1024,
            "max_position_embeddings": 1024,
            "max_completion_length": 16,
            "prompt_style": PromptStyle.COMPACT,
            "logging_steps": 1,
            **overrides,
        }
    )


def rollout_settings(**loop: Any) -> Settings:
    """The settings the rollouts run under: the episode loop's limits as given, and no
    pause after endpoint outages (the policies here are in-process)."""
    return dataclasses.replace(
        load_settings(), loop=LoopSettings(**loop), policy=PolicySettings(outage_episodes=0)
    )
