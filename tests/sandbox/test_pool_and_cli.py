"""The warm pool and `epiflow sandbox run` on real jails."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from cli.sandbox import app
from sandbox import WarmPool
from tests.sandbox.conftest import SMALL, Jails


def test_warm_pool_hands_out_fresh_jails(jails: Jails) -> None:
    async def body() -> None:
        async with WarmPool(SMALL, size=2, settings=jails.settings) as pool:
            assert pool.idle == 2
            first = await pool.acquire(files={"a.txt": "1"})
            jails.track(first)
            async with first:
                await first.call_tool("execute_shell", {"command": "echo dirty > /tmp/x"})
                assert (await first.call_tool("read_file", {"path": "a.txt"})).stdout == b"1"
            second = await pool.acquire()
            jails.track(second)
            async with second:
                r = await second.call_tool("execute_shell", {"command": "ls -A /tmp /workspace"})
                assert b"x" not in r.stdout.split() and b"a.txt" not in r.stdout
            assert pool.hits == 2 and pool.misses == 0
            await pool.wait_idle(2)  # the background refill, before closing
            assert pool.idle == 2
            jails.nsjail_pids.extend(jail.nsjail_pid for jail in pool._ready)

    asyncio.run(body())


def test_cli_runs_one_command_with_workspace_and_export(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "in.txt").write_text("input\n")
    (src / "link").symlink_to("/etc/shadow")
    out = tmp_path / "out"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "run",
            "--json",
            "--workspace",
            str(src),
            "--export",
            str(out),
            "--",
            "sh",
            "-c",
            "cat in.txt; ls; echo made > made.txt",
        ],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert set(record) == {
        "exit_code",
        "signal",
        "timed_out",
        "stdout",
        "stderr",
        "duration_ms",
        "truncated",
        "export",
    }
    assert record["export"] == {
        "files": 2,
        "bytes": 11,
        "left_out": 0,
        "skipped": 0,
        "truncated": False,
    }
    assert record["stdout"] == "input\nin.txt\n" and record["exit_code"] == 0
    assert sorted(p.name for p in out.iterdir()) == ["in.txt", "made.txt"]

    timed = runner.invoke(app, ["run", "--json", "--timeout", "1", "--", "sleep", "10"])
    assert timed.exit_code == 124 and json.loads(timed.stdout)["timed_out"] is True

    bad = runner.invoke(app, ["run", "--memory-mb", "10", "--", "true"])
    assert bad.exit_code == 2 and "memory_mib" in bad.stderr
