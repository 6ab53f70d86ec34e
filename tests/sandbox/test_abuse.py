"""The abuse suite: hostile commands on real nsjail jails.

Every test checks that the abuse is contained (the call returns a result, the limit
holds), recorded (exit code, signal, timeout, truncation), that the jail still serves
calls afterwards, and — through the `jails` fixture — that nothing of the jail survives
on the host once it is closed (processes, cgroups, mounts, state dirs).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandbox import NsjailSandbox, SandboxSpec
from sandbox.types import ToolResult
from tests.sandbox.conftest import SMALL, Jails, processes_in_namespace


async def shell(box: NsjailSandbox, command: str, timeout: int = 10) -> ToolResult:  # noqa: ASYNC109 - the tool argument
    return await box.call_tool("execute_shell", {"command": command, "timeout": timeout})


async def assert_healthy(box: NsjailSandbox, *, exit_within_s: float = 5.0) -> None:
    """The jail still answers, and nothing but its executor is left running in it: a
    process the call's cleanup killed gets `exit_within_s` to finish exiting (on a loaded
    machine a SIGKILLed process can take a moment to leave /proc)."""
    r = await shell(box, "echo alive")
    assert r.ok and r.stdout == b"alive\n", r
    assert box.jail.executor_pid is not None
    ns = os.readlink(f"/proc/{box.jail.executor_pid}/ns/pid")
    deadline = time.monotonic() + exit_within_s
    while (left := processes_in_namespace(ns)) != [box.jail.executor_pid]:
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert left == [box.jail.executor_pid]


def py(script: str) -> str:
    """A shell command running `script` with the jail's python3."""
    return "python3 - <<'EOF'\n" + script + "\nEOF"


def test_fork_bomb(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            r = await shell(box, "bomb() { bomb | bomb & }; bomb; sleep 2", timeout=4)
            assert r.error_type in ("timeout", "nonzero_exit", None)
            count = await shell(box, py(
                "import os\nn = 0\n"
                "try:\n    while True:\n        pid = os.fork()\n"
                # In-jail workload (children that stay alive while the test looks), not a wait of the test.
                "        if pid == 0:\n            import time; time.sleep(30)\n        n += 1\n"
                "except OSError as e:\n    print(n, e.errno)"
            ))  # fmt: skip
            n, errno = count.stdout.split()
            assert int(n) < SMALL.pids and int(errno) == 11  # EAGAIN at the pids limit
            await assert_healthy(box)

    asyncio.run(body())


def test_thread_bomb(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            r = await shell(box, py(
                "import threading, time\nn = 0\n"
                "try:\n    while True:\n"
                # In-jail workload (children that stay alive while the test looks), not a wait of the test.
                "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1\n"
                "except RuntimeError:\n    print(n)"
            ))  # fmt: skip
            assert r.ok, r
            assert int(r.stdout) < SMALL.pids
            await assert_healthy(box)

    asyncio.run(body())


def test_memory_bomb_across_processes(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            if box.limit_mode == "rlimit":
                pytest.skip(
                    "no memory cgroup on this host: only per-process address-space limits apply"
                )
            r = await shell(box, py(
                "import os, time\nkids = []\n"
                "for _ in range(4):\n    pid = os.fork()\n"
                # In-jail workload (children that stay alive while the test looks), not a wait of the test.
                "    if pid == 0:\n        x = b'x' * (200 << 20); time.sleep(3); os._exit(0)\n"
                "    kids.append(pid)\n"
                "print(sorted(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids))"
            ), timeout=20)  # fmt: skip
            assert r.ok, r
            codes = [int(c) for c in r.stdout.strip(b"[]\n").split(b",")]
            # 4 x 200 MiB does not fit in 512 MiB: the OOM killer took at least one child.
            assert -signal.SIGKILL in codes
            await assert_healthy(box)

    asyncio.run(body())


def test_disk_fill_and_sparse_file(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            fill = await shell(box, "head -c 200000000 /dev/zero > big; echo $?; stat -c %s big")
            status, size = fill.stdout.split()
            assert int(status) != 0 and int(size) <= SMALL.workspace_mib << 20, fill
            sparse = await shell(box, "truncate -s 1T sparse")
            assert not sparse.ok
            on_disk = await box.exec(
                [
                    "python3",
                    "-c",
                    "import os; print(os.path.getsize('sparse') if os.path.exists('sparse') else 0)",
                ]
            )
            assert int(on_disk.stdout) < 1 << 40
            pysparse = await shell(
                box,
                py(
                    "f = open('/tmp/s', 'wb')\ntry:\n    f.truncate(1 << 40)\nexcept OSError as e:\n    print(e.errno)"
                ),
            )
            assert pysparse.stdout.strip() == b"27"  # EFBIG
            tmp = await shell(box, "head -c 100000000 /dev/zero > /tmp/fill")
            assert not tmp.ok
            await shell(box, "rm -f big sparse /tmp/fill /tmp/s")
            await assert_healthy(box)

    asyncio.run(body())


def test_inode_exhaustion(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            r = await shell(box, py(
                "n = 0\ntry:\n    while True:\n        open(f'f{n}', 'w').close(); n += 1\n"
                "except OSError as e:\n    print(n, e.errno)"
            ))  # fmt: skip
            n, errno = r.stdout.split()
            assert int(n) < SMALL.inodes and int(errno) == 28  # ENOSPC
            assert len(r.files_changed) == int(n)
            await assert_healthy(box)

    asyncio.run(body())


def test_output_flood(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open(SMALL.model_copy(update={"output_cap_bytes": 65536})) as box:
            r = await shell(box, "cat /dev/zero & cat /dev/zero >&2", timeout=2)
            assert r.timed_out and r.stdout_truncated and r.stderr_truncated
            assert len(r.stdout) == len(r.stderr) == 65536
            await assert_healthy(box)

    asyncio.run(body())


def test_cpu_spin_and_sleep_forever_hit_the_call_timeout(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            for command in ("while :; do :; done", "sleep infinity", "exec sleep 1000 </dev/null"):
                r = await shell(box, command, timeout=1)
                assert r.timed_out and r.error_type == "timeout" and r.signal == signal.SIGKILL, (
                    command,
                    r,
                )
                assert r.duration_ms < 5000
            await assert_healthy(box)

    asyncio.run(body())


def test_daemonised_child_does_not_survive_the_call(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            r = await shell(
                box,
                "(setsid sh -c 'sleep 1000' >/dev/null 2>&1 &); nohup sleep 1000 >/dev/null 2>&1 & echo spawned",
            )
            assert r.ok and r.stdout == b"spawned\n"
            daemon = await shell(box, py(
                "import os\nif os.fork() == 0:\n    os.setsid()\n"
                # In-jail workload (children that stay alive while the test looks), not a wait of the test.
                "    if os.fork() == 0:\n        os.closerange(0, 3)\n        import time; time.sleep(1000)\n"
                "    os._exit(0)\n"
                "print('parent done')"
            ))  # fmt: skip
            assert daemon.ok and daemon.stdout == b"parent done\n"
            await assert_healthy(box)

    asyncio.run(body())


def test_no_network_egress_to_host_loopback(jails: Jails) -> None:
    async def body() -> None:
        connections = 0

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            writer.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            for network in ("none", "loopback"):
                async with await jails.open(SMALL.model_copy(update={"network": network})) as box:
                    r = await shell(box, py(
                        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                        "    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)"
                    ))  # fmt: skip
                    assert r.stdout.startswith(b"refused"), (network, r)
                    dns = await shell(
                        box,
                        py(
                            "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\nexcept OSError as e:\n    print(e.errno)"
                        ),
                    )
                    assert dns.stdout.strip() in (
                        b"101",
                        b"113",
                        b"99",
                    )  # ENETUNREACH / EHOSTUNREACH / EADDRNOTAVAIL
        finally:
            server.close()
            await server.wait_closed()
        assert connections == 0

    asyncio.run(body())


def test_host_secrets_are_invisible(jails: Jails, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPIFLOW_TEST_SECRET", "s3cr3t-value")
    monkeypatch.setenv("EPIFLOW_TEST_ALLOWED", "fine")
    spec = SMALL.model_copy(update={"env_allow": ("EPIFLOW_TEST_ALLOWED",)})

    async def body() -> None:
        async with await jails.open(spec) as box:
            env = await shell(box, "env; cat /proc/self/environ")
            assert b"s3cr3t" not in env.stdout and b"EPIFLOW_TEST_ALLOWED=fine" in env.stdout
            shadow = await shell(box, "cat /etc/shadow")
            assert not shadow.ok
            passwd = await shell(box, "cat /etc/passwd")
            assert passwd.stdout.count(b"\n") == 3 and b"agent:x:1000" in passwd.stdout
            for path in ("/root", "/home", "/work", "/sys", "/var", "/opt", os.getcwd()):
                r = await shell(box, f"ls {path}")
                assert not r.ok, (path, r)
            r = await box.call_tool("read_file", {"path": "/etc/shadow"})
            assert r.error_type == "outside_workspace"
            host_proc = await shell(box, "ls /proc | grep -c '^[0-9]'")
            assert int(host_proc.stdout) <= 4  # only the jail's own processes are visible

    asyncio.run(body())


def test_read_only_paths(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            for target in (
                "/usr/bin/evil",
                "/etc/passwd",
                "/evil",
                "/proc/sys/kernel/hostname",
                "/dev/evil",
                "/.epiflow/executor.py",
            ):
                r = await shell(box, f"echo x > {target}")
                assert not r.ok, (target, r)
            assert (await shell(box, "mkdir /newdir")).exit_code != 0
            assert (await shell(box, "echo ok > /tmp/ok && echo ok > /workspace/ok")).ok
            await assert_healthy(box)

    asyncio.run(body())


def test_symlink_and_dotdot_escapes(jails: Jails, tmp_path: Path) -> None:
    async def body() -> None:
        async with await jails.open(files={"inside.txt": "in"}) as box:
            await shell(
                box,
                "ln -s /etc/passwd pw; ln -s / root; ln -s /tmp t; ln -s inside.txt ok; mkdir d; ln -s ../.. d/up",
            )
            for tool, args in [
                ("read_file", {"path": "pw"}),
                ("read_file", {"path": "root/etc/passwd"}),
                ("read_file", {"path": "d/up/etc/hosts"}),
                ("read_file", {"path": "../../etc/passwd"}),
                ("read_file", {"path": "/workspace/../etc/passwd"}),
                ("write_file", {"path": "pw", "content": "x"}),
                ("write_file", {"path": "t/escaped", "content": "x"}),
                ("write_file", {"path": "../escaped", "content": "x"}),
                ("list_dir", {"path": "root"}),
                ("list_dir", {"path": "d/up"}),
            ]:
                r = await box.call_tool(tool, args)
                assert r.error_type == "outside_workspace", (tool, args, r)
            assert (await box.call_tool("read_file", {"path": "ok"})).stdout == b"in"
            assert (await shell(box, "ls /tmp")).stdout == b""
            report = await box.export(tmp_path / "out")
            assert sorted(report.files) == ["inside.txt"]
            assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["inside.txt"]

    asyncio.run(body())


def test_setuid_binaries_grant_nothing(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            status = await shell(
                box, "grep -E '^(NoNewPrivs|CapEff|CapPrm|CapBnd)' /proc/self/status"
            )
            assert b"NoNewPrivs:\t1" in status.stdout
            assert status.stdout.count(b"0000000000000000") == 3
            for command in (
                "su -c id root </dev/null",
                "mount -t tmpfs none /tmp",
                "passwd -d agent",
            ):
                r = await shell(box, command, timeout=3)
                assert not r.ok, (command, r)
            own = await shell(box, "cp /usr/bin/id ./myid && chmod 4755 ./myid && ./myid -u")
            assert own.stdout == b"1000\n"

    asyncio.run(body())


def test_ptrace_namespaces_and_mount_are_denied(jails: Jails) -> None:
    script = (
        "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        # In-jail workload (children that stay alive while the test looks), not a wait of the test.
        "pid = os.fork()\nif pid == 0:\n    time.sleep(5); os._exit(0)\n"
        "def call(name, *args):\n    r = getattr(libc, name)(*args)\n    return r, ctypes.get_errno()\n"
        "print('ptrace', *call('ptrace', 16, pid, 0, 0))\n"  # PTRACE_ATTACH
        "print('unshare', *call('unshare', 0x10000000))\n"  # CLONE_NEWUSER
        "print('unshare_ns', *call('unshare', 0x20000))\n"  # CLONE_NEWNS
        "print('mount', *call('mount', b'none', b'/tmp', b'tmpfs', 0, None))\n"
        "print('setns', *call('setns', os.open('/proc/self/ns/pid', os.O_RDONLY), 0))\n"
        "import platform\n"
        "if platform.machine() == 'x86_64':\n    print('keyctl', *call('syscall', 250, 0, -1, 0, 0, 0))\n"  # no libc wrapper
        "else:\n    print('keyctl -1 1')\n"
        "os.kill(pid, 9)"
    )

    async def body() -> None:
        async with await jails.open() as box:
            r = await shell(box, py(script))
            lines = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
            assert set(lines) == {"ptrace", "unshare", "unshare_ns", "mount", "setns", "keyctl"}, r
            for name, outcome in lines.items():
                ret, errno = outcome.split()
                assert ret == "-1" and errno in ("1", "13"), (name, outcome)
            assert not (await shell(box, "unshare -U -r true")).ok
            # The executor's own memory and pipes are off limits too (it is not dumpable).
            peek = await shell(box, "ls /proc/1/fd; cat /proc/1/environ; echo x > /proc/1/fd/1")
            assert not peek.ok and peek.stdout == b""
            await assert_healthy(box)

    asyncio.run(body())


def test_io_uring_is_denied(jails: Jails) -> None:
    """io_uring would give the jail a syscall surface the seccomp filter never sees: the
    setup call itself is refused (EPERM), so no ring exists to submit to."""
    script = (
        "import ctypes, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "params = ctypes.create_string_buffer(120)\n"  # struct io_uring_params, zeroed
        "nr = {'x86_64': 425, 'aarch64': 425}[platform.machine()]\n"  # io_uring_setup
        "r = libc.syscall(nr, 8, params)\nprint('io_uring_setup', r, ctypes.get_errno())\n"
        "r = libc.syscall(nr + 1, 0, 1, 0, 0, None, 0)\n"  # io_uring_enter on fd 0
        "print('io_uring_enter', r, ctypes.get_errno())"
    )

    async def body() -> None:
        async with await jails.open() as box:
            r = await shell(box, py(script))
            assert r.ok, r
            lines = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
            assert lines == {"io_uring_setup": "-1 1", "io_uring_enter": "-1 1"}, r
            await assert_healthy(box)

    asyncio.run(body())


def test_kill_all_touches_only_the_jail(jails: Jails) -> None:
    outsider = subprocess.Popen(
        ["sleep", "60"], user=100000, group=100000
    )  # same host uid as jails
    try:

        async def body() -> None:
            async with await jails.open() as box:
                r = await shell(
                    box,
                    "sleep 100 & kill -9 -1; kill -INT 1; kill -TERM 1; kill -KILL 1; echo after",
                )
                assert r.signal == signal.SIGKILL or r.exit_code is not None
                await assert_healthy(box)

        asyncio.run(body())
        assert outsider.poll() is None
    finally:
        outsider.kill()
        outsider.wait()


def test_no_state_leaks_between_episodes(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as first:
            r = await shell(
                first, "echo secret > /tmp/marker; echo secret > marker; mkdir -p /tmp/d"
            )
            assert r.ok
        async with await jails.open() as second:
            r = await shell(second, "ls -A /tmp /workspace")
            assert b"marker" not in r.stdout and b"d" not in r.stdout.split()

    asyncio.run(body())


def test_nul_bytes_and_invalid_utf8(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            r = await shell(box, r"printf 'a\000b\377\376c'; printf '\000\377' >&2")
            assert r.ok and r.stdout == b"a\x00b\xff\xfec" and r.stderr == b"\x00\xff"
            named = await shell(box, "touch \"$(printf 'bad\\377name')\"")
            assert named.ok and len(named.files_changed) == 1
            listing = await box.call_tool("list_dir", {"path": "."})
            assert listing.ok and listing.stdout.startswith(b"bad")
            w = await box.call_tool("write_file", {"path": "nul.txt", "content": "a\x00b"})
            assert w.ok
            assert (await box.call_tool("read_file", {"path": "nul.txt"})).stdout == b"a\x00b"

    asyncio.run(body())


def test_spec_without_cgroups_still_contains_a_fork_bomb(jails: Jails) -> None:
    """The rlimit fallback (hosts without usable cgroups) also stops a fork bomb."""
    from sandbox import SandboxSettings

    async def body() -> None:
        settings = SandboxSettings(cgroups="off")
        rl = Jails(settings)
        async with await rl.open(
            SandboxSpec(memory_mib=512, pids=32, tmpfs_mib=32, workspace_mib=64)
        ) as box:
            assert box.limit_mode == "rlimit"
            r = await shell(box, py(
                "import os\nn = 0\ntry:\n    while True:\n        pid = os.fork()\n"
                # In-jail workload (children that stay alive while the test looks), not a wait of the test.
                "        if pid == 0:\n            import time; time.sleep(30)\n        n += 1\n"
                "except OSError as e:\n    print(n, e.errno)"
            ))  # fmt: skip
            n, _ = r.stdout.split()
            assert int(n) < 32
            await assert_healthy(box)
        jails.namespaces += rl.namespaces
        jails.nsjail_pids += rl.nsjail_pids

    asyncio.run(body())
