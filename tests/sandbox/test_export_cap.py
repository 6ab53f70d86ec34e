"""`epiflow sandbox run --export` never truncates silently (issue 18 item 4): past the
file-count cap (`EPIFLOW_SANDBOX_MAX_TRACKED_FILES`, 20,000 by default; 50 here so the
test stays small) the export copies the cap, counts what it left out, says so in one line
on stderr and in the JSON. Through the real CLI, on a real jail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EPIFLOW = str(Path(sys.executable).parent / "epiflow")


def sandbox_run(tmp_path: Path, cap: int, files: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    env["EPIFLOW_SANDBOX_MAX_TRACKED_FILES"] = str(cap)
    script = f"mkdir -p a/b; for i in $(seq 1 {files}); do echo $i > a/b/f$i; done"
    return subprocess.run(
        [
            EPIFLOW,
            "sandbox",
            "run",
            "--json",
            "--export",
            str(tmp_path / "out"),
            "--",
            "sh",
            "-c",
            script,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_export_past_the_file_cap_says_what_it_left_out(tmp_path: Path) -> None:
    result = sandbox_run(tmp_path, cap=50, files=120)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["export"] == {
        "files": 50,
        "bytes": record["export"]["bytes"],
        "left_out": 70,
        "skipped": 0,
        "truncated": True,
    }
    assert len(list((tmp_path / "out" / "a" / "b").iterdir())) == 50
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines[-1] == (
        f"warning: export to {tmp_path / 'out'}: 50 file(s) copied, 70 left out: "
        "70 past the file-count cap (EPIFLOW_SANDBOX_MAX_TRACKED_FILES=50)"
    )


def test_export_within_the_cap_is_quiet(tmp_path: Path) -> None:
    result = sandbox_run(tmp_path, cap=50, files=20)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["export"]["left_out"] == 0
    assert "left out" not in result.stderr
