"""`bench/loop.py --rl-from DIR`: the RL stage and its evaluation again, from the SFT
checkpoint of a work directory an earlier run kept, with the `loop-rl` recipe's small
model (real nsjail sandboxes, the real trainer, SQLite in the work directory).

The command line is run as a user runs it, in a subprocess: a tiny first run (one
template, 4 oracle instances, 3 SFT steps, one RL step of one group), then `--rl-from`.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "--recipe", "loop-rl", "--json", "--templates", "dir_tree", "--heldout", "1",
    "--base-heldout", "1", "--rl-steps", "1", "--rl-groups", "1",
]  # fmt: skip


def _loop(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "loop.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def _report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_a_directory_that_is_not_a_kept_run_is_refused(tmp_path: Path) -> None:
    done = _loop(*SMALL, "--quiet", "--rl-from", str(tmp_path))
    assert done.returncode == 2 and not done.stdout
    assert f"--rl-from {tmp_path}: no loop.db and objects/ there" in done.stderr
    done = _loop("--recipe", "loop", "--json", "--quiet", "--rl-from", str(tmp_path))
    assert done.returncode == 2 and "needs a recipe with an RL stage, not loop" in done.stderr


def test_rl_again_from_a_kept_run_reuses_its_sft_and_evaluations(tmp_path: Path) -> None:
    first = _loop(*SMALL, "--train-tasks", "4", "--noisy-tasks", "0", "--max-steps", "3", "--keep")
    found = re.search(r"work directory (\S+)", first.stderr)
    assert found, first.stderr[-2000:]
    work = Path(found.group(1))
    try:
        report = _report(first)
        # Other templates than the run's: their held-out episodes are not there.
        wrong = _loop(*SMALL, "--templates", "checksums", "--quiet", "--rl-from", str(work))
        assert wrong.returncode == 2
        assert "evaluation run loop-eval-base has no episode of 1 of the 1" in wrong.stderr

        again = _report(_loop(*SMALL, "--rl-from", str(work)))
        assert again["rl_from"] == str(work)
        for key in ("base_completion_rate", "sft_completion_rate"):
            assert again[key] == report[key]
        assert {t: (v["base"], v["sft"]) for t, v in again["per_template"].items()} == {
            t: (v["base"], v["sft"]) for t, v in report["per_template"].items()
        }
        assert again["rl_steps"] == 1 and again["rollouts_generated"] > 0
        (point,) = again["rl_curve"]  # the step's figures, its process's memory among them
        assert point["step"] == 1 and 0 < point["rss_gib"] <= point["peak_gib"]
        assert again["rollouts_generated"] == again["rollouts_stored"]
        assert again["rl_training_run_id"] != report["rl_training_run_id"]
        # Each RL stage's report is also a file in the work directory (the first run's
        # came from its RL child), so a parent that died loses no figure.
        saved = sorted(work.glob("rl-from-*/report.json"))
        assert len(saved) == 2
        assert json.loads(saved[-1].read_text()) == again
        assert (
            json.loads(saved[0].read_text())["rl_training_run_id"] == report["rl_training_run_id"]
        )
        with sqlite3.connect(work / "loop.db") as db:
            grpo = db.execute("SELECT count(*) FROM training_run WHERE algo = 'grpo'").fetchone()
            evals = db.execute(
                "SELECT count(*) FROM collection_run WHERE run_key LIKE 'loop-eval-rl%'"
            ).fetchone()
        assert grpo == (2,) and evals == (2,)  # the earlier RL stage is left as it was
    finally:
        shutil.rmtree(work, ignore_errors=True)
