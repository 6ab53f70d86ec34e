"""Root filesystems for image jails, built without Docker and cached by content.

An `ImagePlan` (what a Harbor task's Dockerfile asks for, already mapped onto a Debian
release by `suites/harbor/dockerfile.py`) becomes a directory tree:

1. the **base**: `mmdebstrap --variant=minbase` of the release from Debian's package
   registry, plus `python3` (the jail's executor runs on the image's own interpreter) and
   the plan's extra packages; one per (release, packages), shared by every task on it;
2. the **image**: a copy of the base (`cp -a --reflink=auto`) with the plan's steps applied
   in order: `RUN` through `chroot` as root (a private mount namespace with `/proc`, the
   host's resolver, the network and the host's package-registry settings from
   `sandbox/host_registries.py`: the registries are reachable at build time, never from a
   jail), `COPY`/`ADD` from the build context on the host; then the mount targets every
   image jail needs (the workdir, `/tmp`, `/root`, `/tests`, `/logs`, `/opt/epiflow`, the
   executor's file) and the jail user (uid 1000) in its `/etc/passwd`.

Both are built once: a file lock per directory makes concurrent episodes (and processes)
wait for one build, which goes to a staging directory and is renamed into place. The image
directory is named by the plan's digest (Dockerfile steps, the bytes of every file they
copy, the base), and `image.json` beside its root records the digest, the substitutions
made (e.g. `ubuntu:24.04` → Debian trixie) and the build time. Building needs root.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.errors import EpiflowError
from sandbox.host_registries import (
    HOST_DIR,
    HostRegistries,
    host_apt_proxies,
    host_registries,
)
from sandbox.host_setup import JAIL_GID, JAIL_UID

BUILDER_VERSION = "1"
"""Bump when the builder's output changes: every digest changes with it."""
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3",)
"""Installed into every base: the executor and `uvx -p 3.13` need the image's Python."""
MOUNT_DIRS = (
    "tmp", "root", "var/tmp", "run", "solution", "tests", "logs", "opt/epiflow", ".epiflow",
    ".epiflow/tests",
)  # fmt: skip
"""Directories every image jail mounts something on (nsjail cannot create them in a read-only
root); part of every image's digest (`ImagePlan.digest`), so adding one rebuilds the images
(not the bases)."""

Release = Literal["bookworm", "trixie"]


class ImageBuildError(EpiflowError):
    """An image could not be built (mmdebstrap failed, a `RUN` step failed, not root)."""


class RunStep(BaseModel):
    """`RUN`: a shell command run as root in the image, in `workdir` with `env`."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["run"] = "run"
    line: int
    """Dockerfile line (for errors)."""
    command: str
    workdir: str
    env: dict[str, str] = Field(default_factory=dict)


class CopyStep(BaseModel):
    """`COPY`/`ADD`: context-relative sources copied to an absolute destination."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["copy"] = "copy"
    line: int
    sources: tuple[str, ...]
    """Paths relative to the build context (files or folders), already checked to exist."""
    dest: str
    """Absolute destination; ends with `/` when it is a folder."""


class MkdirStep(BaseModel):
    """`WORKDIR`: the folder is created (as Docker does)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["mkdir"] = "mkdir"
    line: int
    path: str


Step = RunStep | CopyStep | MkdirStep


class ImagePlan(BaseModel):
    """What to build: a release, extra packages, steps, and the image's final state."""

    model_config = ConfigDict(frozen=True)

    release: Release
    packages: tuple[str, ...] = ()
    """Extra Debian packages of the base (e.g. `python3-pip` when a step uses pip)."""
    steps: tuple[Step, ...] = ()
    context: str
    """Host folder of the build context."""
    workdir: str = "/"
    env: dict[str, str] = Field(default_factory=dict)
    python_links: bool = False
    """Link `/usr/local/bin/python{,3}` to the release's `python3` (a `python:*` base)."""
    substitutions: tuple[str, ...] = ()
    """What was mapped or ignored, one line each (recorded per episode)."""
    base_substitution: str | None = None
    """The base image built as another distribution, codename or Python version than its
    tag names, one line (`suites/harbor/bases.py` decides); None: built as named. Not part
    of the digest: it describes the base, which `release` and `packages` already pin."""
    source: str = "Dockerfile"
    """The Dockerfile (for messages)."""

    def base_key(self) -> str:
        text = json.dumps(
            [BUILDER_VERSION, self.release, sorted({*BASE_PACKAGES, *self.packages}), DEBIAN_MIRROR]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def digest(self) -> str:
        """sha256 of the base, the steps, the final state and every copied byte."""
        h = hashlib.sha256()
        h.update(self.base_key().encode())
        h.update(
            json.dumps(
                {
                    "steps": [s.model_dump(mode="json", exclude={"line"}) for s in self.steps],
                    "workdir": self.workdir,
                    "env": self.env,
                    "python_links": self.python_links,
                    "uid": JAIL_UID,
                    "mount_dirs": MOUNT_DIRS,
                },
                sort_keys=True,
            ).encode()
        )
        context = Path(self.context)
        for step in self.steps:
            if isinstance(step, CopyStep):
                for source in step.sources:
                    for path in _walk(context / source):
                        h.update(path.relative_to(context).as_posix().encode() + b"\0")
                        h.update(hashlib.sha256(path.read_bytes()).digest())
        return h.hexdigest()


class BuiltImage(BaseModel):
    """An image on disk."""

    model_config = ConfigDict(frozen=True)

    root: str
    """Its root filesystem (mount it read-only)."""
    digest: str
    release: Release
    substitutions: tuple[str, ...]
    build_s: float
    """Seconds the image's build took (recorded in `image.json`; see `cached`)."""
    cached: bool
    """True when it was already built (by an earlier call or a concurrent one)."""


def _walk(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
    elif path.is_dir():
        for child in sorted(path.rglob("*")):
            if child.is_file():
                yield child


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(argv: list[str], *, what: str, timeout_s: float, log: Path) -> None:
    try:
        with log.open("ab") as out:
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                timeout=timeout_s, check=False,
            )  # fmt: skip
    except FileNotFoundError as e:
        raise ImageBuildError(f"{what}: {argv[0]} is not installed ({e.strerror})") from e
    except subprocess.TimeoutExpired as e:
        raise ImageBuildError(f"{what}: did not finish within {timeout_s:g} s (log: {log})") from e
    if done.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise ImageBuildError(f"{what}: exit code {done.returncode}: {tail[0][:300]} (log: {log})")


def _check_root() -> None:
    if os.geteuid() != 0:
        raise ImageBuildError(
            "building Harbor task images needs root (mmdebstrap and chroot); run as root, as CI does"
        )


def ensure_base(plan: ImagePlan, images_dir: Path, *, timeout_s: float = 900) -> tuple[Path, float]:
    """The base root of `plan` (built when missing) and the seconds this call spent building."""
    folder = images_dir / f"base-{plan.release}-{plan.base_key()}"
    root = folder / "root"
    if root.is_dir():
        return root, 0.0
    _check_root()
    with _locked(images_dir / f".lock-base-{plan.base_key()}"):
        if root.is_dir():
            return root, 0.0
        started = time.perf_counter()
        staging = images_dir / f".staging-{uuid.uuid4().hex[:12]}"
        staging.mkdir(parents=True)
        log = staging / "build.log"
        packages = ",".join(sorted({*BASE_PACKAGES, *plan.packages}))
        try:
            _run(
                [
                    "mmdebstrap", "--variant=minbase", "--mode=root", f"--include={packages}",
                    '--aptopt=Acquire::Retries "3"', *[f"--aptopt={o}" for o in host_apt_proxies()],
                    plan.release, str(staging / "root"), DEBIAN_MIRROR,
                ],
                what=f"mmdebstrap {plan.release}",
                timeout_s=timeout_s,
                log=log,
            )  # fmt: skip
            staging.chmod(0o755)
            staging.rename(folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return root, time.perf_counter() - started


_RUN_WRAPPER = (
    'set -e; R="$1"; shift; mount -t proc proc "$R/proc"; '
    'cp -L /etc/resolv.conf "$R/etc/resolv.conf" 2>/dev/null || true; '
    "{mounts}"
    'exec chroot "$R" /usr/bin/env -i "$@"'
)


def _host_mounts(registries: HostRegistries, apt_conf: Path | None) -> str:
    """Shell lines (in the step's private mount namespace) binding the host's registry files
    read-only under `HOST_DIR` in the chroot (`sandbox/host_registries.py`)."""
    binds = list(registries.binds)
    if apt_conf is not None:
        binds.append((str(apt_conf), f"{HOST_DIR}/apt.conf"))
    if not binds:
        return ""
    top = _sh_quote(HOST_DIR)
    lines = [f'mkdir -p "$R"{top}; mount -t tmpfs -o mode=0755,size=1m epiflow-host "$R"{top}; ']
    for source, target in binds:
        inside = '"$R"' + _sh_quote(target)
        make = (
            f"mkdir -p {inside}"
            if Path(source).is_dir()
            else f'mkdir -p "$(dirname {inside})"; touch {inside}'
        )
        lines.append(
            f"{make}; mount --bind {_sh_quote(source)} {inside}; "
            f"mount -o remount,bind,ro {inside}; "
        )
    return "".join(lines)


def ensure_image(plan: ImagePlan, images_dir: Path, *, timeout_s: float = 900) -> BuiltImage:
    """The image of `plan`, built once per digest even when many callers ask at once.

    Raises:
        ImageBuildError: mmdebstrap or a step failed, the build timed out, or not root.
    """
    digest = plan.digest()
    folder = images_dir / f"img-{digest[:24]}"
    manifest = folder / "image.json"

    def built(cached: bool) -> BuiltImage:
        recorded = json.loads(manifest.read_text())
        return BuiltImage(
            root=str(folder / "root"), digest=digest, release=plan.release,
            substitutions=plan.substitutions, build_s=float(recorded.get("build_s", 0.0)),
            cached=cached,
        )  # fmt: skip

    if manifest.is_file():
        return built(True)
    _check_root()
    images_dir.mkdir(parents=True, exist_ok=True)
    images_dir.chmod(images_dir.stat().st_mode | 0o755)
    with _locked(images_dir / f".lock-img-{digest[:24]}"):
        if manifest.is_file():
            return built(True)
        started = time.perf_counter()
        base, _ = ensure_base(plan, images_dir, timeout_s=timeout_s)
        staging = images_dir / f".staging-{uuid.uuid4().hex[:12]}"
        staging.mkdir()
        log = staging / "build.log"
        root = staging / "root"
        try:
            _run(
                ["cp", "-a", "--reflink=auto", str(base), str(root)],
                what="copy base",
                timeout_s=timeout_s,
                log=log,
            )
            registries = (
                host_registries()
                if any(isinstance(s, RunStep) for s in plan.steps)
                else HostRegistries()
            )
            if registries.apt_conf:
                (staging / "apt.conf").write_text(registries.apt_conf)
            for step in plan.steps:
                _apply(step, plan, root, log=log, timeout_s=timeout_s, registries=registries)
            _finish(plan, root)
            (staging / "image.json").write_text(
                json.dumps(
                    {
                        "digest": digest, "release": plan.release, "source": plan.source,
                        "substitutions": list(plan.substitutions), "workdir": plan.workdir,
                        "env": plan.env, "build_s": round(time.perf_counter() - started, 3),
                    },
                    indent=2,
                )
            )  # fmt: skip
            staging.chmod(0o755)
            staging.rename(folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return built(False)


def _inside(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _apply(
    step: Step,
    plan: ImagePlan,
    root: Path,
    *,
    log: Path,
    timeout_s: float,
    registries: HostRegistries,
) -> None:
    where = f"{plan.source}:{step.line}"
    if isinstance(step, MkdirStep):
        _inside(root, step.path).mkdir(parents=True, exist_ok=True)
    elif isinstance(step, CopyStep):
        context = Path(plan.context)
        many = len(step.sources) > 1 or step.dest.endswith("/")
        for source in step.sources:
            src = context / source
            if src.is_dir():
                shutil.copytree(src, _inside(root, step.dest), dirs_exist_ok=True, symlinks=True)
            else:
                target = _inside(root, step.dest)
                if many or target.is_dir():
                    target = target / src.name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
    else:
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "DEBIAN_FRONTEND": "noninteractive",
            "PIP_BREAK_SYSTEM_PACKAGES": "1",
            "PIP_ROOT_USER_ACTION": "ignore",
            **registries.env,
            **step.env,
        }
        _inside(root, step.workdir).mkdir(parents=True, exist_ok=True)
        command = f"cd {_sh_quote(step.workdir)} && {step.command}"
        apt_conf = log.parent / "apt.conf"
        wrapper = _RUN_WRAPPER.format(
            mounts=_host_mounts(registries, apt_conf if registries.apt_conf else None)
        )
        try:
            _run(
                [
                    "unshare", "--mount", "--fork", "--propagation", "private", "sh", "-c", wrapper,
                    "sh", str(root), *[f"{k}={v}" for k, v in env.items()], "/bin/sh", "-c", command,
                ],
                what=f"{where}: RUN",
                timeout_s=timeout_s,
                log=log,
            )  # fmt: skip
        finally:
            with contextlib.suppress(OSError):
                _inside(root, HOST_DIR).rmdir()
        resolv = root / "etc" / "resolv.conf"
        if resolv.is_file() and not resolv.is_symlink():
            resolv.unlink()


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _finish(plan: ImagePlan, root: Path) -> None:
    for rel in MOUNT_DIRS:
        (root / rel).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    _inside(root, plan.workdir).mkdir(parents=True, exist_ok=True)
    executor = root / ".epiflow" / "executor.py"
    executor.touch()
    executor.chmod(0o444)
    if plan.python_links:
        local = root / "usr" / "local" / "bin"
        local.mkdir(parents=True, exist_ok=True)
        for name in ("python", "python3"):
            link = local / name
            if not link.exists() and not link.is_symlink():
                link.symlink_to("/usr/bin/python3")
    passwd, group = root / "etc" / "passwd", root / "etc" / "group"
    if passwd.is_file() and f":x:{JAIL_UID}:" not in passwd.read_text():
        with passwd.open("a") as out:
            out.write(f"agent:x:{JAIL_UID}:{JAIL_GID}:agent:/root:/bin/bash\n")
    if group.is_file() and f":x:{JAIL_GID}:" not in group.read_text():
        with group.open("a") as out:
            out.write(f"agent:x:{JAIL_GID}:\n")
    root.chmod(0o755)
