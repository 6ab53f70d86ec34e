"""The collection benchmark's floor (`bench/collect_floor.py`) replays recorded executor
requests through the real in-jail executor started on the host (no nsjail: that is the
point of the floor), and says when an answer's outcome differs from the recorded one.
Nothing here is timed."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sandbox.host import EXECUTOR_SOURCE

ROOT = Path(__file__).resolve().parents[2]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def _episode(expected_exit: int) -> list[dict[str, Any]]:
    run = {"timeout_s": 10.0, "cap": 65536, "stdin": None, "track": True}
    return [
        {
            "payload": {"op": "put_files", "files": {"a.txt": _b64("hello\n")}},
            "outcome": {"ok": None, "exit_code": None, "timed_out": None},
        },
        {
            "payload": {"op": "exec", "argv": ["/bin/sh", "-c", "grep -q hello /workspace/a.txt"]}
            | run,
            "outcome": {"ok": None, "exit_code": expected_exit, "timed_out": False},
        },
        {
            "payload": {"op": "write_file", "path": "/workspace/b.txt", "content": _b64("x")}
            | {"cap": 65536, "track": True},
            "outcome": {"ok": True, "exit_code": None, "timed_out": None},
        },
        {
            "payload": {"op": "read_file", "path": "b.txt", "cap": 65536, "track": True},
            "outcome": {"ok": True, "exit_code": None, "timed_out": None},
        },
        {
            "payload": {"op": "run_python", "script": "import sys; sys.exit(3)", "args": []}
            | run
            | {"track": False},
            "outcome": {"ok": None, "exit_code": 3, "timed_out": False},
        },
    ]


def test_the_floor_replays_recorded_requests_through_the_host_executor(tmp_path: Path) -> None:
    config = {"env": {"PATH": "/usr/bin:/bin"}, "kill_background": True, "preload": ["json"]}
    recording = tmp_path / "recording.json"
    recording.write_text(
        json.dumps(
            {
                "python": sys.executable,
                "executor": str(EXECUTOR_SOURCE),
                "config": config,
                "concurrency": 2,
                # Three episodes as recorded; the fourth's record says its grep failed,
                # which the replay does not do: one mismatched answer.
                "episodes": [_episode(0), _episode(0), _episode(0), _episode(1)],
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "bench" / "collect_floor.py"), str(recording)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    out = json.loads(done.stdout)
    assert (out["episodes"], out["requests"], out["mismatched"]) == (4, 20, 1)
    assert out["floor_s"] > 0
    # Every episode had its own workspace (under TMPDIR), removed afterwards.
    assert not list(tmp_path.glob("epiflow-floor-*"))
