"""nsjail argv for a jail chrooted into a prebuilt image (`SandboxSpec.image`).

The same namespaces, user mapping, seccomp policy and limits as the toolchain jail
(`sandbox/nsjail.py`); what differs is the filesystem: the image's root read-only as `/`
(its own `/etc`, its own `python3` runs the executor, from source since the host's bytecode
is for the host's interpreter), a per-episode tmpfs at the task's workdir (the tools' root
and the cwd), tmpfs `/tmp` and the image's other writable paths, the extra read-only binds
of `ImageMount.binds_ro`, `/dev` nodes and a private `/proc`. No network interface but the
jail's own loopback when the spec asks for it (`network = "loopback"`, as a container has
its own `lo`); never the host's.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from sandbox.host import EXECUTOR_SOURCE
from sandbox.host_setup import EXECUTOR_DIR_IN_JAIL, JAIL_GID, JAIL_UID, HostSetup
from sandbox.image_spec import ImageMount
from sandbox.nsjail import MIB, SECCOMP_POLICY, identity_and_limits
from sandbox.settings import SandboxSettings
from sandbox.spec import SandboxSpec
from sandbox.transfer import WorkdirShape, shape_from_dir

EXECUTOR_IN_IMAGE = f"{EXECUTOR_DIR_IN_JAIL}/executor.py"
"""Where the executor's source appears in an image jail (the image build creates the file)."""


def executor_source(settings: SandboxSettings) -> Path:
    """The executor's source in the state dir (content-addressed, world-readable, mountable)."""
    data = EXECUTOR_SOURCE.read_bytes()
    target = settings.state_dir / f"executor-src-{hashlib.sha256(data).hexdigest()[:16]}.py"
    if target.is_file():
        return target
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    staging = settings.state_dir / f".executor-src-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    staging.write_bytes(data)
    staging.chmod(0o444)
    staging.replace(target)
    return target


def image_env(spec: SandboxSpec, image: ImageMount, env: Mapping[str, str]) -> dict[str, str]:
    """The image's `ENV`, then the jail's variables; `HOME` is `/root`, as in a container;
    `PATH` is the spec's when it sets one, else the image's, else the jail's default."""
    out = dict(image.env)
    out.update(env)
    out["HOME"] = "/root"
    path = spec.env.get("PATH") or image.env.get("PATH")
    if path:
        out["PATH"] = path
    return out


def image_nsjail_argv(
    spec: SandboxSpec,
    host: HostSetup,
    settings: SandboxSettings,
    *,
    env: Mapping[str, str],
    time_limit_s: float,
) -> list[str]:
    """The nsjail command line of an executor jail chrooted into `spec.image`."""
    image = spec.image
    if image is None:
        raise ValueError("image_nsjail_argv needs a spec with an image")
    inodes = spec.inodes
    config = {
        "env": image_env(spec, image, env),
        "kill_background": spec.kill_background,
        "max_tracked_files": settings.max_tracked_files,
        "preload": list(settings.verifier_preload),
        "workspace": image.workdir,
    }
    argv = [
        str(host.nsjail),
        "--mode", "o",
        "--really_quiet",
        "--hostname", "sandbox",
        "--chroot", image.root,
        "--cwd", image.workdir,
        *identity_and_limits(spec, host, settings, time_limit_s=time_limit_s),
        "--bindmount_ro", f"{executor_source(settings)}:{EXECUTOR_IN_IMAGE}",
        "--bindmount", "/dev/null",
        "--bindmount", "/dev/zero",
        "--bindmount_ro", "/dev/urandom",
        "--bindmount_ro", "/dev/random",
        "--mount",
        f"none:{image.workdir}:tmpfs:size={spec.workspace_mib * MIB},nr_inodes={inodes},"
        f"mode=0755,uid={JAIL_UID},gid={JAIL_GID}",
    ]  # fmt: skip
    for path in image.writable:
        argv += [
            "--mount",
            f"none:{path}:tmpfs:size={spec.tmpfs_mib * MIB},nr_inodes={inodes},mode=1777",
        ]
    for source, target in image.binds_ro:
        argv += ["--bindmount_ro", f"{source}:{target}"]
    argv += ["--seccomp_string", SECCOMP_POLICY]
    if spec.network == "none":
        argv.append("--iface_no_lo")
    command = [image.python, "-I", "-S", "-B", EXECUTOR_IN_IMAGE, json.dumps(config)]
    return [*argv, "--", *command]


def workdir_seed(image: ImageMount, *, max_bytes: int) -> dict[str, bytes]:
    """The image's own files under its workdir (what `COPY`/`RUN` put there), relative paths
    → bytes: the per-episode workdir tmpfs starts as a copy of them. Symlinks are skipped.

    Raises:
        TransferError: they exceed `max_bytes`.
    """
    from sandbox.errors import TransferError

    base = Path(image.root) / image.workdir.lstrip("/")
    files: dict[str, bytes] = {}
    total = 0
    if not base.is_dir() or base.is_symlink():
        return files
    for folder, dirs, names in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not (Path(folder) / d).is_symlink())
        for name in sorted(names):
            path = Path(folder) / name
            if path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            total += len(data)
            if total > max_bytes:
                raise TransferError(
                    f"the image's {image.workdir} holds more than {max_bytes} bytes"
                )
            files[path.relative_to(base).as_posix()] = data
    return files


def workdir_shape(image: ImageMount, *, limit: int) -> WorkdirShape:
    """The folders, symlinks and permission bits of the image's own workdir (what
    `workdir_seed`'s bytes leave out: an executable `COPY`'d script stays executable, an
    empty folder stays), at most `limit` entries of each kind."""
    return shape_from_dir(Path(image.root) / image.workdir.lstrip("/"), limit=limit)
