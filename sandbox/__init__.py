"""One nsjail jail per episode, four tools, limits, fault injection (see docs/sandbox.md)."""

from sandbox.errors import EpisodeHardTimeout, SandboxCrashed, SandboxError, SandboxUnavailable
from sandbox.factory import open_sandbox
from sandbox.faults import FaultProfile
from sandbox.interface import Sandbox
from sandbox.nsjail_sandbox import NsjailSandbox
from sandbox.pool import WarmPool, pooled_opener
from sandbox.settings import SandboxSettings
from sandbox.spec import SandboxSpec
from sandbox.transfer import ExportReport, TransferError, files_from_dir

__all__ = [
    "EpisodeHardTimeout",
    "ExportReport",
    "FaultProfile",
    "NsjailSandbox",
    "Sandbox",
    "SandboxCrashed",
    "SandboxError",
    "SandboxSettings",
    "SandboxSpec",
    "SandboxUnavailable",
    "TransferError",
    "WarmPool",
    "files_from_dir",
    "open_sandbox",
    "pooled_opener",
]
