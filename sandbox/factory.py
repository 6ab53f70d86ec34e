"""`open_sandbox`: a fresh jail for one episode, started, populated, clock running;
`sandbox_opener`: it bound to the entry point's settings, as the episode loop takes it."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from sandbox.faults import FaultProfile
from sandbox.host import prepare_host
from sandbox.host_setup import HostSetup
from sandbox.jail import Jail
from sandbox.nsjail import executor_argv, jail_env, nsjail_argv
from sandbox.nsjail_sandbox import NsjailSandbox
from sandbox.settings import SandboxSettings
from sandbox.spec import SandboxSpec
from sandbox.transfer import WorkdirShape, normalize_files

#: nsjail's own time limit is a backstop behind the host's timer: hard timeout + this.
_TIME_LIMIT_MARGIN_S = 60.0


@functools.lru_cache(maxsize=64)
def _jail_argv(
    spec: SandboxSpec,
    host: HostSetup,
    settings: SandboxSettings,
    env: tuple[tuple[str, str], ...],
) -> tuple[str, ...]:
    # Cached: building it stats the toolchain and encodes the config (~0.25 ms per jail).
    time_limit_s = spec.hard_timeout_s + settings.pool_max_idle_s + _TIME_LIMIT_MARGIN_S
    if spec.image is not None:  # a Harbor task's environment: chroot into its image
        from sandbox.image_jail import image_nsjail_argv

        return tuple(
            image_nsjail_argv(spec, host, settings, env=dict(env), time_limit_s=time_limit_s)
        )
    return tuple(
        nsjail_argv(
            spec,
            host,
            settings,
            command=executor_argv(spec, host, settings, dict(env)),
            time_limit_s=spec.hard_timeout_s + settings.pool_max_idle_s + _TIME_LIMIT_MARGIN_S,
        )
    )


async def start_jail(spec: SandboxSpec, host: HostSetup, settings: SandboxSettings) -> Jail:
    """Start one jail for `spec` with its executor ready (no episode yet).

    Raises:
        SandboxUnavailable: the jail could not start.
    """
    # The environment is part of the key: allow-listed host variables are read every time.
    argv = list(_jail_argv(spec, host, settings, tuple(jail_env(spec).items())))
    cgroup_parents: tuple[Path, ...] = ()
    if host.limit_mode == "cgroup_v1":
        root, parent = settings.cgroup_root, settings.cgroup_parent
        cgroup_parents = (root / "memory" / parent, root / "pids" / parent)
    return await Jail.start(
        argv, start_timeout_s=settings.start_timeout_s, cgroup_parents=cgroup_parents
    )


async def activate(
    jail: Jail,
    spec: SandboxSpec,
    host: HostSetup,
    settings: SandboxSettings,
    *,
    files: Mapping[str, str | bytes] | None,
    faults: FaultProfile | None,
    fault_seed: int,
    shape: WorkdirShape | None = None,
) -> NsjailSandbox:
    """Turn a started jail into an episode: populate the workspace (its files, then the
    folders, links and permission bits of `shape`), start the clock."""
    box = NsjailSandbox(jail, spec, host, settings, faults=faults, fault_seed=fault_seed)
    try:
        if files or (shape is not None and not shape.is_empty()):
            await box.populate(files or {}, shape=shape)
    except BaseException:
        await box.close()
        raise
    box.start_clock()
    return box


async def open_sandbox(
    spec: SandboxSpec,
    *,
    files: Mapping[str, str | bytes] | None = None,
    faults: FaultProfile | None = None,
    fault_seed: int = 0,
    settings: SandboxSettings,
) -> NsjailSandbox:
    """A started sandbox on a fresh jail, `files` written under /workspace, configured by
    the entry point's `settings`.

    Raises:
        SandboxUnavailable: nsjail is missing or cannot start a jail here.
        TransferError: a file path would leave the workspace, or the files are too large.
    """
    shape: WorkdirShape | None = None
    if spec.image is not None:  # the workdir tmpfs starts as a copy of the image's workdir
        from sandbox.image_jail import workdir_seed, workdir_shape

        seed = workdir_seed(spec.image, max_bytes=settings.populate_max_bytes)
        shape = workdir_shape(spec.image, limit=settings.max_tracked_files)
        files = {**seed, **(files or {})}
    if files:
        normalize_files(files, max_bytes=settings.populate_max_bytes)  # fail before starting a jail
    host = await prepare_host(settings)
    jail = await start_jail(spec, host, settings)
    return await activate(
        jail, spec, host, settings, files=files, faults=faults, fault_seed=fault_seed,
        shape=shape,
    )  # fmt: skip


def sandbox_opener(settings: SandboxSettings) -> Callable[..., Awaitable[NsjailSandbox]]:
    """`open_sandbox` with the entry point's `settings`: the opener `agent.loop.run_episode`
    takes (`(spec, *, files=…, faults=…, fault_seed=…) -> NsjailSandbox`)."""
    return functools.partial(open_sandbox, settings=settings)
