"""`bench/loop.py`'s RL stage as a run of its own: `--rl-from DIR` (`run_rl_from`), and the
whole run's RL stage in a fresh process that runs that (`rl_stage_in_child`).

    report = run_rl_from(args)                     # bench/loop.py --rl-from DIR
    rl_keys = rl_stage_in_child(work, quiet=False)  # a whole run, after its SFT stage

`run_rl_from` opens the work directory an earlier run kept (`--keep`), finds its newest
SFT checkpoint and its gated oracle collection in `loop.db`, re-reads its base and SFT
evaluations from SQL (`loop_eval.stored_evaluation`), and runs the RL stage
(`bench/loop_rl.py`: GRPO, then `loop_eval.evaluate` on the same held-out instances).
`rl_stage_in_child` runs `bench/loop.py` again with the same command line and `--rl-from`
the whole run's work directory, and passes a SIGTERM on to it (`CHILD_STOP_S`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from loop_eval import base_heldout_tasks, eval_settings, evaluate, stored_evaluation
from loop_setup import LoopInputError, apply_recipe, log, release_memory

__all__ = ["CHILD_STOP_S", "rl_stage_in_child", "run_rl_from"]

_LOOP_SCRIPT = Path(__file__).resolve().with_name("loop.py")
"""The command line `rl_stage_in_child` runs again (`bench/loop.py`)."""


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


def rl_stage_in_child(work: Path, *, quiet: bool) -> dict[str, Any]:
    """The RL stage and its evaluation in a fresh process: `bench/loop.py`'s command line
    again with `--rl-from work` (`run_rl_from`), its progress on this stderr; returns the RL
    keys of its JSON.

    Why a process: after the base evaluation, SFT and the SFT evaluation this process
    held ~17 GB (freed memory glibc keeps), and `smollm2-rl`'s GRPO on top of it was
    killed for memory at its third optimiser step (anon RSS 24.2 GB, 24 GiB machine);
    alone, the stage's first step peaked at 10.4 GiB (docs/training.md).

    Raises:
        RuntimeError: the child failed (its stderr, on this stderr, says why).
    """
    # In run K this process held 11.4 GiB of freed heap, idle, while its child ran; the
    # OOM killer took it and the child's JSON found no reader.
    release_memory(quiet, "the RL child")
    argv = [a for a in sys.argv[1:] if a not in ("--json", "--keep")]
    command = [sys.executable, str(_LOOP_SCRIPT), *argv, "--json"]
    command += ["--rl-from", str(work)]
    log(quiet, f"RL stage in a fresh process: {' '.join(command[1:])}")
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
    The report is also written to DIR/rl-from-<time>/report.json, so a caller that died
    (the parent of a whole run's RL child) loses no figure.

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

    recipe, settings, templates, _, _, heldout_n = apply_recipe(args)
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
        base_tasks = base_heldout_tasks(heldout, templates, args.base_heldout)
        base_eval = stored_evaluation(engine, store, "loop-eval-base", base_tasks, where)
        sft_eval = stored_evaluation(engine, store, "loop-eval-1", heldout, where)
        sft_id = _newest_sft(engine)
        oracle_run = run_id_for("loop-oracle")
        gate_id = _newest_gate(engine, oracle_run)
        if sft_id is None or gate_id is None:
            raise LoopInputError(
                f"--rl-from {where}: no SFT checkpoint or no gated oracle collection "
                "(loop-oracle) in loop.db; give a directory whose run got past its SFT stage"
            )
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log(args.quiet, f"RL again from {where}: SFT checkpoint {sft_id}, run {stamp}")
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
    report = {
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
    saved = where / f"rl-from-{stamp}" / "report.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(report) + "\n", encoding="utf-8")
    log(args.quiet, f"report written to {saved}")
    return report


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
        rollout_settings=eval_settings(args, max_parse_failures=args.eval_max_parse_failures),
        steps=args.rl_steps,
        groups_per_step=args.rl_groups,
        tokens_per_step=args.rl_tokens_per_step,
        log=lambda message: log(args.quiet, message),
    )
    rl_eval = evaluate(stage.model_dir, heldout, run_key=eval_run_key, args=args)
    log(args.quiet, f"RL eval: {rl_eval}")
    base_eval, sft_eval = evaluations
    return rl_report(base_eval, sft_eval, rl_eval, stage, templates=templates)
