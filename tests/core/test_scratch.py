"""Scratch directories of killed processes are swept by the next one: a real child
process creates one and is SIGKILLed (it cannot clean up), and the next `scratch_dir` of
that prefix removes it, while a live owner's directory and a directory without an owner
stay."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from core.scratch import OWNER_FILE, scratch_dir, sweep_scratch

CHILD = """
import sys, time
from pathlib import Path
from core.scratch import scratch_dir
with scratch_dir("epiflow-train-", Path(sys.argv[1])) as d:
    (d / "model.bin").write_bytes(b"x" * 1024)
    print(d, flush=True)
    # The child lives until the test kills it: a workload, not a wait.
    time.sleep(600)
"""


def test_a_killed_owners_directory_is_swept_by_the_next(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert child.stdout is not None
    with child.stdout:
        orphan = Path(child.stdout.readline().strip())
    assert (orphan / "model.bin").is_file()
    assert sweep_scratch("epiflow-train-", tmp_path) == []  # its owner is alive: kept
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert orphan.is_dir()  # SIGKILL: nothing could clean up

    foreign = tmp_path / "epiflow-train-foreign"
    foreign.mkdir()  # no owner file: not ours to judge
    with scratch_dir("epiflow-train-", tmp_path) as mine:
        assert not orphan.exists()
        assert foreign.is_dir() and (mine / OWNER_FILE).is_file()
        assert sweep_scratch("epiflow-train-", tmp_path) == []  # this process is alive
    assert not mine.exists()  # removed on exit


def test_a_reused_pid_does_not_keep_a_directory(tmp_path: Path) -> None:
    stale = tmp_path / "epiflow-eval-stale"
    stale.mkdir()
    host = socket.gethostname()
    # This process's pid with another start time: the pid was reused, the owner is gone.
    (stale / OWNER_FILE).write_text(f"{host} {os.getpid()} 1\n")
    assert sweep_scratch("epiflow-eval-", tmp_path) == [stale]
    assert not stale.exists()
