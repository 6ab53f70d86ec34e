"""Benchmark: `epiflow show` rendering time on long lines without spaces.

    python bench/show.py --json [--sizes 16384,65536,262144,1048576] [--repeat 3]

For each size, two trajectories rendered by `cli.show.render_trajectory` into a
file-backed terminal of width 120 (what `epiflow show` does after loading the object),
in the default view and in `--full`:

- `message`: one assistant message of that many characters on a single line without a
  space (the imported-message case);
- `everything`: the task prompt, the assistant message, the arguments of a `write_file`
  call and the observation each that long (four such texts).

Reports the best of `--repeat` runs in seconds, and the output size. Target: a 1 MB
message in under 1 s in either view.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from agent.trajectory import ParseKind, Step, Trajectory, episode_id_for
from cli.show import render_trajectory


def long_line_trajectory(size: int, *, everywhere: bool) -> Trajectory:
    line = ("abcdefghij" * (size // 10 + 1))[:size]
    small = line if everywhere else "ok"
    step = Step(
        index=0,
        history_hash="0" * 64,
        raw_output=line,
        parse_kind=ParseKind.TOOL_CALL,
        call_id="c0",
        tool="write_file",
        args={"path": "big.txt", "content": small},
        observation=small,
        exit_code=0,
    )
    return Trajectory(
        episode_id=episode_id_for("bench-show", "t", 0),
        run_key="bench-show",
        task_id="t",
        suite="builtin",
        suite_version="1",
        template="t",
        prompt=small,
        policy="scripted:oracle",
        steps=[step],
    )


def render_seconds(t: Trajectory, *, full: bool, repeat: int) -> tuple[float, int]:
    best, size = float("inf"), 0
    for _ in range(repeat):
        sink = io.StringIO()
        console = Console(file=sink, width=120, soft_wrap=True, force_terminal=True)
        started = time.perf_counter()
        render_trajectory(t, console, max_chars=None if full else 1200)
        best = min(best, time.perf_counter() - started)
        size = len(sink.getvalue())
    return best, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16384,65536,262144,1048576")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (the default output anyway)"
    )
    args = parser.parse_args()
    results: list[dict[str, float | int | str]] = []
    for size in (int(s) for s in args.sizes.split(",")):
        for case in ("message", "everything"):
            t = long_line_trajectory(size, everywhere=case == "everything")
            default_s, default_out = render_seconds(t, full=False, repeat=args.repeat)
            full_s, full_out = render_seconds(t, full=True, repeat=args.repeat)
            results.append(
                {
                    "case": case,
                    "chars": size,
                    "default_s": round(default_s, 4),
                    "full_s": round(full_s, 4),
                    "default_output_chars": default_out,
                    "full_output_chars": full_out,
                }
            )
    worst = max(
        max(float(r["default_s"]), float(r["full_s"])) for r in results if r["case"] == "message"
    )
    print(
        json.dumps({"results": results, "worst_message_s": worst, "message_under_1s": worst < 1.0})
    )


if __name__ == "__main__":
    main()
