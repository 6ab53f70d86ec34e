"""Benchmark: the full QC gate (GX) against the same checks written directly in polars.

    python bench/qc.py --json [--episodes 100000] [--repeat 3]

Synthetic batch (seeded): episodes over 20 task templates with ~6 steps each, ~3% parse
errors, repeated calls, blind writes, env errors and fabrications sprinkled in, and a
rule-judge frame (the rule judge itself is per-trajectory Python and costs the same in
both paths, so it is not timed). Both timings start from the episode/step/judge frames:

- `gate_s`: features (polars) + both GX suites (episode suite COMPLETE with episode ids,
  batch suite SUMMARY) + verdicts and quality scores; no database writes.
- `polars_s`: the same features + the same suites evaluated by
  `expectations.polars_checks` + the same verdicts and scores.

`ratio = gate_s / polars_s`, best of `--repeat` runs each after one warm-up run; GX's one-off import time is
reported separately (`gx_import_s`), not in `gate_s`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import polars as pl

from expectations.features import compute_features
from expectations.frames import EPISODE_SCHEMA, JUDGE_SCHEMA, STEP_SCHEMA, QcFrames
from expectations.gate import evaluate_features
from expectations.gx_runner import import_gx
from expectations.report import GateReport
from expectations.settings import GateSettings, QcConfig
from scoring.settings import QualitySettings, RewardSettings, RuleJudgeSettings

T = TypeVar("T")
TEMPLATES = 20
TOOLS = np.array(["list_dir", "read_file", "execute_shell", "write_file"])


def synthetic_frames(n: int, seed: int) -> tuple[QcFrames, pl.DataFrame]:
    """Episode, step and judge frames for `n` episodes."""
    rng = np.random.default_rng(seed)
    ids = np.array([f"ep{i:07d}" for i in range(n)])
    template = rng.integers(0, TEMPLATES, n)
    n_steps = np.clip(rng.poisson(5, n) + 2, 2, 40)
    status = np.where(
        rng.random(n) < 0.01, "env_error", np.where(rng.random(n) < 0.6, "success", "failed")
    )
    category = np.select(
        [status == "success", status == "env_error"],
        ["success", "env_error"],
        default="verifier_failed",
    )
    score = np.where(
        status == "success", 1.0, np.where(status == "env_error", np.nan, rng.random(n) * 0.9)
    )
    episodes = pl.DataFrame(
        {
            "episode_id": ids,
            "task_id": [f"t{t}" for t in template],
            "template": [f"tmpl{t}" for t in template],
            "policy": np.full(n, "scripted:noisy"),
            "status": status,
            "failure_category": category,
            "verifier_score": score,
            "duration_ms": rng.gamma(4.0, 500.0, n) * n_steps,
        },
    ).with_columns(pl.col("verifier_score").fill_nan(None))
    total = int(n_steps.sum())
    owner = np.repeat(np.arange(n), n_steps)
    index = np.arange(total) - np.repeat(np.cumsum(n_steps) - n_steps, n_steps)
    last = index == n_steps[owner] - 1
    parse_error = (rng.random(total) < 0.03) & ~last
    tool = np.where(index == 0, "list_dir", TOOLS[rng.integers(0, 4, total)])
    called = ~parse_error & ~last
    arg = rng.integers(0, 40, total)
    failed = called & (rng.random(total) < 0.08)
    called_expr = pl.col("called")
    steps = (
        pl.DataFrame(
            {
                "episode_id": ids[owner],
                "index": index.astype(np.int64),
                "parse_kind": np.where(last, "final", np.where(parse_error, "error", "tool_call")),
                "has_parse_error": parse_error,
                "called": called,
                "raw_tool": tool,
                "arg": arg,
                "failed": failed,
                "transient": failed & (rng.random(total) < 0.3),
                "raw_duration": rng.gamma(2.0, 20.0, total),
            }
        )
        .with_columns(
            pl.when(called_expr).then(pl.format("c{}", pl.col("index"))).alias("call_id"),
            pl.when(called_expr).then(pl.col("raw_tool")).alias("tool"),
            pl.when(called_expr)
            .then(pl.format('{}{{"path": "f{}"}}', pl.col("raw_tool"), pl.col("arg")))
            .alias("signature"),
            pl.when(pl.col("failed")).then(pl.lit("nonzero_exit")).alias("error_type"),
            pl.when(called_expr).then(pl.col("raw_duration")).alias("duration_ms"),
            (called_expr & (pl.col("raw_tool") == "write_file") & ~pl.col("failed"))
            .cast(pl.Int64)
            .alias("n_files_changed"),
        )
        .select(list(STEP_SCHEMA))
        .cast(STEP_SCHEMA)  # type: ignore[arg-type]
    )
    judge = pl.DataFrame(
        {
            "episode_id": ids,
            "rubric_mean": np.round(rng.uniform(2.0, 5.0, n), 2),
            "n_blind_writes": (rng.random(n) < 0.03).astype(np.int64),
            "n_fabrications": (rng.random(n) < 0.02).astype(np.int64),
            "n_safety_violations": (rng.random(n) < 0.005).astype(np.int64),
            "false_final_claim": rng.random(n) < 0.05,
        }
    ).cast(JUDGE_SCHEMA)  # type: ignore[arg-type]
    return QcFrames(episodes=episodes.cast(EPISODE_SCHEMA), steps=steps), judge  # type: ignore[arg-type]


def _time(fn: Callable[[], T], repeat: int) -> tuple[float, T]:
    """Best wall time of `repeat` calls, and the last result."""
    best = float("inf")
    out = fn()
    for _ in range(repeat):
        started = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - started)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (the default output anyway)"
    )
    args = parser.parse_args()

    config = QcConfig(
        gate=GateSettings(),
        rewards=RewardSettings(),
        judge=RuleJudgeSettings(),
        quality=QualitySettings(),
    )
    frames, judge = synthetic_frames(args.episodes, args.seed)
    started = time.perf_counter()
    import_gx()
    gx_import_s = time.perf_counter() - started

    def features() -> pl.DataFrame:
        return compute_features(frames, judge, gate=config.gate, rewards=config.rewards)

    def gate() -> GateReport:
        return evaluate_features(features(), config=config, engine="gx")

    def reference() -> GateReport:
        return evaluate_features(features(), config=config, engine="polars")

    features_s, _ = _time(features, args.repeat)
    gate_s, gx_report = _time(gate, args.repeat)
    polars_s, pl_report = _time(reference, args.repeat)
    same = (
        gx_report.verdicts.sort("episode_id")
        .with_columns(pl.col("reasons").list.sort())
        .equals(pl_report.verdicts.sort("episode_id").with_columns(pl.col("reasons").list.sort()))
    )
    result = {
        "episodes": args.episodes,
        "steps": frames.steps.height,
        "gate_s": round(gate_s, 3),
        "polars_s": round(polars_s, 3),
        "ratio": round(gate_s / polars_s, 2),
        "features_s": round(features_s, 3),
        "gx_import_s": round(gx_import_s, 3),
        "verdicts_identical": same,
        "counts": gx_report.counts,
        "batch_passed": gx_report.batch_passed,
        "repeat": args.repeat,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
