"""Benchmark: the whole loop on CPU, from a freshly initialised model to a measured checkpoint.

    python bench/loop.py --json [--recipe loop] [--budget-s 1200] [--iterations 1]
                                [--train-tasks N] [--noisy-tasks N] [--heldout N]
                                [--curve-every-s S] [--dump PATH] [--keep] [--quiet]
                                [--rl-steps N] [--rl-groups N] [--rl-tokens-per-step N]
    python bench/loop.py --recipe smollm2-rl --json --rl-from DIR [--rl-steps N] …

Everything not given on the command line comes from the recipe (`training.recipes`,
default `loop`): templates, oracle and noisy instances per template, the model shape, the
compact prompt, the optimiser and schedule, the evaluation limits.

1. Collect (no Prefect, `collection.runner.collect_in_process`): `scripted:oracle` on the
   recipe's training instances per template and `scripted:noisy` on its noisy ones, in
   real nsjail sandboxes, persisted to SQLite and a local object directory.
2. Gate: each collection run through `expectations.gate.run_gate` (rule judge, polars
   features, both GX suites), verdicts written by `storage.qc.write_qc_run`.
3. Snapshot: the episodes the gates admitted become one SFT snapshot in the recipe's
   prompt style (`training.builders.build_rows` → `training.snapshots.write_snapshot`).
4. Base model: a tokenizer trained on the protocol corpus of the training instances and
   the collected episodes, a model with random weights from the recipe's shape
   (`training.pipeline.prepare_base_model`), registered as a checkpoint.
5. Base evaluation: the base model on the first `--base-heldout` held-out instances per
   template (random weights write `max_new_tokens` of noise every turn: the slowest
   episodes of the run, and always 0).
6. Train: `training.pipeline.train_checkpoint(algo="sft")` with the recipe's settings: a
   step budget (`max_steps`, the `loop` and `demo` recipes: load changes the time, not
   the result), or, for a recipe without one, `max_time_s` = what the budget leaves after
   the reserve for evaluation and saving (`training.callbacks.WallTimeStop`).
7. Evaluate the registered checkpoint on `--heldout` held-out instances per template
   (`suite.heldout_instances`: seeds disjoint from every training seed), greedy `hf:`
   policy, real sandboxes: completion overall and per template, and the turn rates
   against the reference solutions (`training.evaluation`).
8. With `--iterations N > 1`, expert iteration (rejection-sampling fine-tuning): collect
   with the last checkpoint as the policy (`hf:`) on fresh training instances, gate, add
   its verified successes to the snapshot, train on from the last checkpoint for the
   iteration's time share, evaluate again. Completion is reported after every iteration.

`--recipe smollm2` (issue 23) trains a real model instead: step 4 is SmolLM2-135M-Instruct
(`training.pretrained`, converted once, cached under `$EPIFLOW_HOME/models/`, copied into
the work directory and registered as the base checkpoint), and steps 5 and 7 serve each
checkpoint with `transformers serve` (`agent.serving.serve_checkpoint`, the recipe's
server threads) and run the episodes through the `openai:` policy with the recipe's
prompt style (`?prompt_style=compact`), turn and token limits and concurrency. After
training it times `bench/train.py`'s bare torch loop for `bare_torch_steps` steps on the
snapshot's own chats (`bare_torch`, `trl_vs_bare_torch`). Infrastructure outcomes are
left out of every rate and counted (`infrastructure_episodes`). Target: base ≤ 0.1,
trained ≥ 0.5 overall and on ≥ 4 of its 6 templates, ≤ 30 minutes on the quiet 2-core
machine; `per_template` has {template: {base, trained}}.

`--recipe smollm2-rl` (issue 42) runs the smollm2 recipe, then agentic GRPO from its SFT
checkpoint (`bench/loop_rl.py`: `collection.grpo_training.train_grpo_model`, what `epiflow
train --algo grpo` runs; every rollout a stored, gated episode in a real sandbox), and
evaluates base, SFT and RL on the same held-out instances (8 per template, 48 episodes)
through `transformers serve` and `openai:`: `sft_completion_rate`, `rl_completion_rate`,
`per_template` as {template: {base, sft, rl}}, the RL stage's counts (`rl_steps`,
`groups_used`, `groups_dropped_zero_variance`, `infrastructure_rollouts`,
`rollouts_generated`, `rollouts_stored` read from SQL), `rollout_tokens_per_s`,
`trainer_tokens_per_s` and `rl_s`. Its budget is `--rl-steps` optimiser steps of
`--rl-tokens-per-step` tokens (seed 000 §4.4, converted into whole groups from the
measured rollout length before training; `rl_settings` records the budget and the groups)
or `--rl-groups` groups (groups win when both are given), default the recipe's `RlStage`
(smollm2-rl: 5 steps of 32,768 tokens), never seconds. `--recipe loop-rl`
does the same with the `loop` recipe's small model (`hf:` evaluation): the path in minutes.
`--rl-from DIR` runs only the RL stage and its evaluation again, from the SFT checkpoint
and oracle collection of a work directory such a run kept (`--keep`), on the same
held-out instances; the base and SFT figures are that run's stored evaluations, re-read
from SQL (`bench/loop_rl_from.py`: `run_rl_from`): an RL setting can be tried, or the RL
stage repeated, without the ~50 minutes of base evaluation, SFT and SFT evaluation before
it. A whole run does its own RL stage that way too, in a fresh process
(`rl_stage_in_child`): on top of what the earlier stages left in this one, `smollm2-rl`'s
GRPO was killed for memory.

`--curve-every-s S` also saves the model every S seconds of training and evaluates each
save afterwards (completion against training minutes; outside the budget, `curve_s`).

Target (issue 15): `trained_completion_rate` ≥ 0.5 where `base_completion_rate` is 0, the
whole run within `--budget-s` (20 minutes) on the 2-core machine. `load_avg` is the
1-minute load average at the start and the end (the machine is shared); `cpu_share` is
the CPU time training got per wall second. `bf16` / `autocast` say whether the SFT ran
under bf16 autocast (the recipe's precision: fp32 for `loop`, `auto` for `smollm2`;
`EPIFLOW_TRAINING_PRECISION=fp32|bf16` forces one), `eval_dtype` the dtype the trained
checkpoint was evaluated in, `precision` all of it (`training.precision.precision_report`,
with `bf16_native`: whether this CPU runs bf16 natively). stdout carries only the JSON
(or `key: value` lines without `--json`); progress goes to stderr.

This file runs the stages (`run`) and the command line (`main`); beside it,
`bench/loop_setup.py` applies the recipe to the command line, `bench/loop_eval.py` runs
and summarises the evaluations, `bench/loop_rl_from.py` runs `--rl-from` and the whole
run's RL stage in its fresh process, and `bench/loop_rl.py` is the RL stage itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# This folder: the script's own, first on sys.path (as mypy maps bench/: no package).
from loop_eval import base_heldout_tasks, evaluate
from loop_rl_from import rl_stage_in_child, run_rl_from
from loop_setup import LoopInputError, apply_recipe, log

SAVE_RESERVE_S = 25.0
"""Seconds kept for storing the checkpoint and fetching it back (registry round-trip)."""


def _iteration_steps(total: int, n_iter: int, it: int, first_share: float) -> int:
    """Iteration `it`'s SFT steps of a `total`-step budget: all of it for one iteration;
    `first_share` of it for the first of several, the rest split evenly."""
    if n_iter == 1:
        return total
    first = max(1, round(total * first_share))
    if it == 1:
        return first
    return max(1, (total - first) // (n_iter - 1))


def _collect(
    engine: Any,
    store: Any,
    *,
    run_key: str,
    policy: str,
    tasks: int,
    templates: list[str],
    seed: int = 0,
    concurrency: int = 8,
) -> uuid.UUID:
    """One collection run on `tasks` training instances per template (from instance `seed`)."""
    from collection.request import CollectRequest
    from collection.runner import collect_in_process

    request = CollectRequest(
        run_key=run_key,
        policy=policy,
        tasks=tasks,
        rollouts=1,
        concurrency=concurrency,
        templates=templates,
        seed=seed,
    )
    return asyncio.run(collect_in_process(request, engine=engine, store=store)).run_id


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


class _Curve:
    """Saves the model every `every_s` seconds of training (for the completion curve)."""

    def __init__(self, every_s: float | None) -> None:
        self.every_s = every_s
        self.losses: list[dict[str, float]] = []
        self._started: float | None = None

    def on_metrics(self, step: int, max_steps: int, logs: dict[str, float]) -> None:
        now = time.perf_counter()
        if self._started is None:
            self._started = now
        if "loss" in logs:
            self.losses.append(
                {"step": step, "s": round(now - self._started, 1), "loss": round(logs["loss"], 4)}
            )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from loop_rl import cpu_flags

    from config.settings import load_qc_config
    from core.home import epiflow_home
    from storage.db import make_engine
    from storage.migrate import upgrade
    from storage.objects import LocalObjectStore
    from storage.settings import DatabaseSettings
    from suites.builtin import builtin_suite
    from training.base_model import protocol_corpus
    from training.builders import DatasetKind, build_rows
    from training.pipeline import prepare_base_model, train_checkpoint
    from training.precision import precision_report
    from training.pretrained import PRETRAINED, prepare_pretrained, register_pretrained
    from training.registry import fetch_checkpoint, get_checkpoint
    from training.snapshots import select_episodes, write_snapshot
    from training.threads import tuned_threads

    quiet = args.quiet
    recipe, settings, templates, train_tasks, noisy_tasks, heldout_n = apply_recipe(args)
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="epiflow-bench-loop-"))
    args.work = work
    log(quiet, f"recipe {recipe.name}, work directory {work}")
    iterations: list[dict[str, Any]] = []
    try:
        engine = make_engine(DatabaseSettings(url=f"sqlite:///{work / 'loop.db'}"))
        upgrade(engine)
        store = LocalObjectStore(work / "objects")
        store.check()
        args.engine, args.store = engine, store

        # 1. collect
        started = time.perf_counter()
        runs = {
            "oracle": _collect(
                engine,
                store,
                run_key="loop-oracle",
                policy="scripted:oracle",
                tasks=train_tasks,
                templates=templates,
            )
        }
        if noisy_tasks > 0:
            # Other instances than the oracle's (same seeds would repeat its tasks).
            runs["noisy"] = _collect(
                engine,
                store,
                run_key="loop-noisy",
                policy=recipe.noisy_policy,
                tasks=noisy_tasks,
                templates=templates,
                seed=train_tasks,
            )
        collect_s = time.perf_counter() - started
        log(quiet, f"collected in {collect_s:.1f}s")

        # 2. gate every run
        started = time.perf_counter()
        config = load_qc_config()
        gates = {name: _gate(engine, store, r, config) for name, r in runs.items()}
        gate_s = time.perf_counter() - started
        log(quiet, f"gated in {gate_s:.1f}s: {[g[1] for g in gates.values()]}")

        # 3. one SFT snapshot from what the gates admitted
        verdicts = tuple(args.verdicts)
        by_run = {
            name: select_episodes(
                engine, store, run_ids=[runs[name]], qc_run_id=gates[name][0], verdicts=verdicts
            )
            for name in runs
        }
        sources = [s for episodes in by_run.values() for s in episodes]
        style = settings.prompt_style
        built = build_rows(DatasetKind.SFT, sources, prompt_style=style)
        rows_per_run = {
            name: len(build_rows(DatasetKind.SFT, e, prompt_style=style).rows)
            for name, e in by_run.items()
        }

        def filter_for(run_names: list[str], extra: dict[str, Any]) -> dict[str, Any]:
            return {
                "run_ids": sorted(str(runs[n]) for n in run_names),
                "qc_run_ids": sorted(str(gates[n][0]) for n in run_names),
                "verdicts": sorted(verdicts),
                "templates": sorted(templates),
                "prompt_style": style.value,
                **extra,
            }

        snapshot = write_snapshot(
            engine, store, kind=DatasetKind.SFT, built=built, filter_=filter_for(list(runs), {})
        )
        log(quiet, f"snapshot: {snapshot.n_rows} rows, weight {snapshot.weight_sum:.1f}")

        # 4. base model from scratch
        suite = builtin_suite()
        corpus = (
            protocol_corpus(
                suite.instances(train_tasks, templates=templates),
                [s.trajectory for s in sources],
                prompt_style=style,
            )
            if recipe.pretrained is None
            else ""
        )
        heldout = suite.heldout_instances(heldout_n, templates=templates)
        eval_reserve = args.eval_reserve_s * len(heldout) + SAVE_RESERVE_S
        n_iter = max(1, args.iterations)
        # A recipe with max_steps trains by steps (the copy warm-up by copy_warmup_steps);
        # without, SFT gets what the time budget leaves (the older, load-dependent way).
        step_budget = settings.max_steps
        base_eval_reserve = args.eval_reserve_s * args.base_heldout * len(templates) * 3
        warm_share = (
            args.copy_warmup_share
            if args.copy_warmup_share is not None
            else recipe.copy_warmup_share
        )
        warmup_s = None
        if warm_share > 0:
            training_left = (
                args.budget_s
                - (time.perf_counter() - t0)
                - eval_reserve * n_iter
                - args.iteration_reserve_s * (n_iter - 1)
                - base_eval_reserve
            )
            warmup_s = max(10.0, warm_share * training_left)
        settings = settings.model_copy(update={"copy_warmup_s": warmup_s})
        started = time.perf_counter()
        if recipe.pretrained is not None:
            # The shipped base, converted once into $EPIFLOW_HOME/models (cached), copied
            # so that registering it writes its training config here, not in the cache.
            base_dir = work / "base-eval-model"
            shutil.copytree(
                prepare_pretrained(PRETRAINED[recipe.pretrained], home=epiflow_home()),
                base_dir,
            )
            base_id = register_pretrained(engine, store, base_dir, settings=settings)
        else:
            base_id = prepare_base_model(
                engine, store, work_dir=work / "base-build", corpus=corpus, settings=settings
            )
            base_dir = fetch_checkpoint(engine, store, base_id, work / "base-eval-model")
        base_build_s = time.perf_counter() - started
        warmup = get_checkpoint(engine, base_id).metrics.get("copy_warmup")
        log(quiet, f"base model in {base_build_s:.1f}s (copy warm-up: {warmup_s})")

        # 5. the base on a few held-out instances
        base_tasks = base_heldout_tasks(heldout, templates, args.base_heldout)
        base_eval = evaluate(base_dir, base_tasks, run_key="loop-eval-base", args=args)
        log(quiet, f"base eval: {base_eval}")

        # 6-8. train (and iterate) within the budget
        parent_id, snapshot_rows, curve = base_id, built.rows, _Curve(args.curve_every_s)
        trained_dir = base_dir
        train_s_total, result = 0.0, None
        for it in range(1, n_iter + 1):
            if it > 1:
                # Expert iteration: the checkpoint collects on fresh instances; its verified
                # successes join the snapshot.
                started = time.perf_counter()
                run_name = f"iter{it}"
                with tuned_threads():  # the hf: policy generates: see training.threads
                    runs[run_name] = _collect(
                        engine,
                        store,
                        run_key=f"loop-{run_name}",
                        policy=f"hf:{trained_dir}",
                        tasks=args.iteration_tasks,
                        templates=templates,
                        seed=train_tasks + noisy_tasks + (it - 2) * args.iteration_tasks,
                        concurrency=2,
                    )
                gates[run_name] = _gate(engine, store, runs[run_name], config)
                mine = select_episodes(
                    engine,
                    store,
                    run_ids=[runs[run_name]],
                    qc_run_id=gates[run_name][0],
                    verdicts=verdicts,
                )
                own = build_rows(DatasetKind.SFT, mine, prompt_style=style)
                rows_per_run[run_name] = len(own.rows)
                snapshot_rows = snapshot_rows + own.rows
                built = built.model_copy(
                    update={"rows": snapshot_rows, "lineage": built.lineage + own.lineage}
                )
                snapshot = write_snapshot(
                    engine,
                    store,
                    kind=DatasetKind.SFT,
                    built=built,
                    filter_=filter_for(list(runs), {"iteration": it}),
                )
                iterations[-1]["next_collect_s"] = round(time.perf_counter() - started, 1)
                iterations[-1]["own_successes"] = len(own.rows)
            if step_budget > 0:
                # A step-budgeted recipe: the iteration's share of the steps, not of the
                # seconds left, so the machine's load changes the time and not the result.
                steps = _iteration_steps(step_budget, n_iter, it, args.first_share)
                budget_update: dict[str, Any] = {"max_steps": steps, "max_time_s": None}
                log(quiet, f"iteration {it}: training for {steps} steps")
            else:
                elapsed = time.perf_counter() - t0
                left = args.budget_s - elapsed - eval_reserve * (n_iter - it + 1)
                left -= args.iteration_reserve_s * (n_iter - it)
                share = left / (n_iter - it + 1) if it < n_iter else left
                if it == 1 and n_iter > 1:
                    share = left * args.first_share
                max_time = max(30.0, share)
                budget_update = {"max_time_s": max_time}
                log(quiet, f"iteration {it}: training for {max_time:.0f}s")
            started = time.perf_counter()
            outcome = train_checkpoint(
                engine,
                store,
                algo="sft",
                dataset_id=snapshot.id,
                work_dir=work / f"train{it}",
                settings=settings.model_copy(update=budget_update),
                base_checkpoint_id=parent_id,
                on_metrics=curve.on_metrics,
            )
            train_s = time.perf_counter() - started
            train_s_total += train_s
            result = outcome.result
            log(quiet, f"trained in {train_s:.1f}s: {result.steps} steps, loss {result.train_loss}")
            trained_dir = fetch_checkpoint(
                engine, store, outcome.checkpoint_id, work / f"trained-model-{it}"
            )
            evaluation = evaluate(trained_dir, heldout, run_key=f"loop-eval-{it}", args=args)
            log(quiet, f"iteration {it} eval: {evaluation}")
            iterations.append(
                {
                    "iteration": it,
                    "completion_rate": evaluation["completion_rate"],
                    "by_template": evaluation["by_template"],
                    "train_s": round(train_s, 1),
                    "steps": result.steps,
                    "snapshot_rows": len(snapshot_rows),
                    "eval": evaluation,
                }
            )
            parent_id = outcome.checkpoint_id
        rl_keys: dict[str, Any] = {}
        if recipe.rl is not None and result is not None:
            rl_keys = rl_stage_in_child(work, quiet=quiet)
        bare_torch = None
        if recipe.bare_torch_steps > 0 and result is not None:
            bare_torch = _bare_torch(
                base_dir,
                [r["messages"] for r in snapshot_rows],
                steps=recipe.bare_torch_steps,
                settings=settings,
                bf16=result.bf16,
                threads=result.threads[0] if result.threads else 1,
            )
            log(quiet, f"bare torch: {bare_torch}")
        total_s = time.perf_counter() - t0

        curve_points: list[dict[str, Any]] = []
        curve_s = 0.0
        if args.curve_every_s and result is not None:
            started = time.perf_counter()
            curve_points = _evaluate_saves(work, heldout, args)
            curve_s = time.perf_counter() - started

        from safetensors import safe_open
        from transformers import AutoConfig

        with safe_open(str(trained_dir / "model.safetensors"), framework="pt") as tensors:
            n_params = sum(
                _numel(tensors.get_slice(k).get_shape())
                for k in tensors.keys()  # noqa: SIM118
            )
        config_hf = AutoConfig.from_pretrained(str(trained_dir), local_files_only=True)
        precision = precision_report(
            settings, bf16=result is not None and result.bf16, eval_model_dir=trained_dir
        )
        engine.dispose()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    assert result is not None
    final = iterations[-1]["eval"]
    return {
        "base_completion_rate": base_eval["completion_rate"],
        "trained_completion_rate": final["completion_rate"],
        "per_template": {
            name: {
                "base": base_eval["by_template"].get(name),
                "trained": final["by_template"].get(name),
            }
            for name in templates
        },
        "trained_by_template": final["by_template"],
        "completion_by_iteration": [i["completion_rate"] for i in iterations],
        "recipe": recipe.name,
        "total_s": round(total_s, 1),
        "budget_s": args.budget_s,
        "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "templates": templates,
        "heldout_instances": len(heldout),
        "base_heldout_instances": len(base_tasks),
        "trained": {k: v for k, v in final.items() if k not in ("sample_first_turn",)},
        "base": {k: v for k, v in base_eval.items() if k not in ("sample_first_turn",)},
        "iterations": [
            {k: v for k, v in i.items() if k != "eval"}
            | {"turns": {k: i["eval"][k] for k in ("exact_call_rate", "wrong_content_rate")}}
            for i in iterations
        ],
        "episodes_collected": {"oracle": train_tasks * len(templates)}
        | ({"noisy": noisy_tasks * len(templates)} if noisy_tasks else {}),
        "gate": {name: g[1] for name, g in gates.items()},
        "sft_rows": rows_per_run,
        "model": {
            "pretrained": recipe.pretrained,
            "hidden": int(config_hf.hidden_size),
            "layers": int(config_hf.num_hidden_layers),
            "heads": int(config_hf.num_attention_heads),
            "vocab": int(config_hf.vocab_size),
            "params": n_params,
            "architecture": config_hf.model_type,
            "tokenizer_split": settings.tokenizer_split if recipe.pretrained is None else None,
            "prompt_style": style.value,
        },
        "lr": settings.sft_learning_rate,
        "batch": settings.batch_size,
        "steps": result.steps,
        "train_s": round(train_s_total, 1),
        "trainer_s": round(result.runtime_s, 1),
        "tokens": result.tokens,
        "tokens_per_s": round(result.tokens_per_s, 1),
        "bare_torch": bare_torch,
        "trl_vs_bare_torch": round(result.tokens_per_s / bare_torch["tokens_per_s"], 3)
        if bare_torch and bare_torch["tokens_per_s"]
        else None,
        "examples_trained": result.steps * settings.batch_size,
        "cpu_share": round(result.cpu_s / result.runtime_s, 2) if result.runtime_s else None,
        "threads": result.threads,
        "bf16": result.bf16,
        "autocast": precision["autocast"],
        "eval_dtype": precision["eval_dtype"],
        "precision": precision,
        "final_loss": result.metrics.get("loss"),
        "loss_curve": curve.losses[:: max(1, len(curve.losses) // 20)],
        "completion_curve": curve_points or None,
        "curve_s": round(curve_s, 1) if curve_points else None,
        "collect_s": round(collect_s, 1),
        "gate_s": round(gate_s, 1),
        "base_build_s": round(base_build_s, 1),
        "copy_warmup": (
            {
                k: warmup[k]
                for k in ("steps", "runtime_s", "tokens", "tokens_per_s", "train_loss")
                if k in warmup
            }
            | {"final_loss": warmup.get("metrics", {}).get("loss")}
            if warmup
            else None
        ),
        "base_eval_s": base_eval["eval_s"],
        "max_new_tokens": args.max_new_tokens,
        "eval_max_steps": args.eval_max_steps,
        "eval_policy": args.eval_policy,
        "eval_max_parse_failures": args.eval_max_parse_failures,
        "trained_sample_first_turn": final["sample_first_turn"],
        "cpu_flags": cpu_flags(),
    } | rl_keys


def _bare_torch(
    model_dir: Path,
    chats: list[Any],
    *,
    steps: int,
    settings: Any,
    bf16: bool,
    threads: int,
) -> dict[str, Any]:
    """Tokens/s of `bench/train.py`'s bare torch loop (forward, backward, clip, AdamW) on
    the base model and the snapshot's own chats, at the trainer's batch size, precision
    and first thread count, after one untimed step."""
    # bench/train.py: this script's folder is sys.path[0] (as mypy maps bench/: no package)
    from train import tokenized, torch_loop

    from training.trainers.common import load_tokenizer

    started = time.perf_counter()
    examples = tokenized(model_dir, chats[: settings.batch_size * (steps + 1)], settings.max_length)
    pad_id = int(load_tokenizer(model_dir).pad_token_id)

    def timed(n: int) -> float:
        return torch_loop(
            model_dir,
            examples,
            steps=n,
            batch=settings.batch_size,
            lr=settings.sft_learning_rate,
            pad_id=pad_id,
            bf16=bf16,
            threads=threads,
        )

    timed(1)
    tokens_per_s = timed(steps)
    return {
        "tokens_per_s": round(tokens_per_s, 1),
        "steps": steps,
        "threads": threads,
        "load_avg": round(os.getloadavg()[0], 2),
        "measure_s": round(time.perf_counter() - started, 1),
    }


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _evaluate_saves(
    work: Path, heldout: list[Any], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Completion of every time-based save of the first iteration's training."""
    from training.callbacks import ELAPSED_FILE
    from training.trainers.common import saves_dir
    from training.training_config import CONFIG_FILE

    out = []
    model_dir = work / "train1" / "model"
    saves = sorted(
        saves_dir(model_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])
    )
    for save in saves:
        # The save lacks the training config; the final model has the same one.
        shutil.copy(model_dir / CONFIG_FILE, save / CONFIG_FILE)
        mark = json.loads((save / ELAPSED_FILE).read_text())
        evaluation = evaluate(save, heldout, run_key=f"loop-curve-{save.name}", args=args)
        out.append(
            {
                "step": int(mark["step"]),
                "train_minutes": round(float(mark["elapsed_s"]) / 60, 2),
                "completion_rate": evaluation["completion_rate"],
                "by_template": evaluation["by_template"],
            }
        )
    return out


def _positive(text: str) -> int:
    """An argparse type: an integer ≥ 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--recipe", default="loop", help="training.recipes preset")
    parser.add_argument("--templates", nargs="+", default=None)
    parser.add_argument("--train-tasks", type=int, default=None, help="oracle instances/template")
    parser.add_argument("--noisy-tasks", type=int, default=None, help="noisy instances/template")
    parser.add_argument("--verdicts", nargs="+", default=["keep", "downweight"])
    parser.add_argument("--heldout", type=int, default=None, help="held-out instances/template")
    parser.add_argument(
        "--base-heldout",
        type=int,
        default=None,
        help="held-out instances/template for the base (default: the recipe's, else 2)",
    )
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        default=900.0,
        help="one served turn's deadline (openai: evaluation; a loaded CPU server is slow)",
    )
    parser.add_argument("--budget-s", type=float, default=1200.0, help="whole-run time budget")
    parser.add_argument(
        "--eval-reserve-s", type=float, default=3.0, help="seconds kept per held-out episode"
    )
    parser.add_argument("--iterations", type=int, default=1, help="expert-iteration rounds")
    parser.add_argument(
        "--iteration-tasks", type=int, default=40, help="hf: instances/template per iteration"
    )
    parser.add_argument(
        "--iteration-reserve-s",
        type=float,
        default=150.0,
        help="seconds kept per later iteration for its hf: collection",
    )
    parser.add_argument(
        "--first-share",
        type=float,
        default=0.7,
        help="share of the training time the first iteration gets when iterating",
    )
    parser.add_argument(
        "--curve-every-s", type=float, default=None, help="save and evaluate every S s"
    )
    parser.add_argument(
        "--copy-warmup-share",
        type=float,
        default=None,
        help="share of the training time for the copy warm-up (default: the recipe's)",
    )
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--max-steps", type=int, default=None, help="SFT steps (the recipe's)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--eval-max-steps", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--dump", type=Path, default=None, help="append the evaluated trajectories (JSONL) here"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--rl-steps", type=_positive, default=None, help="GRPO optimiser steps (the recipe's)"
    )
    parser.add_argument(
        "--rl-groups",
        type=_positive,
        default=None,
        help="GRPO groups per step (the recipe's); wins over --rl-tokens-per-step",
    )
    parser.add_argument(
        "--rl-tokens-per-step",
        type=_positive,
        default=None,
        help="GRPO batch in tokens per optimiser step (the recipe's; seed 000: 32768-131072), "
        "converted into whole groups from the measured rollout length",
    )
    parser.add_argument(
        "--rl-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="run only the RL stage and its evaluation again, from the SFT checkpoint of a "
        "work directory an earlier --recipe smollm2-rl run kept (--keep); base and SFT "
        "figures are its stored evaluations",
    )
    args = parser.parse_args()
    from training.recipes import RECIPES

    if args.recipe not in RECIPES:
        parser.error(f"--recipe: unknown recipe {args.recipe!r} (known: {', '.join(RECIPES)})")
    if RECIPES[args.recipe].rl is None and (
        args.rl_steps or args.rl_groups or args.rl_tokens_per_step
    ):
        with_rl = ", ".join(n for n, r in RECIPES.items() if r.rl is not None)
        parser.error(
            "--rl-steps, --rl-groups and --rl-tokens-per-step need a recipe with an RL stage "
            f"({with_rl})"
        )
    # A SIGTERM (`timeout`, a supervisor) unwinds like Ctrl-C, so the `finally` blocks stop
    # a server the run started and remove the work directory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.quiet:
        # The trainer's and the evaluation's progress lines (`core.progress`, INFO on the
        # `training.progress` logger, every 20 s) on stderr: SFT is minutes to an hour here.
        progress = logging.getLogger("training.progress")
        progress.setLevel(logging.INFO)
        progress.addHandler(logging.StreamHandler(sys.stderr))
        # The RL stage's plan (its token budget in groups, measured from the source
        # episodes) when it is made, before the first step.
        plan = logging.getLogger("collection.grpo_training")
        plan.setLevel(logging.INFO)
        plan.addHandler(logging.StreamHandler(sys.stderr))
    # Libraries print notices and progress on stdout; the benchmark's stdout is its JSON.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            report = run_rl_from(args) if args.rl_from is not None else run(args)
        except LoopInputError as e:
            print(f"bench/loop.py: {e}", file=sys.stderr)
            sys.exit(2)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
