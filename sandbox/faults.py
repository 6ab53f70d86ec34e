"""Fault injection: seeded, per-call, replayable (seed 000 §5.4 "inject faults on purpose").

One uniform draw per tool call decides which fault, if any, hits it. The generator for
call *n* is seeded from `(fault_seed, n)` only, so a replay of the same episode (same seed,
same call sequence) meets exactly the same faults, whatever else ran in between.
"""

from __future__ import annotations

import random
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox.types import InjectedFault

#: Faults that replace the call (the command never runs), in draw order.
FAULT_KINDS = ("tool_timeout", "permission_denied", "network_failure", "latency")
#: Tools a network failure can hit; file tools never touch the network.
NETWORK_TOOLS = frozenset({"execute_shell"})


class FaultProfile(BaseModel):
    """Probabilities of each injected fault per tool call; all zero (off) by default."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    latency_p: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that a call is delayed by `latency_ms` before it runs normally."""
    latency_ms: tuple[int, int] = (1000, 2000)
    """Range (inclusive) of the added latency, milliseconds."""
    permission_denied_p: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that a call fails with `permission_denied` without running."""
    network_failure_p: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that an `execute_shell` call fails with `network_failure` without running."""
    tool_timeout_p: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that a call reports a timeout without running (no time is spent)."""

    @model_validator(mode="after")
    def _valid(self) -> Self:
        low, high = self.latency_ms
        if not 0 <= low <= high:
            raise ValueError(
                f"latency_ms must be (low, high) with 0 <= low <= high, got {self.latency_ms}"
            )
        total = (
            self.latency_p + self.permission_denied_p + self.network_failure_p + self.tool_timeout_p
        )
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault probabilities must sum to at most 1, got {total:g}")
        return self

    @property
    def enabled(self) -> bool:
        """True when any fault can fire."""
        return (
            self.latency_p + self.permission_denied_p + self.network_failure_p + self.tool_timeout_p
        ) > 0


class FaultInjector:
    """Decides the fault of each call of one episode."""

    def __init__(self, profile: FaultProfile, seed: int) -> None:
        self.profile = profile
        self.seed = seed
        self.calls = 0

    def next_fault(self, tool: str) -> InjectedFault | None:
        """The fault for the next call (advances the call counter even when none fires)."""
        index = self.calls
        self.calls += 1
        if not self.profile.enabled:
            return None
        rng = random.Random(f"epiflow-fault:{self.seed}:{index}")
        draw = rng.random()
        p = self.profile
        edge = 0.0
        for kind, prob in (
            ("tool_timeout", p.tool_timeout_p),
            ("permission_denied", p.permission_denied_p),
            ("network_failure", p.network_failure_p),
            ("latency", p.latency_p),
        ):
            edge += prob
            if draw < edge:
                if kind == "network_failure" and tool not in NETWORK_TOOLS:
                    return None
                detail: dict[str, object] = {"call_index": index}
                if kind == "latency":
                    detail["latency_ms"] = rng.randint(*p.latency_ms)
                return InjectedFault(kind=kind, detail=detail)
        return None
