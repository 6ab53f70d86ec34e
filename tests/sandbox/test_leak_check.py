"""The leak check of the `jails` fixture tells this process's jails from another's.

A PID namespace's name is an inode number the kernel reuses, so after a test's jail ended
a jail of another process (the other pytest-xdist worker) can carry its name: the check
must not count that jail's processes, and must still count this process's own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.cli.local import wait_until
from tests.sandbox.conftest import SMALL, Jails, pid_namespace, survivors_of

HOLDER = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    from sandbox import SandboxSettings, SandboxSpec, open_sandbox

    async def main():
        spec = SandboxSpec.model_validate_json(sys.argv[1])
        out = Path(sys.argv[2])
        async with await open_sandbox(spec, settings=SandboxSettings()) as box:
            out.with_suffix(".tmp").write_text(f"{os.getpid()} {box.jail.executor_pid}")
            out.with_suffix(".tmp").rename(out)
            for _ in range(600):
                if not out.exists():
                    break
                await asyncio.sleep(0.1)

    asyncio.run(main())
    """
)


def test_own_jails_count_and_another_process_jails_do_not(jails: Jails, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    ready = tmp_path / "holder.pids"
    # Another process's jail: `sh` starts the holder in the background and exits, so the
    # holder (and its nsjail) is reparented away from this process.
    subprocess.run(
        [
            "sh",
            "-c",
            '"$0" -c "$1" "$2" "$3" >/dev/null 2>&1 &',
            *(sys.executable, HOLDER, SMALL.model_dump_json(), str(ready)),
        ],
        check=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    holder = 0
    try:
        assert wait_until(ready.exists, timeout=120), "the holder's jail did not start"
        holder, executor = (int(n) for n in ready.read_text().split())
        ns = pid_namespace(executor)
        assert ns is not None
        assert survivors_of(ns) == []

        async def own() -> None:
            async with await jails.open() as box:
                assert box.jail.executor_pid is not None
                own_ns = pid_namespace(box.jail.executor_pid)
                assert own_ns is not None
                assert survivors_of(own_ns) == [box.jail.executor_pid]

        asyncio.run(own())
    finally:
        ready.unlink(missing_ok=True)  # the holder closes its jail and exits
        if holder and not wait_until(lambda: not Path(f"/proc/{holder}").exists(), timeout=60):
            with contextlib.suppress(ProcessLookupError):
                os.kill(holder, signal.SIGKILL)
