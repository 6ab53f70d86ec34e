"""Benchmark: how fast `epiflow` commands start, against `python -c pass` in the same run.

    python bench/cli_start.py --json [--repeat 5]

Runs, interleaved `--repeat` times each: `python -c pass` (the interpreter's own start),
`epiflow --help`, `epiflow protocol parse --json` (one message on stdin) and `epiflow
show <episode>` (one stored episode in a temporary SQLite database and object store).
Every figure is the median wall time of its runs; `*_ratio` is that over `python_s`.
`epiflow` is the console script beside this interpreter, with this checkout first on
PYTHONPATH. Target: ≤ 10× for `--help` and `protocol parse` (issue 26). The JSON carries
the load average at start and end: on a loaded machine every start is slower, the
interpreter's included, and the ratios move less than the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MESSAGE = '<tool_call id="c1" name="list_dir">\n<arg name="path">.</arg>\n</tool_call>'


def stored_episode(root: Path) -> tuple[dict[str, str], str]:
    """A SQLite database and object store holding one episode; (environment, its id)."""
    from storage import migrate
    from storage.db import make_engine
    from storage.episodes import persist_episodes
    from storage.objects import LocalObjectStore
    from storage.settings import DatabaseSettings
    from tests.storage.builders import make_trajectory

    url = f"sqlite:///{root / 'epiflow.db'}"
    engine = make_engine(DatabaseSettings(url=url))
    migrate.upgrade(engine)
    store = LocalObjectStore(root / "objects")
    store.check()
    t = make_trajectory("cli-start", n_steps=5)
    persist_episodes(engine, store, [t])
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    env.update(
        EPIFLOW_DATABASE_URL=url,
        EPIFLOW_OBJECTS_URL=str(root / "objects"),
        EPIFLOW_HOME=str(root / "home"),
        PYTHONPATH=str(ROOT),
    )
    return env, str(t.episode_id)


def timed(argv: list[str], env: dict[str, str], stdin: str = "") -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, input=stdin, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--no-cache", action="store_true", help="Run without a bytecode cache (compile each start)."
    )
    args = parser.parse_args()
    load_start = os.getloadavg()
    epiflow = str(Path(sys.executable).parent / "epiflow")
    with tempfile.TemporaryDirectory(prefix="epiflow-cli-start-") as tmp:
        env, episode = stored_episode(Path(tmp))
        if not args.no_cache:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        cases = {
            "python": ([sys.executable, "-c", "pass"], ""),
            "help": ([epiflow, "--help"], ""),
            "protocol_parse": ([epiflow, "protocol", "parse", "--json"], MESSAGE),
            "show": ([epiflow, "show", episode], ""),
        }
        runs: dict[str, list[float]] = {name: [] for name in cases}
        if not args.no_cache:
            for argv, stdin in cases.values():
                timed(argv, env, stdin)
        for _ in range(args.repeat):
            for name, (argv, stdin) in cases.items():
                runs[name].append(timed(argv, env, stdin))
    median = {name: statistics.median(values) for name, values in runs.items()}
    result: dict[str, object] = {"python_s": round(median["python"], 4)}
    for name in ("help", "protocol_parse", "show"):
        result[f"{name}_s"] = round(median[name], 4)
        result[f"{name}_ratio"] = round(median[name] / median["python"], 2)
    result.update(
        {
            "target_ratio": 10.0,
            "repeat": args.repeat,
            "bytecode_cache": not args.no_cache,
            "all_s": {name: [round(v, 4) for v in values] for name, values in runs.items()},
            "load_avg_start": [round(x, 2) for x in load_start],
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        }
    )
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
