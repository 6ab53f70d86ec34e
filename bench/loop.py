"""Benchmark: the whole loop on CPU, from a freshly initialised model to a measured checkpoint.

    python bench/loop.py --json [--budget-s 1200] [--train-tasks 250] [--noisy-tasks 40]
                                [--heldout 10] [--hidden 128] [--layers 4] [--batch 4]
                                [--lr 3e-3] [--max-steps N] [--templates csv_to_json dir_tree]

1. Collect (no Prefect, `collection.runner`): `scripted:oracle` episodes on `--train-tasks`
   training instances per template and `scripted:noisy` episodes on `--noisy-tasks`
   instances per template, in real nsjail sandboxes, persisted to SQLite and a local
   object directory.
2. Gate: each collection run through `expectations.gate.run_gate` (rule judge, polars
   features, both GX suites) with its verdicts written by `storage.qc.write_qc_run`.
3. Snapshot: the episodes each gate admitted (`--verdicts`, default keep and downweight)
   become one SFT snapshot (`training.builders.build_rows` → `training.snapshots.write_snapshot`):
   verified, non-discarded episodes, weighted by their quality score.
4. Base model: a BPE tokenizer trained on the protocol corpus of the training instances
   and the collected episodes, a Qwen2 from a config with random weights
   (`training.pipeline.prepare_base_model`), registered as a checkpoint.
5. Train: `training.pipeline.train_checkpoint(algo="sft")` (TRL, assistant-only loss,
   weighted sampling). `train_s` is its wall time (fetching the base, training, storing
   the checkpoint); `trainer_s` is `trainer.train()` alone.
   Without `--max-steps`, the step count is what `--budget-s` leaves after everything
   else: a `--calibrate-steps` run of the same trainer on the same snapshot measures
   seconds per step, and `--eval-reserve-s` per held-out episode is kept for evaluation.
   Load that rises after the calibration makes the run overshoot (training cannot be
   stopped on time from outside `training/`); `total_s` and `load_avg` show it.
6. Evaluate the base and the trained checkpoint (fetched back from the registry) on
   `--heldout` held-out instances per template (`suite.heldout_instances`, seeds disjoint
   from every training seed) with the `hf:` policy (greedy) in real sandboxes. The base
   (random weights: `max_new_tokens` of noise every turn, the slowest episodes of the
   run) is measured on the first `--base-heldout` of them per template.
   `--dump PATH` appends every evaluated trajectory as JSONL, to see what the model wrote.

Target (issue 8): `trained_completion_rate` ≥ 0.5 where `base_completion_rate` is 0, the
whole run within 20 minutes on the 2-core CI machine. `load_avg` is the 1-minute load
average at the start and the end (the machine is shared; figures scale with it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SAVE_RESERVE_S = 20.0
"""Seconds kept for storing the checkpoint and fetching it back (registry round-trip)."""

DEFAULT_TEMPLATES = ("csv_to_json", "dir_tree")
"""The difficulty-1 templates: two-call reference solutions."""


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _log(quiet: bool, message: str) -> None:
    if not quiet:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _collect(
    engine: Any, store: Any, *, run_key: str, policy: str, tasks: int, templates: list[str]
) -> uuid.UUID:
    """One collection run (oracle or noisy) on `tasks` training instances per template."""
    from collection.request import CollectRequest
    from collection.runner import collect_in_process

    request = CollectRequest(
        run_key=run_key,
        policy=policy,
        tasks=tasks,
        rollouts=1,
        concurrency=8,
        templates=templates,
    )
    result = asyncio.run(collect_in_process(request, engine=engine, store=store))
    return result.run_id


def _gate(
    engine: Any, store: Any, run_id: uuid.UUID, config: Any
) -> tuple[uuid.UUID, dict[str, int]]:
    """The QC gate over one collection run; returns the gate run id and its verdict counts."""
    from agent.trajectory import utcnow
    from expectations.gate import run_gate
    from scoring.rule_judge import rule_judgement
    from storage.qc import write_qc_run
    from training.snapshots import select_episodes

    started = utcnow()
    trajectories = [e.trajectory for e in select_episodes(engine, store, run_ids=[run_id])]
    rules = [rule_judgement(t, config.judge) for t in trajectories]
    report = run_gate(trajectories, config=config, rule_judgements=rules)
    qc_run_id = write_qc_run(
        engine,
        run_id=run_id,
        report=report,
        judgements=rules,
        docs_key=None,
        started_at=started,
    )
    counts = {k: int(v) for k, v in report.counts.items()}
    counts["batch_passed"] = int(report.batch_passed)
    return qc_run_id, counts


def _evaluate(
    model_dir: Path, tasks: list[Any], *, run_key: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Greedy `hf:` episodes on the held-out tasks; the three metrics plus per-template rates."""
    from agent.trajectory import EpisodeStatus
    from training.evaluation import evaluation_metrics, run_model_episodes

    started = time.perf_counter()
    trajectories = asyncio.run(
        run_model_episodes(
            model_dir,
            tasks,
            run_key=run_key,
            max_steps=args.eval_max_steps,
            max_new_tokens=args.max_new_tokens,
        )
    )
    metrics = evaluation_metrics(trajectories)
    if args.dump is not None:
        with args.dump.open("a", encoding="utf-8") as out:
            for t in trajectories:
                out.write(t.model_dump_json() + "\n")
    by_template: dict[str, list[bool]] = {}
    for t in trajectories:
        by_template.setdefault(t.template, []).append(t.status == EpisodeStatus.SUCCESS)
    return {
        "completion_rate": round(metrics.completion_rate, 3),
        "avg_steps": round(metrics.avg_steps, 2),
        "tool_failure_rate": round(metrics.tool_failure_rate, 3),
        "by_template": {k: round(sum(v) / len(v), 3) for k, v in sorted(by_template.items())},
        "statuses": dict(Counter(t.status.value for t in trajectories)),
        "eval_s": round(time.perf_counter() - started, 1),
        "sample_first_turn": trajectories[0].steps[0].raw_output[:300] if trajectories else "",
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from expectations.settings import QcConfig
    from storage.db import make_engine
    from storage.migrate import upgrade
    from storage.objects import LocalObjectStore
    from storage.settings import DatabaseSettings
    from suites.registry import load_suite
    from training.base_model import protocol_corpus
    from training.builders import DatasetKind, build_rows
    from training.pipeline import prepare_base_model, train_checkpoint
    from training.registry import fetch_checkpoint
    from training.settings import TrainingSettings
    from training.snapshots import read_snapshot, select_episodes, write_snapshot
    from training.trainers import run_training

    quiet = args.quiet
    if args.keep:
        _log(quiet, "work directory kept")
    templates = list(args.templates)
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="epiflow-bench-loop-"))
    _log(quiet, f"work directory {work}")
    try:
        engine = make_engine(DatabaseSettings(url=f"sqlite:///{work / 'loop.db'}"))
        upgrade(engine)
        store = LocalObjectStore(work / "objects")
        store.check()

        # 1. collect
        started = time.perf_counter()
        oracle_run = _collect(
            engine,
            store,
            run_key="loop-oracle",
            policy="scripted:oracle",
            tasks=args.train_tasks,
            templates=templates,
        )
        noisy_run = None
        if args.noisy_tasks > 0:
            noisy_run = _collect(
                engine,
                store,
                run_key="loop-noisy",
                policy=args.noisy_policy,
                tasks=args.noisy_tasks,
                templates=templates,
            )
        collect_s = time.perf_counter() - started
        _log(quiet, f"collected in {collect_s:.1f}s")

        # 2. gate every run
        started = time.perf_counter()
        config = QcConfig.from_env()
        runs = [r for r in (oracle_run, noisy_run) if r is not None]
        gates = {r: _gate(engine, store, r, config) for r in runs}
        gate_s = time.perf_counter() - started
        _log(quiet, f"gated in {gate_s:.1f}s: {[g[1] for g in gates.values()]}")

        # 3. one SFT snapshot from what the gates admitted
        verdicts = tuple(args.verdicts)
        by_run = {
            r: select_episodes(engine, store, run_ids=[r], qc_run_id=q, verdicts=verdicts)
            for r, (q, _) in gates.items()
        }
        sources = [s for episodes in by_run.values() for s in episodes]
        built = build_rows(DatasetKind.SFT, sources)
        rows_per_run = {r: len(build_rows(DatasetKind.SFT, e).rows) for r, e in by_run.items()}
        snapshot = write_snapshot(
            engine,
            store,
            kind=DatasetKind.SFT,
            built=built,
            filter_={
                "run_ids": sorted(str(r) for r in runs),
                "qc_run_ids": sorted(str(g[0]) for g in gates.values()),
                "verdicts": sorted(verdicts),
                "templates": sorted(templates),
            },
        )
        _log(quiet, f"snapshot: {snapshot.n_rows} rows, weight {snapshot.weight_sum:.1f}")

        # 4. base model from scratch
        settings = TrainingSettings(
            seed=args.seed,
            vocab_size=args.vocab,
            hidden_size=args.hidden,
            intermediate_size=args.hidden * 4,
            num_layers=args.layers,
            num_heads=args.heads,
            num_kv_heads=args.kv_heads,
            max_length=args.max_length,
            # Room for an untrained model's eval episodes: max_steps turns of max_new_tokens
            # noise plus errors pass 2048 tokens (RoPE: no extra weights).
            max_position_embeddings=max(4096, args.max_length),
            sft_learning_rate=args.lr,
            epochs=args.epochs,
            max_steps=args.max_steps if args.max_steps is not None else 1,
            batch_size=args.batch,
            warmup_ratio=args.warmup,
            logging_steps=10,
        )
        suite = load_suite("builtin")
        train_tasks = suite.instances(args.train_tasks, templates=templates)
        corpus = protocol_corpus(train_tasks, [s.trajectory for s in sources])
        started = time.perf_counter()
        base_id = prepare_base_model(
            engine, store, work_dir=work / "base-build", corpus=corpus, settings=settings
        )
        base_dir = fetch_checkpoint(engine, store, base_id, work / "base-eval-model")
        base_build_s = time.perf_counter() - started

        heldout = suite.heldout_instances(args.heldout, templates=templates)
        # A random model writes max_new_tokens of noise on every turn, so its episodes are
        # the slowest of the run; a few held-out instances per template show it at 0.
        base_tasks = [
            t
            for name in templates
            for t in [h for h in heldout if h.template == name][: args.base_heldout]
        ]
        base_eval = _evaluate(base_dir, base_tasks, run_key="loop-eval-base", args=args)
        _log(quiet, f"base eval: {base_eval}")

        # 5. train: as many optimizer steps as the time budget leaves, measured on a short
        # run over the same snapshot (the shared machine's speed varies several-fold).
        calibrate_s, s_per_step = 0.0, None
        if args.max_steps is None:
            started = time.perf_counter()
            probe = run_training(
                "sft",
                dataset=read_snapshot(store, snapshot),
                base_model_dir=base_dir,
                output_dir=work / "calibrate",
                settings=settings.model_copy(update={"max_steps": args.calibrate_steps}),
            )
            s_per_step = probe.runtime_s / max(probe.steps, 1)
            calibrate_s = time.perf_counter() - started
            reserve = args.eval_reserve_s * len(heldout) + SAVE_RESERVE_S
            left = args.budget_s - (time.perf_counter() - t0) - reserve
            settings = settings.model_copy(update={"max_steps": max(1, int(left / s_per_step))})
            _log(quiet, f"{s_per_step:.2f}s/step: {settings.max_steps} steps fit the budget")
        started = time.perf_counter()
        outcome = train_checkpoint(
            engine,
            store,
            algo="sft",
            dataset_id=snapshot.id,
            work_dir=work / "train",
            settings=settings,
            base_checkpoint_id=base_id,
        )
        train_s = time.perf_counter() - started
        result = outcome.result
        _log(quiet, f"trained in {train_s:.1f}s: steps {result.steps}, loss {result.train_loss}")

        # 6. evaluate the registered checkpoint
        trained_dir = fetch_checkpoint(engine, store, outcome.checkpoint_id, work / "trained-model")
        trained_eval = _evaluate(trained_dir, heldout, run_key="loop-eval-trained", args=args)
        _log(quiet, f"trained eval: {trained_eval}")

        from safetensors import safe_open
        from transformers import AutoConfig

        with safe_open(str(trained_dir / "model.safetensors"), framework="pt") as tensors:
            n_params = sum(_numel(tensors.get_slice(k).get_shape()) for k in tensors.keys())  # noqa: SIM118
        config_hf = AutoConfig.from_pretrained(str(trained_dir), local_files_only=True)
        engine.dispose()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    total_s = time.perf_counter() - t0
    return {
        "base_completion_rate": base_eval["completion_rate"],
        "trained_completion_rate": trained_eval["completion_rate"],
        "train_s": round(train_s, 1),
        "episodes": len(built.rows),
        "episodes_collected": {
            "oracle": args.train_tasks * len(templates),
            "noisy": args.noisy_tasks * len(templates),
        },
        "gate": {("oracle" if r == oracle_run else "noisy"): g[1] for r, g in gates.items()},
        "sft_rows": {
            ("oracle" if r == oracle_run else "noisy"): n for r, n in rows_per_run.items()
        },
        "sft_weight_sum": round(snapshot.weight_sum, 2),
        "templates": templates,
        "heldout_instances": len(heldout),
        "base_heldout_instances": len(base_tasks),
        "trained_by_template": trained_eval["by_template"],
        "trained_avg_steps": trained_eval["avg_steps"],
        "trained_tool_failure_rate": trained_eval["tool_failure_rate"],
        "trained_statuses": trained_eval["statuses"],
        "base_avg_steps": base_eval["avg_steps"],
        "base_tool_failure_rate": base_eval["tool_failure_rate"],
        "model": {
            "hidden": args.hidden,
            "layers": args.layers,
            "heads": args.heads,
            "vocab": int(config_hf.vocab_size),
            "params": n_params,
        },
        "steps": result.steps,
        "budget_s": args.budget_s if args.max_steps is None else None,
        "calibrate_s": round(calibrate_s, 1),
        "s_per_step_calibrated": round(s_per_step, 3) if s_per_step else None,
        "batch": args.batch,
        "lr": args.lr,
        "train_loss": round(result.train_loss, 4) if result.train_loss is not None else None,
        "final_loss": result.metrics.get("loss"),
        "trainer_s": round(result.runtime_s, 1),
        "tokens": result.tokens,
        "tokens_per_s": round(result.tokens_per_s, 1),
        "collect_s": round(collect_s, 1),
        "gate_s": round(gate_s, 1),
        "base_build_s": round(base_build_s, 1),
        "base_eval_s": base_eval["eval_s"],
        "trained_eval_s": trained_eval["eval_s"],
        "max_new_tokens": args.max_new_tokens,
        "eval_max_steps": args.eval_max_steps,
        "total_s": round(total_s, 1),
        "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "trained_sample_first_turn": trained_eval["sample_first_turn"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--templates", nargs="+", default=list(DEFAULT_TEMPLATES))
    parser.add_argument(
        "--train-tasks", type=int, default=250, help="oracle instances per template"
    )
    parser.add_argument("--noisy-tasks", type=int, default=40, help="noisy instances per template")
    parser.add_argument("--noisy-policy", default="scripted:noisy")
    parser.add_argument("--verdicts", nargs="+", default=["keep", "downweight"])
    parser.add_argument("--heldout", type=int, default=10, help="held-out instances per template")
    parser.add_argument(
        "--base-heldout", type=int, default=2, help="held-out instances per template for the base"
    )
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=float, default=0.05)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument(
        "--max-steps", type=int, default=None, help="optimizer steps (default: fit --budget-s)"
    )
    parser.add_argument("--budget-s", type=float, default=1200.0, help="whole-run time budget")
    parser.add_argument("--calibrate-steps", type=int, default=4)
    parser.add_argument(
        "--eval-reserve-s", type=float, default=8.0, help="seconds kept per held-out episode"
    )
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--eval-max-steps", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--dump", type=Path, default=None, help="append the evaluated trajectories (JSONL) here"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args()
    report = run(args)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
