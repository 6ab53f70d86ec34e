"""Errors of the flows' own parameters (the packages raise their own typed errors).

FlowParameterError
├── CollectError     a collection request cannot run (bad suite, policy, profile, run)
└── TrainFlowError   the train flow's parameters select nothing to train on
"""

from __future__ import annotations


class FlowParameterError(Exception):
    """A flow or CLI parameter is wrong; the message names it."""

    def user_message(self) -> str:
        return str(self)


class CollectError(FlowParameterError):
    """A collection request cannot run (bad parameter, unknown suite, run or profile)."""


class TrainFlowError(FlowParameterError):
    """The train flow's parameters do not select anything to train on."""
