"""Benchmark: `epiflow import --format atif` throughput and peak RSS on a large file.

    python bench/atif_import.py --json [--mb 100] [--shape steps|string|both]

Writes an ATIF v1.5 document of about `--mb` MB in a temp dir (in a process of its own),
then imports it through
`storage.exchange.import_file` (read, hostile-input checks, validation, conversion, the
trajectory object upload and the SQL rows, into a migrated SQLite database and a local
object store) in a fresh child process, which reports its own peak RSS (the import's, plus the
interpreter and the project's imports).

Shapes: `steps` is many agent steps with tool calls and observations of a few KB;
`string` is one step whose observation is one string of nearly the whole file (the
input that cost ~120x the file size before the depth check became a linear scan).

Prints one JSON object on stdout: per shape the file size, seconds, MB/s, the child's
peak RSS, its RSS before the import began (interpreter, modules, migrated database: the
constant) and what the import added over that as a multiple of the file size (issue 25's
bound: ≤ 3x + a constant), and the
load average at start and end (the machine is shared: throughput moves with the load).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_MB = 1_000_000


def _document(mb: float, shape: str) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"step_id": 1, "source": "user", "message": "Make the tests pass."}
    ]
    if shape == "string":
        body = ("x" * 79 + "\n") * int(mb * _MB / 80)
        steps.append(
            {
                "step_id": 2,
                "source": "agent",
                "message": "Reading the log.",
                "tool_calls": [
                    {"tool_call_id": "c1", "function_name": "bash", "arguments": {"cmd": "cat l"}}
                ],
                "observation": {"results": [{"source_call_id": "c1", "content": body}]},
            }
        )
    else:
        output = ('line "quoted" [x] {y} \\ ' * 100 + "\n") * 4  # ~10 KB per step
        n = max(int(mb * _MB / (len(output) + 300)), 1)
        for i in range(n):
            call = f"c{i}"
            steps.append(
                {
                    "step_id": len(steps) + 1,
                    "source": "agent",
                    "message": f"Step {i}: running the tests.",
                    "tool_calls": [
                        {
                            "tool_call_id": call,
                            "function_name": "bash",
                            "arguments": {"cmd": f"pytest -k t{i}"},
                        }
                    ],
                    "observation": {"results": [{"source_call_id": call, "content": output}]},
                    "metrics": {"prompt_tokens": 1000 + i, "completion_tokens": 20},
                }
            )
    return {
        "schema_version": "ATIF-v1.5",
        "session_id": f"bench-{shape}",
        "agent": {"name": "bench-agent", "version": "1"},
        "steps": steps,
    }


def _child(path: Path, root: Path) -> None:
    """Import `path` once (runs in the child process); prints the seconds it took."""
    from storage import migrate
    from storage.db import make_engine
    from storage.exchange import import_file
    from storage.objects import LocalObjectStore
    from storage.settings import DatabaseSettings

    engine = make_engine(DatabaseSettings(url=f"sqlite:///{root / 'bench.db'}"))
    migrate.upgrade(engine)
    store = LocalObjectStore(root / "objects")
    store.check()
    baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    report = import_file(engine, store, path, "atif")
    seconds = time.perf_counter() - start
    assert len(report.inserted) == 1, report
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # this process's peak
    print(
        json.dumps(
            {
                "seconds": seconds,
                "steps": report.steps,
                "peak_kib": peak_kib,
                "baseline_kib": baseline_kib,
            }
        )
    )


def _measure(mb: float, shape: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="epiflow-bench-atif-") as tmp:
        root = Path(tmp)
        path = root / f"{shape}.json"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        # The file is written by a process of its own: Linux carries the peak RSS across
        # exec, so a parent that had held the document would lend its peak to the child.
        subprocess.run(
            [sys.executable, __file__, "--make", str(mb), shape, str(path)], check=True, env=env
        )
        size = path.stat().st_size
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(path), str(root)],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
    peak, baseline = result["peak_kib"] * 1024, result["baseline_kib"] * 1024
    return {
        "file_mb": round(size / _MB, 1),
        "steps": result["steps"],
        "seconds": round(result["seconds"], 2),
        "mb_per_s": round(size / _MB / result["seconds"], 2),
        "peak_rss_mb": round(peak / _MB, 1),
        "baseline_rss_mb": round(baseline / _MB, 1),
        "import_rss_over_file": round((peak - baseline) / size, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="JSON on stdout (the only output)")
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--shape", choices=("steps", "string", "both"), default="both")
    parser.add_argument("--child", nargs=2, metavar=("FILE", "ROOT"), help=argparse.SUPPRESS)
    parser.add_argument("--make", nargs=3, metavar=("MB", "SHAPE", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make:
        mb, shape, out = args.make
        Path(out).write_text(json.dumps(_document(float(mb), shape)), encoding="utf-8")
        return
    if args.child:
        _child(Path(args.child[0]), Path(args.child[1]))
        return
    load_start = os.getloadavg()
    shapes = ("steps", "string") if args.shape == "both" else (args.shape,)
    report: dict[str, Any] = {"benchmark": "atif_import", "target_mb": args.mb}
    for shape in shapes:
        report[shape] = _measure(args.mb, shape)
    report["load_avg_start"] = [round(x, 2) for x in load_start]
    report["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
