"""Preflight: everything a collection needs is checked before anything is written.

A misconfigured sandbox, a read-only database or a full object store would otherwise show
up as a run whose every episode is `env_error` or `storage_error`. `open_collection(...,
preflight=True)` opens the collection (policy, schema, object store) and then runs
`preflight_checks`, in order, each with a one-line error naming the setting to fix:

- the sandbox: the nsjail binary, the interpreter and state dir jails mount, the cgroup
  policy, and one real probe jail (the sandbox's own `prepare_host`);
- the database takes writes (a read-only file, mount or role fails here);
- the object store takes a write of `PROBE_BYTES` (a full disk fails here; the probe is
  deleted);
- the policy answers: an `openai:` endpoint gives a 1-token completion within
  `EPIFLOW_AGENT_POLICY_PREFLIGHT_TIMEOUT_S` (`check_policy`; nothing listening, an HTTP
  error or an HTML page fails here in one line naming the URL, not as a run of
  `endpoint_error`s).

A new check is one more step of `preflight_checks`. The run key's lock is taken after
them, by `open_collection`, and held until the collection closes.

The Prefect API is the entry point's to check (`orchestration.prefect.apply_prefect_settings`):
nothing here imports Prefect.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox.errors import SandboxUnavailable
from sandbox.host import find_nsjail, prepare_host
from sandbox.settings import SandboxSettings
from storage.errors import ObjectStoreError, ObjectStoreUnavailable
from storage.objects import ObjectStore
from storage.runs import check_writable

if TYPE_CHECKING:
    from agent.policies.base import Policy
    from agent.settings import PolicySettings
    from collection.lifecycle import Collection

PROBE_BYTES = 64 << 10
"""Bytes the object-store probe writes: enough that a full disk refuses it."""


@dataclass(frozen=True)
class SandboxCheck:
    """What the sandbox preflight found."""

    nsjail: str
    """The nsjail binary in use."""
    limit_mode: str
    """`cgroup_v1`, `cgroup_v2` or `rlimit`."""


async def check_sandbox(settings: SandboxSettings) -> SandboxCheck:
    """Find nsjail and start one probe jail with the configured limits.

    Raises:
        SandboxUnavailable: a jail cannot start here; the message names the setting.
    """
    try:
        find_nsjail(settings)
        host = await prepare_host(settings)
    except SandboxUnavailable as e:
        # The error names its setting where it was raised (sandbox/host.py); the binary is
        # the likeliest culprit of one that names none.
        setting = e.setting or SandboxSettings.variable("nsjail_path")
        raise SandboxUnavailable(f"sandbox: {e}", setting=setting) from e
    except OSError as e:  # the state dir cannot be created or written
        raise SandboxUnavailable(
            f"sandbox: cannot prepare the jails' host files in {settings.state_dir}: "
            f"{e.strerror or e}",
            setting=SandboxSettings.variable("state_dir"),
        ) from e
    return SandboxCheck(nsjail=str(host.nsjail), limit_mode=host.limit_mode)


def check_object_store(store: ObjectStore) -> None:
    """Write and delete one probe object of `PROBE_BYTES`.

    Raises:
        ObjectStoreError: the store refuses it (full disk, no permission, bucket missing).
    """
    key = f"preflight/probe-{uuid.uuid4().hex}"
    try:
        store.put(key, b"\0" * PROBE_BYTES)
    except ObjectStoreError as e:
        cause = e.__cause__
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(e)
        raise ObjectStoreUnavailable(
            f"the object store {store.location} cannot take a {PROBE_BYTES >> 10} KiB write: "
            f"{reason}",
            setting=e.setting,
        ) from e
    store.delete(key)


async def check_policy(policy: Policy, settings: PolicySettings) -> str | None:
    """Probe the policy's endpoint, when it has one; returns the model that answered.

    Raises:
        EndpointError: the endpoint gave no completion in time (one line naming the URL).
    """
    return await policy.probe(deadline_s=settings.preflight_timeout_s)


async def preflight_checks(collection: Collection) -> None:
    """Check, in order, that the collection can run and write; nothing is written.

    Raises:
        SandboxUnavailable: no jail can start with these sandbox settings.
        StorageError: the database or object store cannot be written.
        EndpointError: the policy's model endpoint does not answer.
    """
    await check_sandbox(collection.settings.sandbox)
    await asyncio.to_thread(check_writable, collection.engine)
    await asyncio.to_thread(check_object_store, collection.store)
    await check_policy(collection.policy, collection.settings.policy)
