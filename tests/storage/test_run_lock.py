"""The run-key lock (`storage.run_lock`) on SQLite and PostgreSQL: one holder at a time, a
refusal that names the holder and `--run-key`, and a lock that dies with a SIGKILLed
holder, so a crashed run never blocks the retry that resumes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.errors import RunKeyBusy
from storage.run_lock import acquire_run_key, run_key_lock, shard_lock_name
from storage.settings import DatabaseSettings

REPO = Path(__file__).resolve().parents[2]

_HOLDER = """
import sys, time
from pydantic import SecretStr
from storage.run_lock import acquire_run_key
from storage.settings import DatabaseSettings
lock = acquire_run_key(DatabaseSettings(url=SecretStr(sys.argv[1])), sys.argv[2])
print("held", flush=True)
# The holder lives until the test kills it: a workload, not a wait.
time.sleep(600)
"""


def test_one_holder_at_a_time(db_url: str) -> None:
    settings = DatabaseSettings(url=db_url)
    with run_key_lock(settings, "nightly-1"):
        with pytest.raises(RunKeyBusy) as refused:
            acquire_run_key(settings, "nightly-1")
        line = refused.value.user_message()
        assert "nightly-1" in line and "--run-key" in line and f"pid {os.getpid()}" in line
        # Other keys, and the shards of a run, are locks of their own.
        with (
            run_key_lock(settings, "nightly-2"),
            run_key_lock(settings, shard_lock_name("nightly-1", 0, 2)),
        ):
            pass
    # Released: the next run of the key goes ahead.
    acquire_run_key(settings, "nightly-1").release()


def test_lock_dies_with_a_killed_holder(db_url: str) -> None:
    settings = DatabaseSettings(url=db_url)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, settings.url.get_secret_value(), "crashing-run"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(RunKeyBusy) as refused:
            acquire_run_key(settings, "crashing-run")
        assert f"pid {holder.pid}" in str(refused.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    # No expiry to wait for: the database (or the kernel) dropped it with the process.
    deadline = time.monotonic() + 10
    while True:
        try:
            acquire_run_key(settings, "crashing-run").release()
            break
        except RunKeyBusy:
            assert time.monotonic() < deadline, "the killed holder's lock was not released"
            # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
            time.sleep(0.1)
