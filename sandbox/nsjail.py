"""`SandboxSpec` → nsjail argv.

The jail is built from nothing: nsjail's read-only tmpfs root, the toolchain bound
read-only, a synthetic `/etc`, `/dev/{null,zero,random,urandom}`, a private `/proc`,
tmpfs `/tmp` and `/workspace`, the executor script. New user, PID, mount, network, IPC,
UTS and cgroup namespaces; the jail user (uid 1000) maps to an unprivileged host uid;
no capabilities, no new privileges, a seccomp deny-list; memory and pids limited by
cgroups when the host allows it, by rlimits otherwise.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

from sandbox.host_setup import JAIL_GID, JAIL_UID, HostSetup
from sandbox.settings import SandboxSettings
from sandbox.spec import SandboxSpec

_DENIED_SYSCALLS = (
    # other processes' memory and kernel objects
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "userfaultfd", "perf_event_open", "bpf",
    # namespaces and mounts (the jail's own are set up before this filter applies)
    "mount", "umount", "unshare", "setns", "pivot_root", "chroot",
    "fsopen", "fsmount", "fsconfig", "fspick", "move_mount", "open_tree", "mount_setattr",
    # keyrings, kernel modules, host-wide state
    "keyctl", "add_key", "request_key", "init_module", "finit_module", "delete_module",
    "kexec_load", "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "iopl", "ioperm",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
    # io_uring: a second syscall surface that seccomp cannot filter (the ring's operations
    # never pass through it) and a steady source of kernel privilege escalations
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)  # fmt: skip
#: CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET: clone() may not make namespaces.
_CLONE_NAMESPACE_FLAGS = 0x7E020000

SECCOMP_POLICY = (
    "POLICY epiflow { "
    f"ERRNO(1) {{ {', '.join(_DENIED_SYSCALLS)} }}, "
    # clone3 passes its flags in memory seccomp cannot read: make libc fall back to clone.
    "ERRNO(38) { clone3 }, "
    f"ERRNO(1) {{ clone {{ (clone_flags & {_CLONE_NAMESPACE_FLAGS:#x}) != 0 }} }} "
    "} USE epiflow DEFAULT ALLOW"
)

#: Base environment of every command; the spec's allow-list and extras are added to it.
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
    "HOME": "/workspace",
    "USER": "agent",
    "LOGNAME": "agent",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
}

MIB = 1 << 20


def jail_env(spec: SandboxSpec, host_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment commands see: base, allow-listed host variables, the spec's extras."""
    source = os.environ if host_env is None else host_env
    env = dict(BASE_ENV)
    for name in spec.env_allow:
        if name in source:
            env[name] = source[name]
    env.update(spec.env)
    return env


def _toolchain_mounts(settings: SandboxSettings) -> list[str]:
    args: list[str] = []
    for path in settings.toolchain_paths:
        host_path = Path(path)
        if host_path.is_symlink():
            args += ["--symlink", f"{host_path.readlink()}:{path}"]
        elif host_path.is_dir():
            args += ["--bindmount_ro", path]
    return args


def _limit_args(spec: SandboxSpec, host: HostSetup, settings: SandboxSettings) -> list[str]:
    if host.limit_mode == "rlimit":
        return [
            "--rlimit_as", str(spec.memory_mib),
            "--rlimit_nproc", str(spec.pids),
        ]  # fmt: skip
    # CPUs are limited by affinity (--max_cpus) only: a cpu cgroup costs ~1.5 ms per start.
    args = [
        "--rlimit_as", "inf",
        "--cgroup_mem_max", str(spec.memory_mib * MIB),
        "--cgroup_pids_max", str(spec.pids),
    ]  # fmt: skip
    if host.limit_mode == "cgroup_v2":
        return [*args, "--use_cgroupv2", "--cgroupv2_mount", str(settings.cgroup_root)]
    root, parent = settings.cgroup_root, settings.cgroup_parent
    return [
        *args,
        "--cgroup_mem_mount", str(root / "memory"), "--cgroup_mem_parent", parent,
        "--cgroup_pids_mount", str(root / "pids"), "--cgroup_pids_parent", parent,
    ]  # fmt: skip


def identity_and_limits(
    spec: SandboxSpec, host: HostSetup, settings: SandboxSettings, *, time_limit_s: float
) -> list[str]:
    """The arguments every jail shares, toolchain or image: who it runs as, its wall-clock
    limit, CPUs, rlimits and cgroup limits."""
    return [
        "--user", f"{JAIL_UID}:{settings.outside_uid}:1",
        "--group", f"{JAIL_GID}:{settings.outside_gid}:1",
        "--time_limit", str(max(1, math.ceil(time_limit_s))),
        "--max_cpus", str(spec.cpus),
        "--nice_level", "0",
        "--rlimit_core", "0",
        "--rlimit_cpu", str(math.ceil(spec.hard_timeout_s * spec.cpus) + 1),
        "--rlimit_fsize", str(max(spec.workspace_mib, spec.tmpfs_mib)),
        "--rlimit_nofile", "1024",
        "--rlimit_stack", "soft",
        *_limit_args(spec, host, settings),
    ]  # fmt: skip


def nsjail_argv(
    spec: SandboxSpec,
    host: HostSetup,
    settings: SandboxSettings,
    *,
    command: list[str],
    time_limit_s: float,
) -> list[str]:
    """The nsjail command line that runs `command` in a jail built from `spec`."""
    inodes = spec.inodes
    argv = [
        str(host.nsjail),
        "--mode", "o",
        "--really_quiet",
        "--hostname", "sandbox",
        "--cwd", "/workspace",
        *identity_and_limits(spec, host, settings, time_limit_s=time_limit_s),
        *_toolchain_mounts(settings),
        "--bindmount_ro", f"{host.etc_dir}:/etc",
        "--bindmount_ro", f"{host.executor}:{host.executor_in_jail}",
        "--bindmount", "/dev/null",
        "--bindmount", "/dev/zero",
        "--bindmount_ro", "/dev/urandom",
        "--bindmount_ro", "/dev/random",
        "--symlink", "/proc/self/fd:/dev/fd",
        "--symlink", "/proc/self/fd/0:/dev/stdin",
        "--symlink", "/proc/self/fd/1:/dev/stdout",
        "--symlink", "/proc/self/fd/2:/dev/stderr",
        "--mount", f"none:/tmp:tmpfs:size={spec.tmpfs_mib * MIB},nr_inodes={inodes},mode=1777",
        "--mount",
        f"none:/workspace:tmpfs:size={spec.workspace_mib * MIB},nr_inodes={inodes},"
        f"mode=0755,uid={JAIL_UID},gid={JAIL_GID}",
        "--seccomp_string", SECCOMP_POLICY,
    ]  # fmt: skip
    if spec.network == "none":
        argv.append("--iface_no_lo")
    return [*argv, "--", *command]


def executor_argv(
    spec: SandboxSpec, host: HostSetup, settings: SandboxSettings, env: Mapping[str, str]
) -> list[str]:
    """The in-jail command that starts the executor with its configuration."""
    config = {
        "env": dict(env),
        "kill_background": spec.kill_background,
        "max_tracked_files": settings.max_tracked_files,
        "preload": list(settings.verifier_preload),
    }
    return [settings.python_path, "-I", "-S", "-B", host.executor_in_jail, json.dumps(config)]


def probe_argv(host: HostSetup, settings: SandboxSettings) -> list[str]:
    """A jail from the default spec that runs `python3 -c pass` (host capability probe)."""
    spec = SandboxSpec(memory_mib=512, tmpfs_mib=16, workspace_mib=16)
    return nsjail_argv(
        spec,
        host,
        settings,
        command=[settings.python_path, "-I", "-S", "-c", "pass"],
        time_limit_s=30,
    )
