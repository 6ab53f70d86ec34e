"""One GRPO generation batch of real rollouts, decoded continuously, with and without a window.

    python bench/rollout_batching.py --model DIR [--windows 0 1.0] [--groups 9]
                                     [--rollouts-per-task 6] [--concurrency 16] [--seed 0]
                                     [--temperature 1.0]

The `hf:` policy decodes the concurrent episodes' turns in one batch that rows join and
leave at every step (`agent.policies.hf_decode`); the episodes fall out of step between
turns (tools, jails, verifiers). `TrainingSettings.rollout_batch_window_s`
(`HFGeneration.batch_window_s`) holds an idle policy up to that long for more rows, and
no longer once `--concurrency` wait. This runs the same batch (`--groups` tasks of the
smollm2 templates, `--rollouts-per-task` each, at `--temperature` (the recipe's 1), turn
limits and tokens of
the recipe's evaluation) once per `--windows` value, back to back, through
`collection.grpo_rollouts.run_grpo_rollouts` (real nsjail sandboxes, the online gate, a
throwaway database and store) with the checkpoint at `--model` as the trainer's model
(the rollouts come from its bf16 copy, as in the recipe on a bf16 CPU). Prints JSON per
window: the batch's wall time, sampled tokens and tokens/s, turns, joins (prefills) and
rows per join, decode steps and rows per step, the largest batch, a turn's mean wait for
its answer (`generation_latency_ms`), the turns' prompt tokens and those an earlier turn's
KV cache held (not prefilled again), successes (in all, and [successes, rollouts] per
template); with the load average before and after
and the CPU flags.

`--model`: an SFT checkpoint directory, e.g. `<work>/rl-from-…/rl/base` of a
`bench/loop.py --recipe smollm2-rl --keep` run (the policy must act, or every episode
ends after its first turn).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loop_rl import cpu_flags  # this folder: the script's own, first on sys.path


def one_batch(
    model_dir: Path, window_s: float, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """The batch with `window_s`: its figures (see the module)."""
    import transformers

    from agent.prompt import PromptStyle
    from agent.trajectory import EpisodeStatus
    from collection.evaluation import evaluation_settings
    from collection.grpo_rollouts import run_grpo_rollouts, trainer_model_policy
    from config.settings import load_qc_config, load_settings
    from storage.db import make_engine
    from storage.migrate import upgrade
    from storage.objects import LocalObjectStore
    from storage.settings import DatabaseSettings
    from suites.builtin import builtin_suite
    from training.recipes import SMOLLM2_TEMPLATES
    from training.trainers.episode_grpo import RolloutBatch

    tf: Any = transformers  # untyped
    key = f"bench-rollout-batching-{uuid.uuid4().hex[:8]}"
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{work / (key + '.db')}"))
    upgrade(engine)
    store = LocalObjectStore(work / key)
    store.check()
    settings = evaluation_settings(load_settings(), max_steps=5, max_parse_failures=2)
    per_template = -(-args.groups // len(SMOLLM2_TEMPLATES))
    by_template = builtin_suite().instances(
        per_template, templates=SMOLLM2_TEMPLATES, seed=args.seed
    )
    # Template-major; taken round-robin so that each template gets its share.
    tasks = [t for i in range(per_template) for t in by_template[i::per_template]][: args.groups]
    tokenizer = tf.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    factory = trainer_model_policy(
        run_key=key,
        prompt_style=PromptStyle.COMPACT,
        temperature=args.temperature,
        max_new_tokens=256,
        batch_size=args.concurrency,
        settings=settings,
        generation_dtype="bfloat16",
        batch_window_s=window_s,
    )
    policies: list[Any] = []

    def make(batch: RolloutBatch) -> Any:
        policies.append(factory(batch))
        return policies[-1]

    def train(source: Any) -> tuple[float, list[list[Any]]]:
        batch = RolloutBatch(
            task_ids=[t.task_id for t in tasks],
            rollouts_per_task=args.rollouts_per_task,
            policy_version=0,
            model=model,
            tokenizer=tokenizer,
        )
        started = time.perf_counter()
        groups = source.generate(batch)
        return time.perf_counter() - started, groups

    seconds, groups = run_grpo_rollouts(
        key,
        tasks,
        settings,
        train,
        base_model_dir=model_dir,
        engine=engine,
        store=store,
        qc_config=load_qc_config(),
        concurrency=args.concurrency,
        make_policy=make,
        prompt_style=PromptStyle.COMPACT,
        generation_dtype="bfloat16",
        batch_window_s=window_s,
    )
    episodes = [t for g in groups for t in g]
    sampled = sum(int(t.completion_tokens or 0) for t in episodes)
    stats = policies[0].token_stats
    waits = [s.generation_latency_ms for t in episodes for s in t.steps if s.generation_latency_ms]
    return {
        "batch_window_s": window_s,
        "rollouts": len(episodes),
        "batch_s": round(seconds, 1),
        "sampled_tokens": sampled,
        "rollout_tokens_per_s": round(sampled / seconds, 2),
        "turns": stats.answers,
        "joins": stats.batches,
        "rows_per_join": round(stats.answers / stats.batches, 2) if stats.batches else None,
        "decode_steps": stats.decode_steps,
        "rows_per_step": round(stats.row_steps / stats.decode_steps, 2)
        if stats.decode_steps
        else None,
        "largest_batch": stats.largest_batch,
        "turn_wait_s": round(sum(waits) / len(waits) / 1000, 2) if waits else None,
        "prompt_tokens": sum(int(t.prompt_tokens or 0) for t in episodes),
        "cached_prompt_tokens": stats.cached_prompt_tokens,
        "successes": sum(t.status is EpisodeStatus.SUCCESS for t in episodes),
        "successes_by_template": {
            template: [
                sum(t.status is EpisodeStatus.SUCCESS for t in episodes if t.template == template),
                sum(t.template == template for t in episodes),
            ]
            for template in sorted({t.template for t in episodes})
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--windows", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--groups", type=int, default=9)
    parser.add_argument("--rollouts-per-task", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        sys.exit(f"no checkpoint at {args.model}: pass an SFT checkpoint directory")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="epiflow-rollout-batching-") as tmp:
        runs = [one_batch(args.model, w, args, Path(tmp)) for w in args.windows]
    print(
        json.dumps(
            {
                "runs": runs,
                "groups": args.groups,
                "rollouts_per_task": args.rollouts_per_task,
                "concurrency": args.concurrency,
                "temperature": args.temperature,
                "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "cpu_flags": cpu_flags(),
            }
        )
    )


if __name__ == "__main__":
    main()
