"""`Sandbox.run_python` (a script in a child forked from the executor) and `stop_processes`,
on real jails: the child behaves like `python3 -I -S -c`, keeps the call's limits, cannot
reach the executor's channel, and leaves nothing running."""

from __future__ import annotations

import asyncio
import json
import os

from sandbox import NsjailSandbox, SandboxSettings, SandboxSpec
from sandbox.host import prepare_host
from tests.sandbox.conftest import SMALL, Jails, processes_in_namespace
from tests.sandbox.test_abuse import assert_healthy, shell


def test_output_exit_codes_args_and_stdin(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            r = await box.run_python(
                "import sys\nprint('out', sys.argv[1:], sys.stdin.read())\n"
                "print('err', file=sys.stderr)\nprint(__name__)\n",
                args=["a", "b c"],
                stdin=b"fed",
            )
            assert r.exit_code == 0 and r.signal is None and not r.timed_out
            assert r.stdout == b"out ['a', 'b c'] fed\n__main__\n"
            assert r.stderr == b"err\n"
            assert r.resources is not None and r.resources.cpu_ms >= 0

            assert (await box.run_python("raise SystemExit(3)")).exit_code == 3
            assert (await box.run_python("import sys; sys.exit()")).exit_code == 0
            message = await box.run_python("raise SystemExit('no way')")
            assert message.exit_code == 1 and message.stderr == b"no way\n"
            crash = await box.run_python("def f():\n    1/0\nf()\n")
            assert crash.exit_code == 1
            err = crash.stderr.decode()
            # The traceback is the script's, as `python3 -c` prints it: no executor frame.
            assert err.startswith("Traceback") and 'File "<string>", line 2, in f' in err
            assert "ZeroDivisionError" in err and "executor" not in err
            syntax = await box.run_python("def (:")
            assert syntax.exit_code == 1 and b"SyntaxError" in syntax.stderr
            await assert_healthy(box)

    asyncio.run(body())


def test_it_runs_like_an_isolated_interpreter_in_the_workspace(jails: Jails) -> None:
    spec = SMALL.model_copy(update={"env": {"MARKER": "spec-env"}})

    async def body() -> None:
        async with await jails.open(spec) as box:
            r = await box.run_python(
                "import json, os, sys\n"
                "print(json.dumps({'cwd': os.getcwd(), 'path': sys.path, 'env': dict(os.environ),\n"
                "  'flags': [sys.flags.isolated, sys.flags.no_site, sys.flags.ignore_environment],\n"
                "  'fds': sorted(os.listdir('/proc/self/fd')), 'uid': os.getuid(),\n"
                "  'cmdline': open('/proc/self/cmdline', 'rb').read().decode().split('\\0')}))\n"
            )
            assert r.exit_code == 0, r
            seen = json.loads(r.stdout)
            assert seen["cwd"] == "/workspace"
            assert all(p.startswith("/usr/lib/python3") for p in seen["path"]), seen["path"]
            assert seen["env"]["MARKER"] == "spec-env" and seen["env"]["HOME"] == "/workspace"
            assert seen["flags"] == [1, 1, 1]
            # stdin, stdout, stderr and the directory being listed: the executor's channel
            # and every other descriptor of the executor are gone.
            assert seen["fds"] == ["0", "1", "2", "3"]
            assert seen["uid"] == 1000
            # A fork of the executor: no interpreter was started for it.
            assert any(arg.startswith("/.epiflow/executor") for arg in seen["cmdline"])

    asyncio.run(body())


def test_timeout_output_cap_and_leftovers(jails: Jails) -> None:
    spec = SMALL.model_copy(update={"output_cap_bytes": 4096})

    async def body() -> None:
        async with await jails.open(spec) as box:
            slow = await box.run_python("while True:\n    pass\n", timeout_s=0.5)
            assert slow.timed_out and slow.exit_code is None and slow.signal == 9
            flood = await box.run_python("import sys\nsys.stdout.write('x' * 100000)\n")
            assert flood.exit_code == 0 and flood.stdout_truncated
            assert len(flood.stdout) == 4096
            left = await box.run_python(
                "import subprocess\nsubprocess.Popen(['sleep', '60'], start_new_session=True)\n"
            )
            assert left.exit_code == 0
            await assert_healthy(box)  # the sleeper died with the call

    asyncio.run(body())


def test_stop_processes_kills_what_the_agent_left_running(jails: Jails) -> None:
    spec = SMALL.model_copy(update={"kill_background": False})

    async def body() -> None:
        async with await jails.open(spec) as box:
            r = await shell(box, "setsid sh -c 'while true; do sleep 1; done' >/dev/null 2>&1 &")
            assert r.ok
            await shell(box, "nohup sleep 300 >/dev/null 2>&1 &")
            assert box.jail.executor_pid is not None
            ns = processes_in_namespace(_ns(box.jail.executor_pid))
            assert len(ns) >= 3  # the executor and the two survivors (and a sleep)
            await box.stop_processes()
            assert processes_in_namespace(_ns(box.jail.executor_pid)) == [box.jail.executor_pid]
            await box.stop_processes()  # nothing left: a no-op
            await assert_healthy(box)

    asyncio.run(body())


def test_verifier_modules_are_imported_while_the_jail_is_idle(jails: Jails) -> None:
    probe = (
        "import sys\nprint(sorted(m for m in ('csv', 'json', 'subprocess') if m in sys.modules))"
    )

    async def imported_once(box: NsjailSandbox, last: str) -> list[str]:
        """The probed modules the executor holds once it imported `last` (the idle imports
        run in list order; polled: no sleep stands for them)."""
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            r = await box.run_python(probe)
            found: list[str] = json.loads(r.stdout.decode().replace("'", '"'))
            if last in found:
                return found
            assert asyncio.get_running_loop().time() < deadline, f"{last} never preloaded"
            await asyncio.sleep(0.05)  # poll interval of the loop above, not a clock

    async def body() -> None:
        async with await jails.open() as box:
            # json and csv precede subprocess in the default list; the probe imports none.
            assert await imported_once(box, "subprocess") == ["csv", "json", "subprocess"]
        only_csv = SandboxSettings(verifier_preload=("csv",))
        await prepare_host(only_csv)
        jails.settings = only_csv
        async with await jails.open() as box:
            # Idle imports done (csv is the last): nothing outside the list was imported.
            assert await imported_once(box, "csv") == ["csv"]

    asyncio.run(body())


def test_a_request_is_served_before_the_idle_imports_finish(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open(SandboxSpec()) as box:
            # Sent right after the ready frame, while the executor still has modules to
            # import: the idle imports interleave with requests without disturbing them.
            r = await shell(box, "echo first")
            assert r.ok and r.stdout == b"first\n"
            assert (await box.run_python("import json; print(json.dumps(1))")).stdout == b"1\n"

    asyncio.run(body())


def _ns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")
