"""Sandbox errors. A failed *command* is a `ToolResult`; these mean the sandbox itself failed.

SandboxError
├── SandboxUnavailable      nsjail missing or cannot start (no user namespaces, bad spec)
├── SandboxCrashed          the in-jail executor died mid-episode (→ episode `env_error`)
├── EpisodeHardTimeout      the episode's hard timeout fired; the jail was killed (→ `timeout`)
└── TransferError           workspace files in or out: a path that would escape, over the size cap
"""

from __future__ import annotations

from core.errors import EpiflowError


class SandboxError(EpiflowError):
    """Base class of every sandbox failure that is not a command's own failure."""


class SandboxUnavailable(SandboxError):
    """The jail could not be started: no nsjail binary, no user namespaces, invalid spec."""


class SandboxCrashed(SandboxError):
    """The jail or its executor died while the episode was running."""


class EpisodeHardTimeout(SandboxError):
    """The episode passed its hard timeout; the jail has been killed."""


class TransferError(SandboxError):
    """Files could not be copied into or out of a workspace (unsafe path, over the size cap)."""
