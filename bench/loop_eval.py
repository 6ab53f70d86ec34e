"""`bench/loop.py`'s evaluations: a checkpoint's greedy episodes on held-out instances
and what the JSON says of them.

    summary = evaluate(model_dir, tasks, run_key="loop-eval-1", args=args)
    summary = stored_evaluation(engine, store, "loop-eval-1", tasks, where)

`evaluate` runs the episodes, with the `hf:` policy in process or, for a recipe that
serves (`smollm2`, `smollm2-rl`), through `transformers serve` and `openai:`;
`stored_evaluation` reads an earlier evaluation run back from a kept work directory
(`--rl-from`). Both summarise through `training.evaluation.evaluation_metrics`,
infrastructure outcomes counted apart. The recipe's limits (`eval_max_steps`,
`max_new_tokens`, `eval_policy`, …) come on `args` (`loop_setup.apply_recipe`).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

from loop_setup import LoopInputError, release_memory

__all__ = ["base_heldout_tasks", "eval_settings", "evaluate", "stored_evaluation"]


def _served_episodes(
    model_dir: Path, tasks: list[Any], *, run_key: str, args: argparse.Namespace
) -> tuple[list[Any], dict[str, Any]]:
    """Greedy `openai:` episodes against `model_dir` served by `transformers serve`, and
    the serving figures (startup, generated tokens, tokens/s)."""
    from agent.policies import make_policy
    from agent.serving import serve_checkpoint
    from agent.settings import PolicySettings
    from collection.evaluation import run_evaluation

    # The server is a second process with the model: what a stage before it freed (SFT,
    # GRPO: 18.4 GiB after run N's) goes back to the kernel first, else the evaluation
    # starves for page cache or the OOM killer picks this process.
    release_memory(args.quiet, f"serving {run_key}")
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
                    settings=eval_settings(args, max_parse_failures=args.eval_max_parse_failures),
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


def eval_settings(args: argparse.Namespace, *, max_parse_failures: int | None = None) -> Any:
    """The environment's settings with the recipe's evaluation budget (episodes are stored
    in the loop's database, `args.engine`, as collection runs `loop-eval-…`)."""
    from collection.evaluation import evaluation_settings
    from config.settings import load_settings

    return evaluation_settings(
        load_settings(), max_steps=args.eval_max_steps, max_parse_failures=max_parse_failures
    )


def evaluate(
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
                settings=eval_settings(args),
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


def stored_evaluation(
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


def base_heldout_tasks(heldout: list[Any], templates: list[str], per_template: int) -> list[Any]:
    """The first `per_template` held-out instances of each template (the base's)."""
    return [
        t for name in templates for t in [h for h in heldout if h.template == name][:per_template]
    ]
