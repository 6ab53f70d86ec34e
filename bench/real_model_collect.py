"""The real base model end to end: SmolLM2-135M-Instruct served by `transformers serve`,
collected through `openai:` on several built-in templates, gated, shown and reported, all
through the `epiflow` command (issue 22, done-when line 3). Prints JSON only.

    python bench/real_model_collect.py --json
    python bench/real_model_collect.py --tasks 2 --concurrency 8 --max-steps 4 --max-tokens 192 --json
    python bench/real_model_collect.py --base-url http://127.0.0.1:8000/v1 --model DIR --json

The model is `epiflow models prepare smollm2`'s cached checkpoint (converted once into
`$EPIFLOW_HOME/models/`); the server is started and stopped by
`agent.serving.serve_checkpoint` (continuous batching on), or an already running one is
used (`--base-url`). The run's data lives in a fresh temporary EPIFLOW_HOME and Prefect
home (removed afterwards unless `--keep`). Figures: episodes, the collect command's wall
time, episodes/s, generation tokens/s (the server's `usage.completion_tokens`, read from
the `step` table), completion rate (0 is expected of a base model: it answers in prose or
code, not in the tool-call protocol), the outcome of `epiflow qc`, `epiflow show` and
`epiflow report`, and the load average.
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
import uuid
from pathlib import Path
from typing import Any

DEFAULT_TEMPLATES = (
    "csv_to_json",
    "dir_tree",
    "config_update",
    "log_errors",
    "summary_stats",
    "largest_files",
)
"""Six built-in templates, easy to hard."""


def _epiflow(
    args: list[str], env: dict[str, str], *, timeout_s: float
) -> tuple[int, str, str, float]:
    """One `epiflow` command: exit code, stdout, stderr, wall seconds."""
    cli = Path(sys.executable).with_name("epiflow")
    started = time.perf_counter()
    done = subprocess.run(
        [str(cli), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr, time.perf_counter() - started


def _last_json(text: str) -> dict[str, Any]:
    """The last line of `text` that is a JSON object (`--json` output)."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            parsed: dict[str, Any] = json.loads(line)
            return parsed
    raise SystemExit(f"no JSON in the output: {text[-400:]}")


def _token_figures(database_url: str, run_key: str) -> dict[str, Any]:
    """Turns, generated and prompt tokens, mean request latency of the run, from SQL."""
    from sqlalchemy import Uuid, bindparam, create_engine, text

    from models import run_id_for

    def query(sql: str) -> Any:
        return text(sql).bindparams(bindparam("run", type_=Uuid()))

    run = {"run": run_id_for(run_key)}
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                query(
                    "SELECT COUNT(*), SUM(s.completion_tokens), SUM(s.prompt_tokens), "
                    "AVG(s.generation_latency_ms), SUM(s.endpoint_retries), "
                    "COUNT(DISTINCT s.response_model) "
                    "FROM step s JOIN episode e ON e.id = s.episode_id WHERE e.run_id = :run"
                ),
                run,
            ).one()
            kinds = dict(
                conn.execute(
                    query(
                        "SELECT s.parse_kind, COUNT(*) FROM step s JOIN episode e "
                        "ON e.id = s.episode_id WHERE e.run_id = :run GROUP BY s.parse_kind"
                    ),
                    run,
                ).all()
            )
            first = conn.execute(
                query("SELECT id FROM episode WHERE run_id = :run ORDER BY id LIMIT 1"),
                run,
            ).scalar()
    finally:
        engine.dispose()
    return {
        "turns": int(row[0] or 0),
        "completion_tokens": int(row[1] or 0),
        "prompt_tokens": int(row[2] or 0),
        "mean_request_latency_s": round(float(row[3] or 0) / 1000, 2),
        "endpoint_retries": int(row[4] or 0),
        "response_models": int(row[5] or 0),
        "parse_kinds": {str(k): int(v) for k, v in kinds.items()},
        "first_episode": str(uuid.UUID(str(first))) if first is not None else None,
    }


def run(args: argparse.Namespace, base_url: str, model: str, home: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "EPIFLOW_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "EPIFLOW_AGENT_LOOP_MAX_STEPS": str(args.max_steps),
        "EPIFLOW_AGENT_LOOP_MAX_CONSECUTIVE_PARSE_FAILURES": str(args.max_steps),
        "EPIFLOW_AGENT_POLICY_MAX_TOKENS": str(args.max_tokens),
        "EPIFLOW_AGENT_POLICY_REQUEST_TIMEOUT_S": str(args.request_timeout_s),
        "EPIFLOW_AGENT_LOOP_POLICY_TIMEOUT_S": str(args.request_timeout_s),
    }
    key = f"real-model-{time.strftime('%Y%m%dT%H%M%S')}"
    templates = [t for t in args.templates.split(",") if t]
    code, _, err, _ = _epiflow(["db", "upgrade"], env, timeout_s=300)
    if code:
        raise SystemExit(f"epiflow db upgrade exited {code}: {err.strip()[-600:]}")
    load_before = [round(x, 2) for x in os.getloadavg()]
    code, out, err, wall = _epiflow(
        [
            "collect",
            "--suite",
            "builtin",
            "--policy",
            f"openai:{base_url}#{model}",
            "--templates",
            ",".join(templates),
            "--tasks",
            str(args.tasks),
            "--rollouts",
            "1",
            "--concurrency",
            str(args.concurrency),
            "--run-key",
            key,
            "--json",
        ],
        env,
        timeout_s=args.timeout_s,
    )
    load_after = [round(x, 2) for x in os.getloadavg()]
    if code not in (0, 3):
        raise SystemExit(f"epiflow collect exited {code}: {err.strip()[-600:]}")
    collected = _last_json(out)
    tokens = _token_figures(f"sqlite:///{home / 'epiflow.db'}", key)
    qc_code, qc_out, qc_err, qc_wall = _epiflow(
        ["qc", "--run", key, "--trigger", "none", "--json"], env, timeout_s=600
    )
    gate = _last_json(qc_out) if qc_code == 0 else {"error": qc_err.strip()[-400:]}
    shown: dict[str, Any] = {"episode": tokens["first_episode"]}
    if tokens["first_episode"]:
        show_code, show_out, _, _ = _epiflow(["show", tokens["first_episode"]], env, timeout_s=120)
        shown |= {"exit_code": show_code, "lines": len(show_out.splitlines())}
    report_file = home / "report.html"
    report_code, _, report_err, _ = _epiflow(
        ["report", "--run", key, "--out", str(report_file)], env, timeout_s=300
    )
    _epiflow(["prefect", "stop"], env, timeout_s=60)
    episodes = int(collected.get("executed") or collected.get("episodes") or 0)
    return {
        "model": model,
        "templates": templates,
        "tasks_per_template": args.tasks,
        "concurrency": args.concurrency,
        "max_steps": args.max_steps,
        "max_tokens": args.max_tokens,
        "run_key": key,
        "collect_exit_code": code,
        "episodes": episodes,
        "by_status": collected.get("by_status"),
        "completion_rate": collected.get("success_rate"),
        "wall_s": round(wall, 1),
        "episodes_per_s": round(episodes / wall, 4) if wall else 0.0,
        "generation_tokens_per_s": round(tokens["completion_tokens"] / wall, 2) if wall else 0.0,
        **{k: v for k, v in tokens.items() if k != "first_episode"},
        "qc": {"exit_code": qc_code, "wall_s": round(qc_wall, 1), **gate},
        "show": shown,
        "report": {
            "exit_code": report_code,
            "bytes": report_file.stat().st_size if report_file.exists() else 0,
            **({"error": report_err.strip()[-300:]} if report_code else {}),
        },
        "load_average_before": load_before,
        "load_average_after": load_after,
        "home": str(home) if args.keep else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, help="checkpoint to serve (default: SmolLM2)")
    parser.add_argument("--base-url", help="or a running server (e.g. http://127.0.0.1:8000/v1)")
    parser.add_argument("--model", help="with --base-url: the model name it serves")
    parser.add_argument("--templates", default=",".join(DEFAULT_TEMPLATES))
    parser.add_argument("--tasks", type=int, default=2, help="instances per template")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=4, help="assistant turns per episode")
    parser.add_argument("--max-tokens", type=int, default=192, help="tokens per turn")
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        default=1800.0,
        help="one turn's deadline (a CPU server shared at load 10+ takes minutes a turn)",
    )
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="of the collect command")
    parser.add_argument("--keep", action="store_true", help="keep the run's EPIFLOW_HOME")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="epiflow-bench-real-"))
    try:
        if args.base_url:
            figures = run(args, args.base_url, args.model or "", home)
        else:
            from agent.serving import serve_checkpoint
            from agent.settings import PolicySettings
            from core.home import epiflow_home
            from training.pretrained import SMOLLM2, prepare_pretrained

            model_dir = args.model_dir or prepare_pretrained(SMOLLM2, home=epiflow_home())
            serving = serve_checkpoint(
                model_dir, log_path=home / "serve.log", policy=PolicySettings()
            )
            with serving as served:
                figures = run(args, served.base_url, served.model, home)
    finally:
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
