"""Errors of a collection request (the packages below raise their own typed errors).

CollectError     a collection request cannot run (a shard that never completed, a run
│                started more often than its retries allow)
└── RequestError a request that is invalid as given: bad parameter, unknown suite,
                 template, policy or fault profile; never retried
"""

from __future__ import annotations

from core.errors import EpiflowError


class CollectError(EpiflowError):
    """A collection request cannot run; the message names the parameter to fix."""


class RequestError(CollectError):
    """The request is invalid as given (it fails the same way every time: not retried)."""

    retryable = False
