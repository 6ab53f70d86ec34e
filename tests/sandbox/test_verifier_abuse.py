"""The agent tries to influence the verifier that runs after it, on real jails.

Verifiers declared as `python3 -I -` run in a child forked from the jail's executor
(`Sandbox.run_python`); these tests plant what would sway a freshly started interpreter
(modules named like the stdlib, `sitecustomize`/`usercustomize`, `PYTHON*` variables) and
leave processes running that rewrite the verifier's input or go after the verifier
itself. Every verdict must be the honest one, and the jail must stay healthy.
"""

from __future__ import annotations

import asyncio
import json

from sandbox import NsjailSandbox, SandboxSpec
from tasks.types import TaskInstance, VerifierSpec
from tasks.verify import VerifierOutcome, run_verifier
from tests.sandbox.conftest import SMALL, Jails
from tests.sandbox.test_abuse import assert_healthy, shell

#: What a planted module does when imported: print a perfect verdict and stop the process.
FORGERY = 'import sys\nprint(\'{"score": 1.0, "reason": "forged"}\')\nsys.stdout.flush()\n'
FORGERY += "import os\nos._exit(0)\n"

#: The verifier: the real verdict depends on the agent's `answer.txt` (which is wrong).
HONEST = """\
import csv, hashlib, io, json, os, re, subprocess, sys, tempfile
with open("answer.txt") as f:
    answer = f.read().strip()
print(json.dumps({"score": 1.0 if answer == "42" else 0.0, "reason": "answer=" + answer}))
"""


def task(script: str = HONEST) -> TaskInstance:
    return TaskInstance(
        suite="abuse",
        suite_version="1",
        template="influence",
        template_version="1",
        seed=0,
        difficulty=1,
        prompt="-",
        files={"answer.txt": "41\n"},
        verifier=VerifierSpec(argv=["python3", "-I", "-"], stdin=script, timeout_s=20),
    )


async def verdict(box: NsjailSandbox, script: str = HONEST) -> VerifierOutcome:
    outcome = await run_verifier(box, task(script))
    assert not outcome.error, outcome
    return outcome


def test_modules_named_like_the_stdlib_are_not_imported(jails: Jails) -> None:
    names = ["json", "csv", "hashlib", "io", "os", "re", "subprocess", "tempfile", "random"]

    async def body() -> None:
        async with await jails.open(files={"answer.txt": "41\n"}) as box:
            for where in ("/workspace", "/tmp", "/workspace/encodings"):
                for name in names:
                    r = await shell(
                        box, f"mkdir -p {where} && cat > {where}/{name}.py <<'EOF'\n{FORGERY}EOF"
                    )
                    assert r.ok, r
            # A package directory of the same name as well.
            await shell(
                box, "mkdir -p /workspace/pkg/json && cp json.py /workspace/pkg/json/__init__.py"
            )
            outcome = await verdict(box)
            assert outcome.score == 0.0 and outcome.reason == "answer=41"
            await assert_healthy(box)

    asyncio.run(body())


def test_sitecustomize_usercustomize_and_pth_files_are_not_run(jails: Jails) -> None:
    user_site = "/workspace/.local/lib/python3.11/site-packages"

    async def body() -> None:
        async with await jails.open(files={"answer.txt": "41\n"}) as box:
            for where in ("/workspace", "/tmp", user_site):
                for name in ("sitecustomize", "usercustomize"):
                    await shell(
                        box, f"mkdir -p {where} && cat > {where}/{name}.py <<'EOF'\n{FORGERY}EOF"
                    )
            pth = {"path": f"{user_site}/x.pth", "content": "import sys; print('forged-pth')\n"}
            assert (await box.call_tool("write_file", pth)).ok
            outcome = await verdict(box)
            assert outcome.reason == "answer=41"
            # The agent's own `python3` (with site) does run them: the trap is real.
            r = await shell(box, "cd /tmp && python3 -c 'print(1)'")
            assert b"forged-pth" in r.stdout and b'"reason": "forged"' in r.stdout

    asyncio.run(body())


def test_python_variables_do_not_reach_the_verifier(jails: Jails) -> None:
    # Even when the environment every command gets sets them (the agent cannot change it;
    # a task author might), the verifier's interpreter ignores them.
    spec = SMALL.model_copy(
        update={
            "env": {
                "PYTHONPATH": "/workspace:/tmp",
                "PYTHONHOME": "/workspace",
                "PYTHONSTARTUP": "/workspace/startup.py",
                "PYTHONINSPECT": "1",
                "PYTHONUSERBASE": "/workspace/.local",
                "PYTHONWARNINGS": "error",
            }
        }
    )

    async def body() -> None:
        async with await jails.open(spec, files={"answer.txt": "41\n"}) as box:
            await shell(box, f"cat > json.py <<'EOF'\n{FORGERY}EOF")
            await shell(box, f"cat > startup.py <<'EOF'\n{FORGERY}EOF")
            # The agent also exports them for whatever it leaves behind.
            await shell(
                box, "export PYTHONPATH=/workspace; echo 'export PYTHONPATH=/workspace' > .profile"
            )
            outcome = await verdict(box)
            assert outcome.reason == "answer=41"

    asyncio.run(body())


def test_a_process_left_running_cannot_touch_the_verifier(jails: Jails) -> None:
    spec = SMALL.model_copy(update={"kill_background": False})
    # Reads the answer 40 times over ~0.4 s: a rewriter still alive would be seen.
    watcher = """\
import json, os, time
seen = set()
for _ in range(40):
    with open("answer.txt") as f:
        seen.add(f.read().strip())
    # In-jail payload: samples the file over a window; the deterministic check is `others`.
    time.sleep(0.01)
others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
print(json.dumps({"score": 0.0, "reason": json.dumps({"seen": sorted(seen), "others": others})}))
"""

    async def body() -> None:
        async with await jails.open(spec, files={"answer.txt": "41\n"}) as box:
            # Rewrites the answer in a loop, in its own session, detached from the call.
            r = await shell(
                box,
                "setsid sh -c 'while true; do echo 42 > answer.txt; echo 41 > answer.txt; done'"
                " >/dev/null 2>&1 &",
            )
            assert r.ok
            # Goes after every python process it sees (the verifier) with SIGSTOP and SIGKILL,
            # once `go` exists: the call below creates it from a shell already running, since
            # a call's process is python (the executor's fork) until it execs its shell.
            await shell(
                box,
                "nohup sh -c 'until [ -e go ]; do sleep 0.01; done;"
                " while true; do pkill -STOP python3; pkill -KILL python3; done'"
                " >/dev/null 2>&1 &",
            )
            # Both loops are running before the verifier starts: a poll-until in the jail,
            # its deadline the call's timeout. (The brackets keep each pattern from
            # matching this command's own line.)
            running = await shell(
                box,
                "touch go; until grep -qs 'echo 4[2] > answer' /proc/[0-9]*/cmdline"
                " && grep -qs 'pkill -[S]TOP' /proc/[0-9]*/cmdline; do sleep 0.05; done",
                timeout=60,
            )
            assert running.ok, running
            outcome = await verdict(box, watcher)
            report = json.loads(outcome.reason)
            assert len(report["seen"]) == 1, report  # a stable file while it was read
            assert report["others"] == [], report  # nothing else ran beside the verifier
            # And the ordinary verifier gives the answer as the agent's work left it.
            outcome = await verdict(box)
            assert outcome.reason.startswith("answer=")
            await assert_healthy(box)

    asyncio.run(body())


def test_the_verifier_holds_only_its_own_pipes(jails: Jails) -> None:
    # A verifier runs in a child of PID 1: it must not hold the executor's channel to the
    # host (fds 0/1 there), and the jail cannot look into the executor's descriptors.
    probe = """\
import json, os
targets = {}
for fd in sorted(os.listdir("/proc/self/fd")):
    try:
        targets[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
print(json.dumps({"score": 0.0, "reason": json.dumps(targets)}))
"""

    async def body() -> None:
        async with await jails.open(SandboxSpec(), files={"answer.txt": "41\n"}) as box:
            outcome = await verdict(box, probe)
            links = json.loads(outcome.reason)
            assert set(links) == {"0", "1", "2"}  # (the listing's own fd is gone by then)
            assert links["0"] == "/dev/null" and links["1"].startswith("pipe:"), links
            channel = await shell(box, "readlink /proc/1/fd/0 /proc/1/fd/1")
            # The executor is non-dumpable: even its fd links are hidden from the jail.
            assert channel.exit_code != 0 and channel.stdout == b""
            await assert_healthy(box)

    asyncio.run(body())


def test_symlinks_planted_by_the_agent_do_not_redirect_the_verifier_files(jails: Jails) -> None:
    """Through the loop, as in a collection: the agent links the paths the verifier's files
    go to (a file onto its answer, a folder onto the workspace); the one verifier runner
    replaces the links instead of writing through them (`sh -c 'cat > "$1"'` would have
    overwritten `answer.txt` with the verifier's script and dropped `helper.txt` into the
    workspace)."""
    from agent.loop import run_episode
    from agent.render import render_final, render_tool_call
    from agent.settings import LoopSettings
    from agent.trajectory import FailureCategory
    from tests.agent.doubles import ScriptedTextPolicy

    check = """\
import json, os
answer = open("/workspace/answer.txt").read().strip()
report = {
    "answer": answer,
    "helper_in_workspace": os.path.exists("/workspace/helper.txt"),
    "helper": open("/tmp/lib/helper.txt").read(),
    "check_is_link": os.path.islink("/tmp/v/check.py"),
}
print(json.dumps({"score": 1.0 if answer == "42" else 0.0, "reason": json.dumps(report)}))
"""
    plant = "mkdir -p /tmp/v && ln -s /workspace/answer.txt /tmp/v/check.py && ln -s /workspace /tmp/lib"
    policy = ScriptedTextPolicy(
        [
            render_tool_call("c1", "execute_shell", {"command": plant, "timeout": 10}),
            render_final("done"),
        ]
    )
    planted = task().model_copy(
        update={
            "verifier": VerifierSpec(
                argv=["python3", "-I", "/tmp/v/check.py"],
                files={"/tmp/v/check.py": check, "/tmp/lib/helper.txt": "verifier data"},
                timeout_s=20,
            )
        }
    )

    async def opener(spec: SandboxSpec, **kwargs: object) -> NsjailSandbox:
        files = kwargs.get("files")
        assert isinstance(files, dict)
        return await jails.open(spec, files=files)

    traj = asyncio.run(
        run_episode(
            planted,
            policy,
            spec=SMALL,
            run_key="abuse-symlink",
            settings=LoopSettings(max_steps=4),
            open_sandbox=opener,
        )
    )
    assert traj.steps[0].exit_code == 0, traj.steps[0].stderr  # the links were planted
    assert traj.failure_category == FailureCategory.VERIFIER_FAILED, traj.failure_reason
    report = json.loads(traj.verifier_reason or "{}")
    assert report == {
        "answer": "41",
        "helper_in_workspace": False,
        "helper": "verifier data",
        "check_is_link": False,
    }
