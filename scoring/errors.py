"""Scoring errors. A judge's unparseable answer is data (`Judgement.parsed = False`), not an error.

ScoringError
├── ScoringConfigError        settings that contradict each other (e.g. shaping above 5%)
└── JudgeError
    ├── JudgeUnavailable      the judge endpoint could not be reached or answered non-2xx
    └── JudgeResponseInvalid  the endpoint answered, but not in the chat-completions shape
"""

from __future__ import annotations

from core.errors import EpiflowError


class ScoringError(EpiflowError):
    """Base class of every scoring failure."""


class ScoringConfigError(ScoringError, ValueError):
    """Scoring settings that cannot be used together."""


class JudgeError(ScoringError):
    """The LLM judge could not produce an answer to parse."""


class JudgeUnavailable(JudgeError):
    """Transport failure or non-2xx status from the judge endpoint (retryable)."""


class JudgeResponseInvalid(JudgeError):
    """The endpoint's HTTP body is not a chat-completions response with a text answer."""
