"""One nsjail jail per episode, four tools, limits, fault injection (see docs/sandbox.md).

The names below are imported on first use (PEP 562): `sandbox.tool_specs`, which the
protocol parser needs, must not pull in the jail, its settings and the warm pool
(`epiflow protocol parse` starts at once).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.errors import (
        EpisodeHardTimeout,
        SandboxCrashed,
        SandboxError,
        SandboxUnavailable,
    )
    from sandbox.factory import open_sandbox, sandbox_opener
    from sandbox.faults import FaultProfile
    from sandbox.interface import Sandbox
    from sandbox.nsjail_sandbox import NsjailSandbox
    from sandbox.pool import WarmPool, pooled_opener
    from sandbox.settings import SandboxSettings
    from sandbox.spec import SandboxSpec
    from sandbox.transfer import ExportReport, TransferError, files_from_dir

_MODULE_OF = {
    "NsjailSandbox": "sandbox.nsjail_sandbox",
    "EpisodeHardTimeout": "sandbox.errors",
    "SandboxCrashed": "sandbox.errors",
    "SandboxError": "sandbox.errors",
    "SandboxUnavailable": "sandbox.errors",
    "open_sandbox": "sandbox.factory",
    "sandbox_opener": "sandbox.factory",
    "FaultProfile": "sandbox.faults",
    "Sandbox": "sandbox.interface",
    "WarmPool": "sandbox.pool",
    "pooled_opener": "sandbox.pool",
    "SandboxSettings": "sandbox.settings",
    "SandboxSpec": "sandbox.spec",
    "ExportReport": "sandbox.transfer",
    "TransferError": "sandbox.transfer",
    "files_from_dir": "sandbox.transfer",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
    "sandbox_opener",
]
