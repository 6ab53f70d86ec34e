"""Benchmark: how long commands wait for Prefect's API, shared local server vs per-process.

    python bench/prefect_api.py --json [--commands 4]

`--commands` processes start at the same moment and each waits until a Prefect API
answers `/health` (timed after imports), two ways, each in a fresh Prefect home:

- `ephemeral_*`: each process starts Prefect's own temporary server
  (`SubprocessASGIServer`, what Prefect does without PREFECT_API_URL) with the timeout
  Prefect uses (20 s), as `epiflow` did before issue 18; failures are counted, not hidden.
- `shared_*`: each process attaches to the shared local server (`orchestration.prefect_server`):
  the first starts it, the others wait on its lock and reuse it.
- `shared_warm_attach_ms`: one more process attaching to the running shared server.

Per way: wall time until every process had an API (`*_all_ready_s`), the slowest and
fastest process, and how many failed. Prints only JSON on stdout (with the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EPHEMERAL = """
import json, time
from prefect.server.api.server import SubprocessASGIServer
t = time.monotonic()
server = SubprocessASGIServer()
try:
    server.start(timeout=20)
    ok = True
except Exception as e:
    ok = False
ready = time.monotonic() - t
print(json.dumps({"ok": ok, "ready_s": ready}), flush=True)
server.stop()
"""

SHARED = """
import json, time
from orchestration.prefect_server import attach
from config.settings import PrefectSettings
t = time.monotonic()
try:
    attach(PrefectSettings(start_timeout_s=300, local_idle_s=30))
    ok = True
except Exception:
    ok = False
print(json.dumps({"ok": ok, "ready_s": time.monotonic() - t}), flush=True)
"""


def _run_all(code: str, home: Path, n: int) -> dict[str, float | int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "EPIFLOW_"))}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    env["PYTHONPATH"] = str(ROOT)
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            cwd=home,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        for _ in range(n)
    ]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=900)
        line = out.strip().splitlines()[-1] if out.strip() else '{"ok": false, "ready_s": 0}'
        results.append(json.loads(line))
    ready = [r["ready_s"] for r in results if r["ok"]]
    return {
        "all_ready_s": round(time.monotonic() - started, 2),
        "slowest_s": round(max(ready), 3) if ready else 0.0,
        "fastest_s": round(min(ready), 3) if ready else 0.0,
        "failed": sum(1 for r in results if not r["ok"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="(the only output format)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from orchestration.prefect_server import server_dir, stop

    report: dict[str, object] = {
        "commands": args.commands,
        "load_avg_1m_before": os.getloadavg()[0],
    }
    home = Path(tempfile.mkdtemp(prefix="epiflow-bench-ephemeral-"))
    try:
        for key, value in _run_all(EPHEMERAL, home, args.commands).items():
            report[f"ephemeral_{key}"] = value
    finally:
        shutil.rmtree(home, ignore_errors=True)
    home = Path(tempfile.mkdtemp(prefix="epiflow-bench-shared-"))
    try:
        for key, value in _run_all(SHARED, home, args.commands).items():
            report[f"shared_{key}"] = value
        warm = _run_all(SHARED, home, 1)
        report["shared_warm_attach_ms"] = round(float(warm["slowest_s"]) * 1000, 1)
    finally:
        stop(server_dir(home))
        shutil.rmtree(home, ignore_errors=True)
    report["load_avg_1m_after"] = os.getloadavg()[0]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
