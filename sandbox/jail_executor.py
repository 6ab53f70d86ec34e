"""The in-jail executor: PID 1 of every episode jail, run by the jail's own `python3`.

It is bind-mounted read-only into the jail and started by nsjail with the jail's stdin and
stdout as its command channel: frames of a 4-byte big-endian length followed by a JSON
object, one request and one response at a time. It serves `exec` (spawn one command with a
timeout, output caps and rusage), the file tools and the workspace bookkeeping (change
tracking, population, export), all as the unprivileged jail user and all inside the
jail, so a hostile path can at worst reach the jail's own read-only root.

Why it is written the way it is:
  * Standalone, stdlib only, no `json`/`signal`/`hashlib` imports: those cost ~15 ms of
    start-up, and a cold jail must start in ~25 ms. The C halves (`_json`, `_signal`,
    `_sha256`) are enough.
  * It is PID 1 of the jail's PID namespace: the kernel only delivers signals to it for
    which it installed a handler, so it resets Python's SIGINT handler and installs none;
    `kill -9 -1` from a command then kills every other process in the jail but not it.
  * It makes itself non-dumpable so that a command (same uid) cannot open `/proc/1/fd/1`
    and forge frames on the host channel, nor read its memory.
  * It exits when its stdin reaches EOF (the host died or closed the episode); as PID 1,
    its exit makes the kernel kill everything left in the jail.
"""

from __future__ import annotations

import _json
import _signal  # type: ignore[import-not-found]
import binascii
import os
import select
import sys
import time

try:
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]  # Python <= 3.11
except ImportError:  # pragma: no cover - newer interpreters renamed the module
    from _sha2 import sha256 as _sha256  # type: ignore[import-not-found, no-redef, unused-ignore]

TYPE_CHECKING = False  # `typing` costs start-up time; mypy treats this name as True
if TYPE_CHECKING:
    from typing import Any

    Obj = dict[str, Any]

WORKSPACE = "/workspace"
READ_CHUNK = 65536
MAX_FRAME = 512 * 1024 * 1024
#: A command that has exited but left a writer holding its pipes gets this long to finish.
DRAIN_GRACE_S = 0.1

_IS_INIT = os.getpid() == 1


class _JsonContext:
    """The attributes `_json.make_scanner` reads; the `json` package itself is too slow to import."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict[str, object] = {}  # noqa: RUF012 - read by the C scanner

    @staticmethod
    def parse_constant(name: str) -> float:
        return float(name.lower().replace("infinity", "inf"))


_scan = _json.make_scanner(_JsonContext())  # type: ignore[arg-type]  # duck-typed context
_quote = _json.encode_basestring_ascii


def decode_json(text: str) -> object:
    obj, end = _scan(text, 0)
    if text[end:].strip():
        raise ValueError("trailing data after JSON value")
    return obj


def encode_json(value: object) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ",".join(_quote(str(k)) + ":" + encode_json(v) for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(encode_json(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__}")


def b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def unb64(text: str) -> bytes:
    return binascii.a2b_base64(text)


# --- channel -------------------------------------------------------------------------


def read_exact(fd: int, n: int) -> bytes | None:
    parts = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_frame() -> object | None:
    header = read_exact(0, 4)
    if header is None:
        return None
    size = int.from_bytes(header, "big")
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is over the limit")
    body = read_exact(0, size)
    if body is None:
        return None
    return decode_json(body.decode("utf-8"))


def write_frame(value: object) -> None:
    body = encode_json(value).encode("ascii")
    data = len(body).to_bytes(4, "big") + body
    view = memoryview(data)
    while view:
        written = os.write(1, view)
        view = view[written:]


# --- processes -----------------------------------------------------------------------


def kill_everything_else() -> None:
    """Kill every process in the jail but this one (only meaningful as PID 1); reaps nothing."""
    if _IS_INIT:
        try:
            os.kill(-1, _signal.SIGKILL)
        except ProcessLookupError:
            pass


def reap_orphans() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class _Stream:
    """One output pipe of a command, read to EOF but kept only up to `cap` bytes."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd = fd
        self.cap = cap
        self.data = bytearray()
        self.total = 0

    def read(self) -> bool:
        """Read what is there; False at EOF."""
        try:
            chunk = os.read(self.fd, READ_CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        self.total += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        return True


def run_command(req: Obj, config: Obj) -> Obj:
    argv = [str(a) for a in req["argv"]]
    timeout_s = float(req["timeout_s"])
    cap = int(req["cap"])
    stdin_data = unb64(req["stdin"]) if req.get("stdin") is not None else None
    kill_background = bool(req.get("kill_background", config.get("kill_background", True)))
    env = req.get("env") or config["env"]

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    if stdin_data is None:
        in_r, in_w = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC), -1
    else:
        in_r, in_w = os.pipe()
    start = time.monotonic()
    try:
        pid = os.posix_spawnp(
            argv[0],
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, in_r, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
            ],
            setsid=True,
            # Python ignores these in the executor; a command must see the defaults.
            setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGINT),
        )
    except OSError as e:
        for fd in (out_r, out_w, err_r, err_w, in_r, in_w):
            if fd >= 0:
                os.close(fd)
        code = 127 if isinstance(e, FileNotFoundError) else 126
        return {
            "exit_code": code,
            "signal": None,
            "timed_out": False,
            "stdout": "",
            "stderr": b64(f"{argv[0]}: {e.strerror or e}\n".encode()),
            "stdout_truncated": False,
            "stderr_truncated": False,
            "duration_ms": (time.monotonic() - start) * 1000.0,
            "cpu_ms": 0.0,
            "max_rss_kib": 0,
            "spawn_error": e.__class__.__name__,
        }
    os.close(out_w)
    os.close(err_w)
    os.close(in_r)

    out, err = _Stream(out_r, cap), _Stream(err_r, cap)
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    open_fds = {out_r: out, err_r: err}
    for fd in open_fds:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    pending = memoryview(stdin_data) if stdin_data else None
    if in_w >= 0:
        if pending:
            os.set_blocking(in_w, False)
            poller.register(in_w, select.POLLOUT)
        else:
            os.close(in_w)
            in_w = -1

    deadline = start + timeout_s
    timed_out = False
    exited = False
    while not exited:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        for fd, _ in poller.poll(max(1, int(remaining * 1000) + 1)):
            if fd == pidfd:
                exited = True
            elif fd == in_w:
                try:
                    assert pending is not None
                    written = os.write(in_w, pending[:READ_CHUNK])
                    pending = pending[written:]
                except BlockingIOError:
                    continue
                except OSError:  # EPIPE: the command stopped reading
                    pending = None
                if not pending:
                    poller.unregister(in_w)
                    os.close(in_w)
                    in_w = -1
            elif fd in open_fds and not open_fds[fd].read():
                poller.unregister(fd)
                del open_fds[fd]
    if timed_out:
        try:
            os.killpg(pid, _signal.SIGKILL)
        except ProcessLookupError:
            pass
    if kill_background:
        kill_everything_else()
    _, status, usage = os.wait4(pid, 0)
    poller.unregister(pidfd)
    os.close(pidfd)
    if in_w >= 0:
        poller.unregister(in_w)
        os.close(in_w)
    duration_ms = (time.monotonic() - start) * 1000.0

    # Whatever is still buffered in the pipes belongs to the command; a survivor that keeps
    # a pipe open (only possible with kill_background off) gets a short grace, no more.
    drain_deadline = time.monotonic() + (1.0 if kill_background else DRAIN_GRACE_S)
    while open_fds:
        remaining = drain_deadline - time.monotonic()
        if remaining <= 0:
            break
        for fd, _ in poller.poll(max(1, int(remaining * 1000))):
            if fd in open_fds and not open_fds[fd].read():
                poller.unregister(fd)
                del open_fds[fd]
    os.close(out_r)
    os.close(err_r)
    reap_orphans()

    return {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "timed_out": timed_out,
        "stdout": b64(bytes(out.data)),
        "stderr": b64(bytes(err.data)),
        "stdout_truncated": out.total > len(out.data),
        "stderr_truncated": err.total > len(err.data),
        "duration_ms": duration_ms,
        "cpu_ms": (usage.ru_utime + usage.ru_stime) * 1000.0,
        "max_rss_kib": int(usage.ru_maxrss),
        "spawn_error": None,
    }


# --- workspace -----------------------------------------------------------------------


class ToolFailure(Exception):
    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


_ERRNO_TYPES = {
    2: "not_found",
    17: "already_exists",
    13: "permission_denied",
    1: "permission_denied",
    21: "is_a_directory",
    20: "not_a_directory",
    27: "file_too_large",
    28: "no_space",
    30: "read_only",
    36: "invalid_argument",
    40: "too_many_links",
}


def os_failure(e: OSError, path: str) -> ToolFailure:
    kind = _ERRNO_TYPES.get(e.errno or 0, "os_error")
    return ToolFailure(kind, f"{path}: {e.strerror or e}")


def resolve(path: object) -> str:
    """The real path of `path` (relative to the workspace), or ToolFailure outside it."""
    if not isinstance(path, str) or not path:
        raise ToolFailure("invalid_argument", "path must be a non-empty string")
    if "\x00" in path:
        raise ToolFailure("invalid_argument", "path contains a NUL byte")
    joined = path if path.startswith("/") else WORKSPACE + "/" + path
    real = os.path.realpath(joined)
    if real != WORKSPACE and not real.startswith(WORKSPACE + "/"):
        raise ToolFailure("outside_workspace", f"{path}: outside {WORKSPACE}")
    return real


def relative(real: str) -> str:
    return real[len(WORKSPACE) + 1 :] if real != WORKSPACE else "."


def read_file(req: Obj) -> Obj:
    real = resolve(req["path"])
    cap = int(req["cap"])
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise os_failure(e, req["path"]) from e
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) == 0o040000:
            raise ToolFailure("is_a_directory", f"{req['path']}: is a directory")
        if (st.st_mode & 0o170000) != 0o100000:
            raise ToolFailure("not_a_regular_file", f"{req['path']}: not a regular file")
        data = bytearray()
        while len(data) <= cap:
            chunk = os.read(fd, min(READ_CHUNK * 16, cap + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    except OSError as e:
        raise os_failure(e, req["path"]) from e
    finally:
        os.close(fd)
    truncated = len(data) > cap
    return {"content": b64(bytes(data[:cap])), "truncated": truncated, "size": st.st_size}


def write_file(req: Obj) -> Obj:
    real = resolve(req["path"])
    content = unb64(req["content"])
    if real == WORKSPACE:
        raise ToolFailure("is_a_directory", f"{req['path']}: is a directory")
    try:
        parent = os.path.dirname(real)  # noqa: PTH120
        try:
            os.makedirs(parent, exist_ok=True)  # noqa: PTH103
        except FileExistsError:  # a component of the parent is a file
            raise ToolFailure(
                "not_a_directory", f"{req['path']}: a parent is not a directory"
            ) from None
        # The parent may have been swapped for a symlink since `resolve`; re-check it.
        if resolve(parent) != parent:
            raise ToolFailure("outside_workspace", f"{req['path']}: outside {WORKSPACE}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(real, flags, 0o644)
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError as e:
        raise os_failure(e, req["path"]) from e
    return {"bytes_written": len(content), "path": relative(real)}


def list_dir(req: Obj) -> Obj:
    real = resolve(req["path"])
    try:
        with os.scandir(real) as it:
            entries = sorted(
                entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "") for entry in it
            )
    except OSError as e:
        raise os_failure(e, req["path"]) from e
    return {"entries": entries}


def put_files(req: Obj) -> Obj:
    failed: list[Obj] = []
    for rel, content in req["files"].items():
        try:
            write_file({"path": rel, "content": content})
        except ToolFailure as e:
            failed.append({"path": rel, "error_type": e.error_type, "message": str(e)})
    return {"count": len(req["files"]) - len(failed), "failed": failed}


def walk(limit: int) -> tuple[dict[str, os.stat_result], bool]:
    """Regular files under the workspace by relative path (symlinks never followed)."""
    found: dict[str, os.stat_result] = {}
    stack = [WORKSPACE]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        if len(found) >= limit:
                            return found, True
                        found[entry.path[len(WORKSPACE) + 1 :]] = entry.stat(follow_symlinks=False)
        except OSError:
            continue
    return found, False


def file_sha256(rel: str) -> str | None:
    try:
        fd = os.open(
            WORKSPACE + "/" + rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        )
    except OSError:
        return None
    digest = _sha256()
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            digest.update(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return str(digest.hexdigest())


class Tracker:
    """Remembers the workspace between calls and reports the files each call changed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.known: dict[str, tuple[tuple[int, int, int, int], str | None]] = {}

    def changes(self) -> tuple[list[Obj], bool]:
        current, truncated = walk(self.limit)
        changed: list[Obj] = []
        seen: dict[str, tuple[tuple[int, int, int, int], str | None]] = {}
        for rel, st in current.items():
            key = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
            before = self.known.get(rel)
            if before is not None and before[0] == key:
                seen[rel] = before
                continue
            sha = file_sha256(rel)
            seen[rel] = (key, sha)
            if before is None:
                changed.append(
                    {"path": rel, "change": "created", "size": st.st_size, "sha256": sha}
                )
            elif before[1] != sha:
                changed.append(
                    {"path": rel, "change": "modified", "size": st.st_size, "sha256": sha}
                )
        if not truncated:
            for rel in self.known.keys() - seen.keys():
                changed.append({"path": rel, "change": "deleted", "size": None, "sha256": None})
        else:
            # Files past the walk limit are unknown, not deleted: keep what we knew of them.
            for rel in self.known.keys() - seen.keys():
                seen[rel] = self.known[rel]
        self.known = seen
        changed.sort(key=lambda c: c["path"])
        return changed, truncated


def count_files() -> int:
    """Regular files under the workspace (symlinks never followed), counted without reading."""
    count = 0
    stack = [WORKSPACE]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        count += 1
        except OSError:
            continue
    return count


def export(req: Obj) -> Obj:
    """Regular files of the workspace (or of `paths`), never through a symlink, size-capped
    and capped at `max_files` files; `left_out` counts the files past that cap."""
    max_bytes = int(req["max_bytes"])
    wanted = req.get("paths")
    current, truncated = walk(int(req["max_files"]))
    left_out = count_files() - len(current) if truncated else 0
    files: list[Obj] = []
    skipped: list[Obj] = []
    total = 0
    for rel in sorted(current):
        if wanted is not None and not any(
            rel == p or rel.startswith(p.rstrip("/") + "/") for p in wanted
        ):
            continue
        size = current[rel].st_size
        if total + size > max_bytes:
            skipped.append({"path": rel, "reason": "over_size_cap"})
            continue
        try:
            fd = os.open(
                WORKSPACE + "/" + rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            )
        except OSError as e:
            skipped.append({"path": rel, "reason": e.__class__.__name__})
            continue
        try:
            data = bytearray()
            while len(data) <= max_bytes - total:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        if total + len(data) > max_bytes:
            skipped.append({"path": rel, "reason": "over_size_cap"})
            continue
        total += len(data)
        files.append({"path": rel, "mode": current[rel].st_mode & 0o777, "data": b64(bytes(data))})
    return {
        "files": files,
        "skipped": skipped,
        "walk_truncated": truncated,
        "left_out": left_out,
        "bytes": total,
    }


# --- main loop -----------------------------------------------------------------------

_FILE_OPS = {"read_file": read_file, "write_file": write_file, "list_dir": list_dir}


def handle(req: Obj, config: Obj, tracker: Tracker) -> Obj:
    op = req.get("op")
    if op == "exec":
        result = run_command(req, config)
    elif op in _FILE_OPS:
        try:
            result = {"ok": True, **_FILE_OPS[op](req)}
        except ToolFailure as e:
            result = {"ok": False, "error_type": e.error_type, "message": str(e)}
    elif op == "put_files":
        result = put_files(req)
        tracker.changes()  # the populated workspace is the baseline, not a change
    elif op == "export":
        result = export(req)
    elif op == "ping":
        result = {"pong": True}
    else:
        return {"error": f"unknown op {op!r}"}
    if req.get("track"):
        result["changes"], result["changes_truncated"] = tracker.changes()
    return result


def make_undumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0) through `_ctypes` (the `ctypes` package costs ~2 ms to import)."""
    import _ctypes

    class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]
        _type_ = "i"

    class _Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL
        _restype_ = _Int

    class _Libc:
        _handle = _ctypes.dlopen(None, 2)  # type: ignore[arg-type]  # dlopen(NULL): the process itself

    prctl = _Function(("prctl", _Libc()))  # type: ignore[arg-type]  # anything with a _handle
    if prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")


def main() -> None:
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    make_undumpable()
    config = decode_json(sys.argv[1])
    assert isinstance(config, dict)
    tracker = Tracker(int(config.get("max_tracked_files", 20000)))
    write_frame({"ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})
    while True:
        req = read_frame()
        if req is None:
            break
        try:
            response = (
                handle(req, config, tracker) if isinstance(req, dict) else {"error": "bad request"}
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            response = {"error": f"{e.__class__.__name__}: {e}"}
        write_frame(response)
    kill_everything_else()


if __name__ == "__main__":
    main()
