"""The in-jail executor: PID 1 of every episode jail, run by the jail's own `python3`.

It is bind-mounted read-only into the jail and started by nsjail with the jail's stdin and
stdout as its command channel: frames of a 4-byte big-endian length followed by a JSON
object, one request and one response at a time. It serves `exec` (spawn one command with a
timeout, output caps and rusage), `run_python` (a Python script in a child forked from
the executor itself: no interpreter start), `stop_processes`, the file tools and the
workspace bookkeeping (change tracking, population, export), all as the unprivileged jail
user and all inside the jail, so a hostile path can at worst reach the jail's own
read-only root.

Why it is written the way it is:
  * One standalone file (it is mounted into every jail as one `.pyc`), stdlib only.
  * Before its ready frame it imports nothing that is not built into the interpreter:
    no `os` (its `posix` half is enough), no `json`, no `from __future__`. A cold jail
    is nsjail plus this start-up, and nsjail alone takes ~7 ms on an idle machine.
  * Whatever else it needs (`_json`, non-dumpability, the modules verifiers use) it
    does while idle, one step at a time, checking its stdin between steps so that a
    request is never kept waiting for more than one step; the two steps every request
    needs (non-dumpable, the JSON codec) are forced before the first request is read.
  * It is PID 1 of the jail's PID namespace: the kernel only delivers signals to it for
    which it installed a handler, so it resets Python's SIGINT handler and installs none;
    `kill -9 -1` from a command then kills every other process in the jail but not it.
  * It makes itself non-dumpable before it runs any command, so that a command (same
    uid) cannot open `/proc/1/fd/1` and forge frames on the host channel, nor read its
    memory. Children forked for `run_python` inherit that.
  * It exits when its stdin reaches EOF (the host died or closed the episode); as PID 1,
    its exit makes the kernel kill everything left in the jail.
"""

import _signal  # type: ignore[import-not-found]
import binascii
import posix
import select
import sys
import time

try:
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]  # Python <= 3.11
except ImportError:  # pragma: no cover - newer interpreters renamed the module
    from _sha2 import sha256 as _sha256  # type: ignore[import-not-found, no-redef, unused-ignore]

TYPE_CHECKING = False  # `typing` costs start-up time; mypy treats this name as True
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Obj = dict[str, Any]

WORKSPACE = "/workspace"
"""The tools' root; an image jail's configuration names its task's workdir instead (`workspace`)."""
READ_CHUNK = 65536
MAX_FRAME = 512 * 1024 * 1024
#: A command that has exited but left a writer holding its pipes gets this long to finish.
DRAIN_GRACE_S = 0.1

_IS_INIT = posix.getpid() == 1


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


class _Codec:
    """The C halves of `json`, loaded after the ready frame (`_json` is a shared library)."""

    scan: "Callable[[str, int], tuple[object, int]] | None" = None
    quote: "Callable[[str], str]" = repr

    @classmethod
    def load(cls) -> None:
        import _json  # deferred past the ready frame on purpose

        cls.scan = _json.make_scanner(_JsonContext())  # type: ignore[arg-type]  # duck-typed
        cls.quote = _json.encode_basestring_ascii


def decode_json(text: str) -> object:
    if _Codec.scan is None:
        _Codec.load()
    assert _Codec.scan is not None
    obj, end = _Codec.scan(text, 0)
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
        return _Codec.quote(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(_Codec.quote(str(k)) + ":" + encode_json(v) for k, v in value.items())
            + "}"
        )
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
        chunk = posix.read(fd, min(n, 1 << 20))
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
    write_body(encode_json(value).encode("ascii"))


def write_body(body: bytes) -> None:
    data = len(body).to_bytes(4, "big") + body
    view = memoryview(data)
    while view:
        written = posix.write(1, view)
        view = view[written:]


# --- processes -----------------------------------------------------------------------


def kill_everything_else() -> None:
    """Kill every process in the jail but this one (only meaningful as PID 1); reaps nothing."""
    if _IS_INIT:
        try:
            posix.kill(-1, _signal.SIGKILL)
        except ProcessLookupError:
            pass


def reap_orphans() -> None:
    while True:
        try:
            pid, _ = posix.waitpid(-1, posix.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_processes() -> "Obj":
    """Kill and reap every other process in the jail, until none is left.

    As PID 1 every process of the jail is its descendant or was re-parented to it, so
    "no child left to wait for" means "nothing else runs": a process forked while the
    first SIGKILL went round is caught by the next one.
    """
    killed = 0
    if not _IS_INIT:
        return {"killed": 0}
    while True:
        kill_everything_else()
        try:
            posix.waitpid(-1, 0)
        except ChildProcessError:
            return {"killed": killed}
        killed += 1


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
            chunk = posix.read(self.fd, READ_CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        self.total += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        return True


class _Pipes:
    """The three pipes of one child: its ends (to dup onto 0/1/2) and ours."""

    def __init__(self, stdin_data: bytes | None) -> None:
        self.out_r, self.out_w = posix.pipe()
        self.err_r, self.err_w = posix.pipe()
        if stdin_data is None:
            self.in_r, self.in_w = posix.open("/dev/null", posix.O_RDONLY | posix.O_CLOEXEC), -1
        else:
            self.in_r, self.in_w = posix.pipe()

    def close_child_ends(self) -> None:
        posix.close(self.out_w)
        posix.close(self.err_w)
        posix.close(self.in_r)

    def close_all(self) -> None:
        for fd in (self.out_r, self.out_w, self.err_r, self.err_w, self.in_r, self.in_w):
            if fd >= 0:
                posix.close(fd)


def _spawn_failure(argv0: str, e: OSError, start: float) -> "Obj":
    return {
        "exit_code": 127 if isinstance(e, FileNotFoundError) else 126,
        "signal": None,
        "timed_out": False,
        "stdout": "",
        "stderr": b64(f"{argv0}: {e.strerror or e}\n".encode()),
        "stdout_truncated": False,
        "stderr_truncated": False,
        "duration_ms": (time.monotonic() - start) * 1000.0,
        "cpu_ms": 0.0,
        "max_rss_kib": 0,
        "spawn_error": e.__class__.__name__,
    }


def run_command(req: "Obj", config: "Obj") -> "Obj":
    argv = [str(a) for a in req["argv"]]
    stdin_data = unb64(req["stdin"]) if req.get("stdin") is not None else None
    env = req.get("env") or config["env"]
    pipes = _Pipes(stdin_data)
    start = time.monotonic()
    try:
        pid = posix.posix_spawnp(
            argv[0],
            argv,
            env,
            file_actions=[
                (posix.POSIX_SPAWN_DUP2, pipes.in_r, 0),
                (posix.POSIX_SPAWN_DUP2, pipes.out_w, 1),
                (posix.POSIX_SPAWN_DUP2, pipes.err_w, 2),
            ],
            setsid=True,
            # Python ignores these in the executor; a command must see the defaults.
            setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGINT),
        )
    except OSError as e:
        pipes.close_all()
        return _spawn_failure(argv[0], e, start)
    return supervise(pid, pipes, stdin_data, start, req, config)


def run_python(req: "Obj", config: "Obj") -> "Obj":
    """`req["script"]` in a forked child, as `python3 -I -S -c SCRIPT ARGS…` would run it.

    The child inherits this process's interpreter with its imported stdlib (nothing the
    agent wrote is on `sys.path`: it holds the read-only stdlib only), its limits and its
    non-dumpability; it gets its own session, pipes, environment and `__main__`.
    """
    stdin_data = unb64(req["stdin"]) if req.get("stdin") is not None else None
    pipes = _Pipes(stdin_data)
    start = time.monotonic()
    try:
        pid = posix.fork()
    except OSError as e:
        pipes.close_all()
        return _spawn_failure("python", e, start)
    if pid == 0:  # pragma: no cover - the child never returns
        _python_child(req, config, pipes)
    return supervise(pid, pipes, stdin_data, start, req, config)


def _python_child(req: "Obj", config: "Obj", pipes: _Pipes) -> None:
    """The forked child of `run_python`: set up like a fresh interpreter, run, `_exit`."""
    status = 1
    try:
        posix.setsid()
        posix.dup2(pipes.in_r, 0)
        posix.dup2(pipes.out_w, 1)
        posix.dup2(pipes.err_w, 2)
        posix.closerange(3, 65536)  # the host channel was 0/1; nothing else may leak in
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        import builtins  # built in, already loaded
        import io  # loaded at interpreter start

        env = req.get("env") or config["env"]
        import os  # preloaded while idle, or imported here

        os.environ.clear()
        os.environ.update(env)
        posix.chdir(WORKSPACE)
        # New stdio objects, set up as `python3` sets them up under LANG=C.UTF-8.
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), "utf-8")
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), "utf-8")
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False),
            "utf-8",
            errors="backslashreplace",
            write_through=True,
        )
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
        sys.argv = ["-c", *[str(a) for a in req.get("args") or []]]
        main = type(sys)("__main__")
        main.__builtins__ = builtins  # type: ignore[attr-defined]
        sys.modules["__main__"] = main
        status = _exec_main(str(req["script"]), main.__dict__)
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        import atexit  # built in

        atexit._run_exitfuncs()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            status = 120  # what CPython exits with when it cannot flush stdout
    except BaseException as e:  # the child must reach _exit whatever happens
        try:
            posix.write(2, f"executor child: {e.__class__.__name__}: {e}\n".encode())
        except BaseException:  # nowhere left to report it
            pass
    finally:
        posix._exit(status & 0xFF)


def _exec_main(script: str, namespace: "Obj") -> int:
    """Run `script` as `__main__`; the exit status a `python3 -c` would give."""
    try:
        exec(compile(script, "<string>", "exec"), namespace)  # it is the verifier
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        sys.stderr.write(f"{code}\n")
        return 1
    except BaseException as e:  # reported like the interpreter would
        tb = e.__traceback__
        e.__traceback__ = tb.tb_next if tb is not None else None  # drop this frame
        sys.excepthook(type(e), e, e.__traceback__)
        return 1
    return 0


def supervise(
    pid: int, pipes: _Pipes, stdin_data: bytes | None, start: float, req: "Obj", config: "Obj"
) -> "Obj":
    """Feed the child's stdin, read its output (capped), enforce the timeout, reap it."""
    timeout_s = float(req["timeout_s"])
    cap = int(req["cap"])
    kill_background = bool(req.get("kill_background", config.get("kill_background", True)))
    pipes.close_child_ends()
    in_w = pipes.in_w
    out, err = _Stream(pipes.out_r, cap), _Stream(pipes.err_r, cap)
    pidfd = posix.pidfd_open(pid)
    poller = select.poll()
    open_fds = {pipes.out_r: out, pipes.err_r: err}
    for fd in open_fds:
        posix.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    pending = memoryview(stdin_data) if stdin_data else None
    if in_w >= 0:
        if pending:
            posix.set_blocking(in_w, False)
            poller.register(in_w, select.POLLOUT)
        else:
            posix.close(in_w)
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
                    written = posix.write(in_w, pending[:READ_CHUNK])
                    pending = pending[written:]
                except BlockingIOError:
                    continue
                except OSError:  # EPIPE: the command stopped reading
                    pending = None
                if not pending:
                    poller.unregister(in_w)
                    posix.close(in_w)
                    in_w = -1
            elif fd in open_fds and not open_fds[fd].read():
                poller.unregister(fd)
                del open_fds[fd]
    if timed_out:
        try:
            posix.killpg(pid, _signal.SIGKILL)
        except ProcessLookupError:
            pass
    if kill_background:
        kill_everything_else()
    _, status, usage = posix.wait4(pid, 0)
    poller.unregister(pidfd)
    posix.close(pidfd)
    if in_w >= 0:
        poller.unregister(in_w)
        posix.close(in_w)
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
    posix.close(pipes.out_r)
    posix.close(pipes.err_r)
    reap_orphans()

    return {
        "exit_code": posix.WEXITSTATUS(status) if posix.WIFEXITED(status) else None,
        "signal": posix.WTERMSIG(status) if posix.WIFSIGNALED(status) else None,
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
    import posixpath  # deferred past the ready frame; imported while idle

    joined = path if path.startswith("/") else WORKSPACE + "/" + path
    real = posixpath.realpath(joined)
    if real != WORKSPACE and not real.startswith(WORKSPACE + "/"):
        raise ToolFailure("outside_workspace", f"{path}: outside {WORKSPACE}")
    return real


def relative(real: str) -> str:
    return real[len(WORKSPACE) + 1 :] if real != WORKSPACE else "."


def read_file(req: "Obj") -> "Obj":
    real = resolve(req["path"])
    cap = int(req["cap"])
    try:
        fd = posix.open(
            real, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK
        )
    except OSError as e:
        raise os_failure(e, req["path"]) from e
    try:
        st = posix.fstat(fd)
        if (st.st_mode & 0o170000) == 0o040000:
            raise ToolFailure("is_a_directory", f"{req['path']}: is a directory")
        if (st.st_mode & 0o170000) != 0o100000:
            raise ToolFailure("not_a_regular_file", f"{req['path']}: not a regular file")
        data = bytearray()
        while len(data) <= cap:
            chunk = posix.read(fd, min(READ_CHUNK * 16, cap + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    except OSError as e:
        raise os_failure(e, req["path"]) from e
    finally:
        posix.close(fd)
    truncated = len(data) > cap
    return {"content": b64(bytes(data[:cap])), "truncated": truncated, "size": st.st_size}


def write_file(req: "Obj") -> "Obj":
    real = resolve(req["path"])
    content = unb64(req["content"])
    if real == WORKSPACE:
        raise ToolFailure("is_a_directory", f"{req['path']}: is a directory")
    try:
        import os  # deferred past the ready frame; imported while idle

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
        flags = posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC | posix.O_NOFOLLOW | posix.O_CLOEXEC
        fd = posix.open(real, flags, 0o644)
        try:
            view = memoryview(content)
            while view:
                view = view[posix.write(fd, view) :]
        finally:
            posix.close(fd)
    except OSError as e:
        raise os_failure(e, req["path"]) from e
    return {"bytes_written": len(content), "path": relative(real)}


def list_dir(req: "Obj") -> "Obj":
    real = resolve(req["path"])
    try:
        with posix.scandir(real) as it:
            entries = sorted(
                entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "") for entry in it
            )
    except OSError as e:
        raise os_failure(e, req["path"]) from e
    return {"entries": entries}


def put_files(req: "Obj") -> "Obj":
    failed: list[Obj] = []
    for rel, content in req["files"].items():
        try:
            write_file({"path": rel, "content": content})
        except ToolFailure as e:
            failed.append({"path": rel, "error_type": e.error_type, "message": str(e)})
    return {"count": len(req["files"]) - len(failed), "failed": failed}


def put_shape(req: "Obj") -> "Obj":
    """Give the workspace what is not file bytes (`sandbox.transfer.WorkdirShape`): its
    folders (empty ones too), its symlinks (never followed), then the permission bits of its
    files and folders (deepest folder last, so a read-only folder is filled first)."""
    import os  # deferred past the ready frame; imported while idle
    import posixpath

    dirs: dict[str, int] = req.get("dirs") or {}
    links: dict[str, str] = req.get("symlinks") or {}
    modes: dict[str, int] = req.get("modes") or {}
    steps: list[tuple[str, str, object]] = [
        *(("dir", rel, None) for rel in sorted(dirs)),
        *(("link", rel, links[rel]) for rel in sorted(links)),
        *(("mode", rel, int(modes[rel]) & 0o777) for rel in sorted(modes)),
        *(("mode", rel, int(dirs[rel]) & 0o1777) for rel in sorted(dirs, key=lambda r: -r.count("/"))),
    ]  # fmt: skip
    failed: list[Obj] = []
    for kind, rel, value in steps:
        try:
            if kind == "dir":
                os.makedirs(resolve(rel), exist_ok=True)  # noqa: PTH103
            elif kind == "link":
                path = WORKSPACE + "/" + rel
                parent = posixpath.dirname(path)
                if resolve(parent) != parent:  # a component of the parent is a symlink
                    raise ToolFailure("outside_workspace", f"{rel}: a parent is a symlink")
                os.makedirs(parent, exist_ok=True)  # noqa: PTH103
                posix.symlink(str(value), path)
            else:
                posix.chmod(resolve(rel), int(str(value)))
        except ToolFailure as e:
            failed.append({"path": rel, "error_type": e.error_type, "message": str(e)})
        except OSError as e:
            failure = os_failure(e, rel)
            failed.append({"path": rel, "error_type": failure.error_type, "message": str(failure)})
    return {"failed": failed}


def shape(limit: int, wanted: "list[str] | None") -> "tuple[dict[str, int], dict[str, str]]":
    """The workspace's folders (relative path → permission bits) and symlinks (→ target,
    never followed), at most `limit` of each."""
    dirs: dict[str, int] = {}
    links: dict[str, str] = {}
    stack = [WORKSPACE]
    while stack:
        top = stack.pop()
        try:
            with posix.scandir(top) as it:
                for entry in it:
                    rel = entry.path[len(WORKSPACE) + 1 :]
                    keep = wanted is None or any(
                        rel == p or rel.startswith(p.rstrip("/") + "/") for p in wanted
                    )
                    if entry.is_symlink():
                        if keep and len(links) < limit:
                            links[rel] = posix.readlink(entry.path)
                    elif entry.is_dir(follow_symlinks=False):
                        if keep and len(dirs) < limit:
                            dirs[rel] = entry.stat(follow_symlinks=False).st_mode & 0o1777
                        stack.append(entry.path)
        except OSError:
            continue
    return dirs, links


def walk(limit: int) -> tuple[dict[str, posix.stat_result], bool]:
    """Regular files under the workspace by relative path (symlinks never followed)."""
    found: dict[str, posix.stat_result] = {}
    stack = [WORKSPACE]
    while stack:
        top = stack.pop()
        try:
            with posix.scandir(top) as it:
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
        fd = posix.open(
            WORKSPACE + "/" + rel,
            posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK,
        )
    except OSError:
        return None
    digest = _sha256()
    try:
        while True:
            chunk = posix.read(fd, 1 << 20)
            if not chunk:
                break
            digest.update(chunk)
    except OSError:
        return None
    finally:
        posix.close(fd)
    return str(digest.hexdigest())


class Tracker:
    """Remembers the workspace between calls and reports the files each call changed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.known: dict[str, tuple[tuple[int, int, int, int], str | None]] = {}

    def changes(self) -> "tuple[list[Obj], bool]":
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
            with posix.scandir(top) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        count += 1
        except OSError:
            continue
    return count


def export(req: "Obj") -> "Obj":
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
            fd = posix.open(
                WORKSPACE + "/" + rel,
                posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK,
            )
        except OSError as e:
            skipped.append({"path": rel, "reason": e.__class__.__name__})
            continue
        try:
            data = bytearray()
            while len(data) <= max_bytes - total:
                chunk = posix.read(fd, 1 << 20)
                if not chunk:
                    break
                data += chunk
        finally:
            posix.close(fd)
        if total + len(data) > max_bytes:
            skipped.append({"path": rel, "reason": "over_size_cap"})
            continue
        total += len(data)
        files.append({"path": rel, "mode": current[rel].st_mode & 0o777, "data": b64(bytes(data))})
    dirs, links = shape(int(req["max_files"]), wanted)
    return {
        "files": files,
        "skipped": skipped,
        "walk_truncated": truncated,
        "left_out": left_out,
        "bytes": total,
        "dirs": dirs,
        "symlinks": links,
    }


# --- main loop -----------------------------------------------------------------------

_FILE_OPS = {"read_file": read_file, "write_file": write_file, "list_dir": list_dir}


def handle(req: "Obj", config: "Obj", tracker: Tracker) -> "Obj":
    op = req.get("op")
    if op == "exec":
        result = run_command(req, config)
    elif op == "run_python":
        result = run_python(req, config)
    elif op in _FILE_OPS:
        try:
            result = {"ok": True, **_FILE_OPS[op](req)}
        except ToolFailure as e:
            result = {"ok": False, "error_type": e.error_type, "message": str(e)}
    elif op == "put_files":
        result = put_files(req)
        tracker.changes()  # the populated workspace is the baseline, not a change
    elif op == "put_shape":
        result = put_shape(req)
        tracker.changes()
    elif op == "export":
        result = export(req)
    elif op == "stop_processes":
        result = stop_processes()
    elif op == "ping":
        result = {"pong": True}
    else:
        return {"error": f"unknown op {op!r}"}
    if req.get("track"):
        result["changes"], result["changes_truncated"] = tracker.changes()
    return result


def make_undumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0) through `_ctypes` (the `ctypes` package costs ~2 ms to import)."""
    import _ctypes  # a shared library: loaded after the ready frame

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


class Executor:
    """Configuration, change tracker, and the start-up work left for idle moments."""

    def __init__(self, raw_config: str) -> None:
        self._raw_config = raw_config
        self.config: Obj = {}
        self.tracker = Tracker(20000)
        # Both first steps must be done before any request is read (`ensure_ready`).
        self.steps: list[Callable[[], None]] = [make_undumpable, self._load_config]
        self._required = len(self.steps)

    def _load_config(self) -> None:
        global WORKSPACE
        config = decode_json(self._raw_config)
        if not isinstance(config, dict):
            raise ValueError("the executor's configuration must be a JSON object")
        self.config = config
        WORKSPACE = str(config.get("workspace", WORKSPACE))
        self.tracker = Tracker(int(config.get("max_tracked_files", 20000)))
        modules = ["posixpath", "os", *[str(m) for m in config.get("preload") or []]]
        self.steps += [_preloader(name) for name in modules]
        self.steps.append(_freeze_heap)

    def run_next_step(self) -> None:
        self.steps.pop(0)()
        self._required = max(0, self._required - 1)

    def ensure_ready(self) -> None:
        while self._required:
            self.run_next_step()


def _preloader(name: str) -> "Callable[[], None]":
    def preload() -> None:
        try:
            __import__(name)
        except ImportError:  # not in this interpreter's stdlib: the verifier imports it itself
            pass

    return preload


def _freeze_heap() -> None:
    """Move what is loaded so far out of the collector's sight: forked verifier children
    then do not copy those pages just to run a collection over them."""
    import gc  # built in

    gc.freeze()


def main() -> None:
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    executor = Executor(sys.argv[1])
    version = sys.version.split()[0].encode("ascii")
    write_body(b'{"ready":true,"pid":%d,"python":"%s"}' % (posix.getpid(), version))
    stdin = select.poll()
    stdin.register(0, select.POLLIN)
    while True:
        while executor.steps and not stdin.poll(0):
            executor.run_next_step()
        executor.ensure_ready()
        req = read_frame()
        if req is None:
            break
        try:
            response = (
                handle(req, executor.config, executor.tracker)
                if isinstance(req, dict)
                else {"error": "bad request"}
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            response = {"error": f"{e.__class__.__name__}: {e}"}
        write_frame(response)
    kill_everything_else()


if __name__ == "__main__":
    main()
