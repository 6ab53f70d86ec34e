"""What every stage of `bench/loop.py` starts from: the recipe applied to the command line
(`apply_recipe`), the error for a command line it cannot run (`LoopInputError`, exit 2),
and the progress lines on stderr (`log`).

Shared by the whole run (`bench/loop.py`'s `run`) and the RL stage again from a kept work
directory (`bench/loop_rl_from.py`'s `run_rl_from`).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

__all__ = ["LoopInputError", "apply_recipe", "log", "release_memory"]


class LoopInputError(Exception):
    """A command line `bench/loop.py` cannot run (exit 2, the message names what to fix)."""


def log(quiet: bool, message: str) -> None:
    """One timestamped progress line on stderr, unless `quiet`."""
    if not quiet:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def release_memory(quiet: bool, before: str) -> None:
    """Hands this process's freed heap back to the kernel (`core.memory.release_freed_memory`)
    before `before` (a second process that needs the memory), with one line saying how much."""
    from core.memory import release_freed_memory

    released = release_freed_memory()
    if released is not None:
        log(
            quiet,
            "freed memory handed back before {}: {:.1f} → {:.1f} GiB".format(before, *released),
        )


def apply_recipe(args: argparse.Namespace) -> tuple[Any, Any, list[str], int, int, int]:
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
