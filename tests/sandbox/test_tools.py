"""The four tools, `exec`, change tracking, export, timeouts and faults on real jails."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from sandbox import (
    EpisodeHardTimeout,
    FaultProfile,
    SandboxCrashed,
    SandboxSettings,
    TransferError,
    open_sandbox,
)
from sandbox.tool_specs import BUILTIN_TOOLS
from tests.sandbox.conftest import SMALL, Jails, until


def test_execute_shell_reports_exit_code_output_and_usage(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open(files={"a.txt": "hello\n"}) as box:
            r = await box.call_tool(
                "execute_shell", {"command": "cat a.txt; id -u; echo oops >&2; exit 3"}
            )
            assert (r.ok, r.exit_code, r.error_type) == (False, 3, "nonzero_exit")
            assert r.stdout == b"hello\n1000\n"
            assert r.stderr == b"oops\n"
            assert r.resources.cpu_ms >= 0 and r.resources.max_rss_kib > 0
            ok = await box.call_tool("execute_shell", {"command": "pwd"})
            assert (
                ok.ok
                and ok.exit_code == 0
                and ok.error_type is None
                and ok.stdout == b"/workspace\n"
            )
            missing = await box.call_tool("execute_shell", {"command": "no-such-command"})
            assert missing.exit_code == 127 and missing.error_type == "command_not_found"

    asyncio.run(body())


@pytest.mark.skipif(
    not Path("/etc/alternatives/awk").is_symlink(), reason="the host has no awk alternative"
)
def test_commands_behind_debian_alternatives_run(jails: Jails) -> None:
    """`/usr/bin/awk` links to `/etc/alternatives/awk`: the jail's own `/etc` carries the
    host's alternatives links, so such commands are not dangling inside."""

    async def body() -> None:
        async with await jails.open(files={"n.csv": "1,2\n3,4\n"}) as box:
            r = await box.call_tool(
                "execute_shell", {"command": "awk -F, '{s += $2} END {print s}' n.csv"}
            )
            assert (r.exit_code, r.stdout, r.stderr) == (0, b"6\n", b"")

    asyncio.run(body())


def test_exec_runs_python_with_stdin_in_workspace(jails: Jails) -> None:
    script = (
        b"import os, sys\nprint(os.getcwd(), sys.stdin.read() == '', open('data.txt').read())\n"
    )

    async def body() -> None:
        async with await jails.open(files={"data.txt": "42"}) as box:
            r = await box.exec(["python3", "-"], stdin=script)
            assert r.exit_code == 0, r.stderr
            assert r.stdout == b"/workspace True 42\n"
            big = b"x" * 300_000
            echoed = await box.exec(["wc", "-c"], stdin=big)
            assert echoed.stdout.strip() == b"300000"
            absent = await box.exec(["/nonexistent/bin"])
            assert absent.exit_code == 127
            with pytest.raises(ValueError):
                await box.exec([])

    asyncio.run(body())


def test_file_tools_and_changes(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open(files={"keep.txt": "k", "old.txt": "o"}) as box:
            w = await box.call_tool("write_file", {"path": "sub/dir/new.txt", "content": "héllo"})
            assert w.ok and w.extra["bytes_written"] == len("héllo".encode())
            assert [(c.path, c.change, c.size, c.sha256) for c in w.files_changed] == [
                ("sub/dir/new.txt", "created", 6, hashlib.sha256("héllo".encode()).hexdigest())
            ]
            r = await box.call_tool("read_file", {"path": "/workspace/sub/dir/new.txt"})
            assert r.ok and r.stdout == "héllo".encode() and r.files_changed == []
            listing = await box.call_tool("list_dir", {"path": "."})
            assert listing.stdout == b"keep.txt\nold.txt\nsub/\n"
            s = await box.call_tool(
                "execute_shell",
                {"command": "rm old.txt; echo more >> keep.txt; touch sub/dir/new.txt"},
            )
            assert [(c.path, c.change) for c in s.files_changed] == [
                ("keep.txt", "modified"),
                ("old.txt", "deleted"),
            ]

    asyncio.run(body())


def test_file_tool_failures_are_typed_results(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open(files={"f.txt": "x"}) as box:
            cases: list[tuple[str, dict[str, Any], str]] = [
                ("read_file", {"path": "missing.txt"}, "not_found"),
                ("read_file", {"path": "."}, "is_a_directory"),
                ("read_file", {"path": "/etc/passwd"}, "outside_workspace"),
                ("read_file", {"path": "../etc/passwd"}, "outside_workspace"),
                ("list_dir", {"path": "f.txt"}, "not_a_directory"),
                ("list_dir", {"path": "/"}, "outside_workspace"),
                ("write_file", {"path": "/tmp/x", "content": "x"}, "outside_workspace"),
                ("write_file", {"path": "f.txt/child", "content": "x"}, "not_a_directory"),
                ("read_file", {"path": 3}, "invalid_argument"),
                ("read_file", {}, "invalid_argument"),
                ("execute_shell", {"command": "true", "timeout": 0}, "invalid_argument"),
                ("list_dir", {"path": "a\x00b"}, "invalid_argument"),
            ]
            for tool, args, expected in cases:
                r = await box.call_tool(tool, args)
                assert (r.ok, r.error_type) == (False, expected), (tool, args, r)
                assert r.stderr
            with pytest.raises(KeyError):
                await box.call_tool("rm_rf", {})

    asyncio.run(body())


def test_read_file_is_capped(jails: Jails) -> None:
    spec = SMALL.model_copy(update={"output_cap_bytes": 2048})

    async def body() -> None:
        async with await jails.open(spec, files={"big.bin": b"\x00\xff" * 4096}) as box:
            r = await box.call_tool("read_file", {"path": "big.bin"})
            assert r.ok and r.stdout_truncated and r.stdout == (b"\x00\xff" * 4096)[:2048]
            assert r.extra["size"] == 8192

    asyncio.run(body())


def test_per_call_timeout_and_output_cap(jails: Jails) -> None:
    spec = SMALL.model_copy(update={"output_cap_bytes": 4096})

    async def body() -> None:
        async with await jails.open(spec) as box:
            r = await box.call_tool(
                "execute_shell", {"command": "echo started; sleep 60", "timeout": 1}
            )
            assert r.timed_out and r.error_type == "timeout" and r.signal == signal.SIGKILL
            assert r.stdout == b"started\n"
            assert r.duration_ms < 10_000
            flood = await box.call_tool(
                "execute_shell",
                {"command": "head -c 1000000 /dev/zero; head -c 99999 /dev/zero >&2"},
            )
            assert flood.ok and flood.stdout_truncated and flood.stderr_truncated
            assert len(flood.stdout) == len(flood.stderr) == 4096

    asyncio.run(body())


def test_export_copies_regular_files_only_and_is_capped(jails: Jails, tmp_path: Path) -> None:
    async def body() -> None:
        async with await jails.open(
            files={"out/a.txt": "A", "out/b.bin": b"\x01" * 5000, "c.txt": "C"}
        ) as box:
            await box.call_tool(
                "execute_shell",
                {"command": "ln -s /etc/passwd out/link; ln -s .. out/up; mkfifo out/fifo"},
            )
            report = await box.export(tmp_path / "all")
            assert sorted(report.files) == ["c.txt", "out/a.txt", "out/b.bin"]
            assert (tmp_path / "all/out/a.txt").read_text() == "A"
            assert (
                not (tmp_path / "all/out/link").exists() and not (tmp_path / "all/out/up").exists()
            )
            capped = await box.export(tmp_path / "capped", paths=["out"], max_bytes=100)
            assert capped.files == ["out/a.txt"] and capped.truncated
            assert capped.skipped == {"out/b.bin": "over_size_cap"}
            # A symlink planted in the host's export dir is never followed.
            planted = tmp_path / "planted"
            planted.mkdir()
            (planted / "out").symlink_to(tmp_path / "elsewhere")
            (tmp_path / "elsewhere").mkdir()
            report = await box.export(planted)
            assert list((tmp_path / "elsewhere").iterdir()) == []
            assert "out/a.txt" in report.skipped

    asyncio.run(body())


def test_populate_rejects_escaping_paths(jails: Jails) -> None:
    async def body() -> None:
        for bad in ("../x", "/etc/x", "a/../../x", ""):
            with pytest.raises(TransferError):
                await jails.open(files={bad: "x"})
        with pytest.raises(TransferError, match="not_a_directory"):
            await jails.open(files={"a": "file", "a/b": "needs a to be a directory"})
        with pytest.raises(TransferError, match="exceed"):
            await open_sandbox(
                SMALL, files={"big": b"x" * 11}, settings=SandboxSettings(populate_max_bytes=10)
            )

    asyncio.run(body())


def test_soft_warning_then_hard_timeout(jails: Jails) -> None:
    spec = SMALL.model_copy(
        update={"soft_timeout_s": 0.3, "hard_timeout_s": 1.5, "call_timeout_s": 1.0}
    )

    async def body() -> None:
        box = await jails.open(spec)
        try:
            first = await box.call_tool("execute_shell", {"command": "true"})
            assert not first.soft_timeout_warning
            await until(lambda: box.age_s >= spec.soft_timeout_s, "past the soft timeout")
            warned = await box.call_tool("execute_shell", {"command": "true"})
            assert warned.ok and warned.soft_timeout_warning
            with pytest.raises(EpisodeHardTimeout):
                # The command would outlive the episode: the hard timeout ends it.
                await box.exec(["sleep", "30"], timeout_s=30)
            assert box.hard_timed_out
            assert not box.jail.alive
            with pytest.raises(EpisodeHardTimeout):
                await box.call_tool("execute_shell", {"command": "true"})
        finally:
            await box.close()

    asyncio.run(body())


def test_executor_death_is_an_environment_error_not_a_hang(jails: Jails) -> None:
    async def body() -> None:
        box = await jails.open()
        try:
            assert box.jail.executor_pid is not None
            os.kill(box.jail.executor_pid, signal.SIGKILL)
            with pytest.raises(SandboxCrashed):
                await asyncio.wait_for(box.call_tool("execute_shell", {"command": "true"}), 10)
        finally:
            await box.close()
            await box.close()  # idempotent

    asyncio.run(body())


def test_faults_are_seeded_recorded_and_replayable(jails: Jails) -> None:
    profile = FaultProfile(
        permission_denied_p=0.3,
        network_failure_p=0.2,
        tool_timeout_p=0.2,
        latency_p=0.05,
        latency_ms=(1, 5),
    )

    async def episode(seed: int) -> list[tuple[str | None, str | None, bool]]:
        async with await jails.open(faults=profile, fault_seed=seed) as box:
            out = []
            for i in range(16):
                tool, args = (
                    ("execute_shell", {"command": f"echo {i}"})
                    if i % 2
                    else ("list_dir", {"path": "."})
                )
                r = await box.call_tool(tool, args)
                kind = r.injected_fault.kind if r.injected_fault else None
                if kind in ("permission_denied", "network_failure", "tool_timeout"):
                    assert not r.ok and r.error_type is not None
                if kind == "tool_timeout":
                    assert r.timed_out
                if kind is None or kind == "latency":
                    assert r.ok, r
                if kind == "network_failure":
                    assert tool == "execute_shell"
                out.append((kind, r.error_type, r.ok))
            return out

    async def body() -> None:
        first, replay, other = await episode(7), await episode(7), await episode(8)
        assert first == replay
        assert first != other
        assert any(kind is not None for kind, _, _ in first)

    asyncio.run(body())


def test_faults_are_off_by_default(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            for _ in range(20):
                r = await box.call_tool("execute_shell", {"command": "true"})
                assert r.ok and r.injected_fault is None
            assert box.describe()["fault_profile"] == FaultProfile().model_dump(mode="json")

    asyncio.run(body())


def test_identity(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            assert box.spec_hash == SMALL.spec_hash()
            assert box.tool_versions == {name: spec.version for name, spec in BUILTIN_TOOLS.items()}
            assert box.describe()["limit_mode"] in ("cgroup_v1", "cgroup_v2", "rlimit")

    asyncio.run(body())


def test_loopback_network_is_the_jails_own(jails: Jails) -> None:
    spec = SMALL.model_copy(update={"network": "loopback"})
    script = (
        "import socket\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "c = socket.create_connection(s.getsockname()); a, _ = s.accept(); c.sendall(b'ping')\n"
        "print(a.recv(4).decode())\n"
    )

    async def body() -> None:
        async with await jails.open(spec) as box:
            r = await box.exec(["python3", "-c", script])
            assert r.stdout == b"ping\n", r.stderr
        async with await jails.open() as box:
            r = await box.exec(["python3", "-c", script])
            assert r.exit_code != 0  # network none: not even loopback

    asyncio.run(body())


def test_background_processes_survive_when_allowed(jails: Jails) -> None:
    spec = SMALL.model_copy(update={"kill_background": False})

    async def body() -> None:
        async with await jails.open(spec) as box:
            r = await box.call_tool(
                "execute_shell", {"command": "sleep 30 >/dev/null 2>&1 & echo started"}
            )
            assert r.ok and r.stdout == b"started\n"
            alive = await box.call_tool("execute_shell", {"command": "pgrep -x sleep || ps -e"})
            assert alive.ok, alive

    asyncio.run(body())


def test_idle_episode_is_killed_at_the_hard_timeout(jails: Jails) -> None:
    spec = SMALL.model_copy(update={"soft_timeout_s": 0.1, "hard_timeout_s": 0.5})

    async def body() -> None:
        box = await jails.open(spec)
        try:
            # An idle episode makes no call: the hard timer alone ends it.
            await until(lambda: box.hard_timed_out, "past the hard timeout")
            await until(lambda: not box.jail.alive, "killed at the hard timeout")
            with pytest.raises(EpisodeHardTimeout):
                await box.exec(["true"])
        finally:
            await box.close()

    asyncio.run(body())


def test_tool_calls_reuse_the_episode_jail(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            init = box.jail.executor_pid
            for _ in range(5):
                r = await box.call_tool(
                    "execute_shell", {"command": "cat /proc/1/cmdline | tr '\\0' ' '"}
                )
                assert b"executor" in r.stdout
            assert box.jail.executor_pid == init and box.jail.alive

    asyncio.run(body())
