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
from SQL (`run_rl_from`): an RL setting can be tried, or the RL stage repeated, without
the ~50 minutes of base evaluation, SFT and SFT evaluation before it. A whole run does its
own RL stage that way too, in a fresh process (`_rl_stage_in_child`): on top of what the
earlier stages left in this one, `smollm2-rl`'s GRPO was killed for memory.

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
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def _log(quiet: bool, message: str) -> None:
    if not quiet:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


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


def _served_episodes(
    model_dir: Path, tasks: list[Any], *, run_key: str, args: argparse.Namespace
) -> tuple[list[Any], dict[str, Any]]:
    """Greedy `openai:` episodes against `model_dir` served by `transformers serve`, and
    the serving figures (startup, generated tokens, tokens/s)."""
    from agent.policies import make_policy
    from agent.serving import serve_checkpoint
    from agent.settings import PolicySettings
    from collection.evaluation import run_evaluation

    policy_settings = PolicySettings(request_timeout_s=args.request_timeout_s)
    started = time.perf_counter()
    with serve_checkpoint(
        model_dir,
        log_path=args.work / f"serve-{run_key}.log",
        policy=policy_settings,
        torch_threads=args.serve_threads,
    ) as served:
        startup_s = time.perf_counter() - started
        spec = (
            f"{served.policy_spec}?max_tokens={args.max_new_tokens}"
            f"&prompt_style={args.prompt_style}"
        )
        policy = make_policy(spec, settings=policy_settings)
        started = time.perf_counter()

        async def episodes() -> list[Any]:
            try:
                return await run_evaluation(
                    policy,
                    tasks,
                    run_key=run_key,
                    suite="builtin",
                    settings=_eval_settings(args, max_parse_failures=args.eval_max_parse_failures),
                    engine=args.engine,
                    store=args.store,
                    concurrency=args.eval_concurrency,
                )
            finally:
                await policy.aclose()

        trajectories = asyncio.run(episodes())
        episodes_s = time.perf_counter() - started
    generated = sum(t.completion_tokens for t in trajectories)
    return trajectories, {
        "serve_startup_s": round(startup_s, 1),
        "generated_tokens": generated,
        "generation_tokens_per_s": round(generated / episodes_s, 1) if episodes_s else None,
        "policy": spec.split("#", 1)[0] + "#<dir>?" + spec.split("?", 1)[1],
        "serve_threads": args.serve_threads,
        "concurrency": args.eval_concurrency,
    }


def _eval_settings(args: argparse.Namespace, *, max_parse_failures: int | None = None) -> Any:
    """The environment's settings with the recipe's evaluation budget (episodes are stored
    in the loop's database, `args.engine`, as collection runs `loop-eval-…`)."""
    from collection.evaluation import evaluation_settings
    from config.settings import load_settings

    return evaluation_settings(
        load_settings(), max_steps=args.eval_max_steps, max_parse_failures=max_parse_failures
    )


def _evaluate(
    model_dir: Path, tasks: list[Any], *, run_key: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Greedy episodes on the held-out tasks (`hf:` in process, or `openai:` on the served
    checkpoint): completion, per template, turn rates; infrastructure outcomes apart."""
    from collection.evaluation import run_model_evaluation

    started = time.perf_counter()
    serving: dict[str, Any] | None = None
    if args.eval_policy == "openai":
        trajectories, serving = _served_episodes(model_dir, tasks, run_key=run_key, args=args)
    else:
        trajectories = asyncio.run(
            run_model_evaluation(
                model_dir,
                tasks,
                run_key=run_key,
                suite="builtin",
                settings=_eval_settings(args),
                max_new_tokens=args.max_new_tokens,
                engine=args.engine,
                store=args.store,
            )
        )
    if args.dump is not None:
        with args.dump.open("a", encoding="utf-8") as out:
            for t in trajectories:
                out.write(t.model_dump_json() + "\n")
    return _evaluation_summary(
        trajectories, tasks, eval_s=time.perf_counter() - started, serving=serving
    )


def _evaluation_summary(
    trajectories: list[Any], tasks: list[Any], *, eval_s: float | None, serving: Any
) -> dict[str, Any]:
    """What the JSON says of one evaluation: completion overall and per template, turn
    rates, statuses; infrastructure outcomes counted apart (`training.evaluation`)."""
    from training.evaluation import evaluation_metrics

    metrics = evaluation_metrics(trajectories, tasks)

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {
        "completion_rate": round(metrics.completion_rate, 3),
        "by_template": {k: round(v, 3) for k, v in metrics.by_template.items()},
        "avg_steps": round(metrics.avg_steps, 2),
        "tool_failure_rate": round(metrics.tool_failure_rate, 3),
        "parse_error_rate": r(metrics.parse_error_rate),
        "wrong_tool_rate": r(metrics.wrong_tool_rate),
        "wrong_content_rate": r(metrics.wrong_content_rate),
        "premature_final_rate": r(metrics.premature_final_rate),
        "exact_call_rate": r(metrics.exact_call_rate),
        "statuses": dict(Counter(t.status.value for t in trajectories)),
        "episodes": len(trajectories),
        "infrastructure_episodes": metrics.n_infrastructure,
        "eval_s": round(eval_s, 1) if eval_s is not None else None,
        "serving": serving,
        "sample_first_turn": trajectories[0].steps[0].raw_output[:300]
        if trajectories and trajectories[0].steps
        else "",
    }


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


class LoopInputError(Exception):
    """A command line `bench/loop.py` cannot run (exit 2, the message names what to fix)."""


def _stored_evaluation(
    engine: Any, store: Any, run_key: str, tasks: list[Any], where: Path
) -> dict[str, Any]:
    """The summary of evaluation run `run_key` as it is stored in a kept work directory,
    over exactly `tasks` (each must have its episode there)."""
    from models import run_id_for
    from storage.run_reads import run_trajectories

    stored = {t.task_id: t for t in run_trajectories(engine, store, run_id_for(run_key))}
    missing = [t.task_id for t in tasks if t.task_id not in stored]
    if missing:
        raise LoopInputError(
            f"--rl-from {where}: evaluation run {run_key} has no episode of {len(missing)} of "
            f"the {len(tasks)} held-out instances (e.g. {missing[0]}); give the recipe, "
            "--templates, --heldout and --base-heldout the run was made with"
        )
    return _evaluation_summary([stored[t.task_id] for t in tasks], tasks, eval_s=None, serving=None)


def _newest_sft(engine: Any) -> uuid.UUID | None:
    """The newest checkpoint an SFT training run saved."""
    from sqlmodel import Session, col, select

    from models import Checkpoint, TrainingRun

    query = (
        select(Checkpoint.id)
        .join(TrainingRun, col(Checkpoint.training_run_id) == col(TrainingRun.id))
        .where(TrainingRun.algo == "sft")
        .order_by(col(Checkpoint.created_at).desc())
    )
    with Session(engine) as session:
        return session.exec(query).first()


def _newest_gate(engine: Any, run_id: uuid.UUID) -> uuid.UUID | None:
    """The newest gate run over collection run `run_id`."""
    from sqlmodel import Session, col, select

    from models import QcRun

    query = (
        select(QcRun.id).where(col(QcRun.run_id) == run_id).order_by(col(QcRun.started_at).desc())
    )
    with Session(engine) as session:
        return session.exec(query).first()


_RUN_KEYS = frozenset(
    {
        "recipe",
        "rl_from",
        "total_s",
        "load_avg",
        "templates",
        "heldout_instances",
        "base_heldout_instances",
        "base",
        "sft",
        "cpu_flags",
    }
)
"""Keys of `run_rl_from`'s report that describe its own run, not the RL stage."""


CHILD_STOP_S = 120.0
"""Seconds a stopping run gives its RL child to stop before killing it (a GRPO trainer stops
within a micro-batch, or at once while it waits for rollouts)."""


def _rl_stage_in_child(work: Path, *, quiet: bool) -> dict[str, Any]:
    """The RL stage and its evaluation in a fresh process: this command line again with
    `--rl-from work` (`run_rl_from`), its progress on this stderr; returns the RL keys of
    its JSON.

    Why a process: after the base evaluation, SFT and the SFT evaluation this process
    held ~17 GB (freed memory glibc keeps), and `smollm2-rl`'s GRPO on top of it was
    killed for memory at its third optimiser step (anon RSS 24.2 GB, 24 GiB machine);
    alone, the stage's first step peaked at 10.4 GiB (docs/training.md).

    Raises:
        RuntimeError: the child failed (its stderr, on this stderr, says why).
    """
    argv = [a for a in sys.argv[1:] if a not in ("--json", "--keep")]
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--json"]
    command += ["--rl-from", str(work)]
    _log(quiet, f"RL stage in a fresh process: {' '.join(command[1:])}")
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as child:
        try:
            out, _ = child.communicate()
        except BaseException as e:
            # This run is stopping (SIGTERM, Ctrl-C): so does the child, the same way, so
            # that its rollout run ends `interrupted`, its training run `failed` and its
            # jails closed; killed only if it does not end in CHILD_STOP_S. Ctrl-C reached
            # it already (its terminal's process group): a second signal would cut its stop.
            if not isinstance(e, KeyboardInterrupt):
                child.send_signal(signal.SIGTERM)
            try:
                child.wait(CHILD_STOP_S)
            except subprocess.TimeoutExpired:
                child.kill()
            raise
    lines = out.strip().splitlines()
    if child.returncode != 0 or not lines:
        raise RuntimeError(f"the RL stage ({' '.join(command[1:])}) exited {child.returncode}")
    report: dict[str, Any] = json.loads(lines[-1])
    return {k: v for k, v in report.items() if k not in _RUN_KEYS}


def run_rl_from(args: argparse.Namespace) -> dict[str, Any]:
    """`--rl-from DIR`: the RL stage and the RL evaluation again, in DIR, a work directory
    an earlier `--recipe smollm2-rl` (or `smollm2`) run kept (`--keep`): from its SFT
    checkpoint and oracle collection, on the same held-out instances. The base and SFT
    figures are its stored evaluations, re-read from SQL (not re-run: `base_eval_s` and
    the SFT's `eval_s` are None); `rl_from` names DIR. Each call is a new training run, a
    new rollout run and a new evaluation run (`loop-eval-rl-<time>`), beside the earlier ones.

    Raises:
        LoopInputError: DIR is not such a directory, or the recipe has no RL stage.
    """
    from loop_rl import cpu_flags

    from models import run_id_for
    from storage.db import make_engine
    from storage.migrate import upgrade
    from storage.objects import LocalObjectStore
    from storage.settings import DatabaseSettings
    from suites.builtin import builtin_suite

    recipe, settings, templates, _, _, heldout_n = _setup(args)
    where = Path(args.rl_from).resolve()
    if recipe.rl is None:
        raise LoopInputError(f"--rl-from needs a recipe with an RL stage, not {recipe.name}")
    if not (where / "loop.db").is_file() or not (where / "objects").is_dir():
        raise LoopInputError(
            f"--rl-from {where}: no loop.db and objects/ there; give a work directory "
            "that bench/loop.py --recipe smollm2-rl --keep left"
        )
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{where / 'loop.db'}"))
    try:
        upgrade(engine)
        store = LocalObjectStore(where / "objects")
        args.work, args.engine, args.store = where, engine, store
        heldout = builtin_suite().heldout_instances(heldout_n, templates=templates)
        base_tasks = _base_tasks(heldout, templates, args.base_heldout)
        base_eval = _stored_evaluation(engine, store, "loop-eval-base", base_tasks, where)
        sft_eval = _stored_evaluation(engine, store, "loop-eval-1", heldout, where)
        sft_id = _newest_sft(engine)
        oracle_run = run_id_for("loop-oracle")
        gate_id = _newest_gate(engine, oracle_run)
        if sft_id is None or gate_id is None:
            raise LoopInputError(
                f"--rl-from {where}: no SFT checkpoint or no gated oracle collection "
                "(loop-oracle) in loop.db; give a directory whose run got past its SFT stage"
            )
        stamp = time.strftime("%Y%m%d-%H%M%S")
        _log(args.quiet, f"RL again from {where}: SFT checkpoint {sft_id}, run {stamp}")
        rl_keys = _rl_stage(
            args,
            recipe=recipe,
            settings=settings,
            sft_checkpoint_id=sft_id,
            oracle_run_id=oracle_run,
            oracle_gate_id=gate_id,
            templates=templates,
            heldout=heldout,
            work=where / f"rl-from-{stamp}",
            evaluations=(base_eval, sft_eval),
            eval_run_key=f"loop-eval-rl-{stamp}",
        )
    finally:
        engine.dispose()
    return {
        "recipe": recipe.name,
        "rl_from": str(where),
        "sft_checkpoint_id": str(sft_id),
        "total_s": round(time.perf_counter() - t0, 1),
        "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "templates": templates,
        "heldout_instances": len(heldout),
        "base_heldout_instances": len(base_tasks),
        "base": {k: v for k, v in base_eval.items() if k != "sample_first_turn"},
        "sft": {k: v for k, v in sft_eval.items() if k != "sample_first_turn"},
        "cpu_flags": cpu_flags(),
    } | rl_keys


def _setup(args: argparse.Namespace) -> tuple[Any, Any, list[str], int, int, int]:
    """The recipe, its training settings with the command line's overrides, the templates,
    oracle, noisy and held-out instances per template; the evaluation's limits set on
    `args`."""
    from training.recipes import get_recipe
    from training.settings import TrainingSettings

    recipe = get_recipe(args.recipe)
    settings = recipe.training_settings(TrainingSettings())
    overrides = {
        k: v
        for k, v in {
            "seed": args.seed,
            "sft_learning_rate": args.lr,
            "batch_size": args.batch,
            "hidden_size": args.hidden,
            "intermediate_size": args.hidden * 4 if args.hidden else None,
            "num_layers": args.layers,
            "save_every_s": args.curve_every_s,
            "max_steps": args.max_steps,
        }.items()
        if v is not None
    }
    settings = settings.model_copy(update=overrides)
    templates = list(args.templates or recipe.templates)
    train_tasks = args.train_tasks if args.train_tasks is not None else recipe.oracle_tasks
    noisy_tasks = args.noisy_tasks if args.noisy_tasks is not None else recipe.noisy_tasks
    heldout_n = args.heldout if args.heldout is not None else recipe.heldout
    args.eval_max_steps = args.eval_max_steps or recipe.eval_max_steps
    args.max_new_tokens = args.max_new_tokens or recipe.eval_max_new_tokens
    args.eval_policy = recipe.eval_policy
    args.eval_concurrency = recipe.eval_concurrency
    args.eval_max_parse_failures = recipe.eval_max_parse_failures
    args.serve_threads = recipe.serve_threads
    args.prompt_style = settings.prompt_style.value
    args.base_heldout = args.base_heldout or recipe.base_heldout or 2
    return recipe, settings, templates, train_tasks, noisy_tasks, heldout_n


def _base_tasks(heldout: list[Any], templates: list[str], per_template: int) -> list[Any]:
    """The first `per_template` held-out instances of each template (the base's)."""
    return [
        t for name in templates for t in [h for h in heldout if h.template == name][:per_template]
    ]


def _rl_stage(
    args: argparse.Namespace,
    *,
    recipe: Any,
    settings: Any,
    sft_checkpoint_id: uuid.UUID,
    oracle_run_id: uuid.UUID,
    oracle_gate_id: uuid.UUID,
    templates: list[str],
    heldout: list[Any],
    work: Path,
    evaluations: tuple[dict[str, Any], dict[str, Any]],
    eval_run_key: str,
) -> dict[str, Any]:
    """GRPO from the SFT checkpoint (`bench/loop_rl.py`), the RL checkpoint evaluated on
    `heldout`, and the RL keys of the JSON beside the base and SFT `evaluations`."""
    # bench/loop_rl.py: this script's folder is sys.path[0] (as mypy maps bench/)
    from loop_rl import rl_report, run_rl_stage

    stage = run_rl_stage(
        args.engine,
        args.store,
        recipe=recipe,
        sft_settings=settings,
        sft_checkpoint_id=sft_checkpoint_id,
        oracle_run_id=oracle_run_id,
        oracle_gate_id=oracle_gate_id,
        templates=templates,
        work=work,
        rollout_settings=_eval_settings(args, max_parse_failures=args.eval_max_parse_failures),
        steps=args.rl_steps,
        groups_per_step=args.rl_groups,
        tokens_per_step=args.rl_tokens_per_step,
        log=lambda message: _log(args.quiet, message),
    )
    rl_eval = _evaluate(stage.model_dir, heldout, run_key=eval_run_key, args=args)
    _log(args.quiet, f"RL eval: {rl_eval}")
    base_eval, sft_eval = evaluations
    return rl_report(base_eval, sft_eval, rl_eval, stage, templates=templates)


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
    recipe, settings, templates, train_tasks, noisy_tasks, heldout_n = _setup(args)
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="epiflow-bench-loop-"))
    args.work = work
    _log(quiet, f"recipe {recipe.name}, work directory {work}")
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
        _log(quiet, f"collected in {collect_s:.1f}s")

        # 2. gate every run
        started = time.perf_counter()
        config = load_qc_config()
        gates = {name: _gate(engine, store, r, config) for name, r in runs.items()}
        gate_s = time.perf_counter() - started
        _log(quiet, f"gated in {gate_s:.1f}s: {[g[1] for g in gates.values()]}")

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
        _log(quiet, f"snapshot: {snapshot.n_rows} rows, weight {snapshot.weight_sum:.1f}")

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
        _log(quiet, f"base model in {base_build_s:.1f}s (copy warm-up: {warmup_s})")

        # 5. the base on a few held-out instances
        base_tasks = _base_tasks(heldout, templates, args.base_heldout)
        base_eval = _evaluate(base_dir, base_tasks, run_key="loop-eval-base", args=args)
        _log(quiet, f"base eval: {base_eval}")

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
                _log(quiet, f"iteration {it}: training for {steps} steps")
            else:
                elapsed = time.perf_counter() - t0
                left = args.budget_s - elapsed - eval_reserve * (n_iter - it + 1)
                left -= args.iteration_reserve_s * (n_iter - it)
                share = left / (n_iter - it + 1) if it < n_iter else left
                if it == 1 and n_iter > 1:
                    share = left * args.first_share
                max_time = max(30.0, share)
                budget_update = {"max_time_s": max_time}
                _log(quiet, f"iteration {it}: training for {max_time:.0f}s")
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
            _log(
                quiet, f"trained in {train_s:.1f}s: {result.steps} steps, loss {result.train_loss}"
            )
            trained_dir = fetch_checkpoint(
                engine, store, outcome.checkpoint_id, work / f"trained-model-{it}"
            )
            evaluation = _evaluate(trained_dir, heldout, run_key=f"loop-eval-{it}", args=args)
            _log(quiet, f"iteration {it} eval: {evaluation}")
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
            rl_keys = _rl_stage_in_child(work, quiet=quiet)
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
            _log(quiet, f"bare torch: {bare_torch}")
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
        evaluation = _evaluate(save, heldout, run_key=f"loop-curve-{save.name}", args=args)
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
