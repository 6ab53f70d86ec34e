"""Benchmark: generating instances of user suite templates (declared params vs a generator).

    python bench/suite_generation.py [--seeds 10] [--repeats 3]

For each template of the example suite `textops` (static, declared `params`, and the
`generator` script that runs in a fresh nsjail per seed) the suite is loaded afresh (no
cached drafts) and `Suite.instances(seeds)` is timed; the best of `--repeats` runs is kept.
Prints one JSON object on stdout: per template the kind, total seconds and milliseconds
per seed, plus the 1-minute load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox.settings import SandboxSettings
from suites.registry import load_suite
from suites.settings import SuitesSettings
from suites.user_decl import SuiteDecl
from suites.user_suite import SUITE_FILE


def _kinds() -> dict[str, str]:
    import yaml

    suite = load_suite("textops", settings=SuitesSettings(), sandbox=SandboxSettings())
    assert suite.source is not None
    decl = SuiteDecl.model_validate(yaml.safe_load((suite.source / SUITE_FILE).read_text()))
    return {
        t.name: "generator" if t.generator else "params" if t.params else "static"
        for t in decl.tasks
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, dict[str, object]] = {}
    for name, kind in _kinds().items():
        best = float("inf")
        for _ in range(args.repeats):
            # fresh: nothing cached
            suite = load_suite("textops", settings=SuitesSettings(), sandbox=SandboxSettings())
            started = time.perf_counter()
            tasks = suite.instances(args.seeds, templates=[name])
            best = min(best, time.perf_counter() - started)
            assert len(tasks) == args.seeds
        results[name] = {
            "kind": kind,
            "seconds": round(best, 4),
            "ms_per_seed": round(best * 1000 / args.seeds, 2),
            "distinct": len({t.content_digest for t in tasks}),
        }
    print(
        json.dumps(
            {
                "suite": "textops",
                "seeds": args.seeds,
                "repeats": args.repeats,
                "templates": results,
                "loadavg_1m": round(os.getloadavg()[0], 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
