"""Errors of a collection request (the packages below raise their own typed errors).

CollectError     a collection request cannot run: bad parameter, unknown suite, template,
                 policy, fault profile or run
"""

from __future__ import annotations

from core.errors import EpiflowError


class CollectError(EpiflowError):
    """A collection request cannot run; the message names the parameter to fix."""
