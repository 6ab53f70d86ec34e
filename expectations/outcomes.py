"""What evaluating a suite yields, whichever engine evaluated it (GX or the polars reference)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ExpectationOutcome"]


class ExpectationOutcome(BaseModel):
    """One expectation's result over the batch."""

    model_config = ConfigDict(frozen=True)

    expectation: str
    """The expectation's meta id."""
    success: bool
    """True when the expectation held."""
    unexpected_episode_ids: list[str] = Field(default_factory=list)
    """Episodes that broke a row-level expectation (empty for batch expectations)."""
    observed_value: Any = None
    """The aggregate GX observed (batch expectations), JSON-safe."""
