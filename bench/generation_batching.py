"""Rollout generation on CPU: one static `generate` batch against transformers' continuous batching.

    python bench/generation_batching.py [--model DIR] [--rows 16] [--new-tokens 96]
                                        [--threads 2] [--seed 0]

Agentic GRPO's rollouts spend most of the RL stage generating (`docs/training.md`, "Where
the rollout time goes"): the `hf:` policy runs one `model.generate` at a time over the
turns waiting at that moment, and a batch runs until its longest row ends. Continuous
batching (`model.generate_batch`, transformers ≥ 5: paged KV cache, rows join and leave
at every step) is the usual cure on a GPU. This measures whether it pays on this CPU, on
the case most favourable to the static batch: `--rows` prompts that all arrive at once.

Both paths get the same prompts (SmolLM2's chat template around 300-700 words of this
repository's docs: ~650-1,500 tokens, the length of a multi-turn rollout's later turns),
sample at temperature 1 with the same budget of new tokens, in bf16 on `--threads`
threads; the continuous path records logprobs (what a rollout needs) and gets an
explicit cache (`num_blocks`, `max_batch_tokens`): left to size itself on a CPU it takes
most of the machine's memory (a 14 GB process on the 24 GiB machine, killed by the OOM
killer). Prints JSON: tokens, seconds and tokens/s of each path, their ratio, the load
average before and after and the CPU flags.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loop_rl import cpu_flags  # this folder: the script's own, first on sys.path

DEFAULT_MODEL = Path.home() / ".epiflow" / "models" / "smollm2-135m-instruct"
"""Where `epiflow models prepare smollm2` puts SmolLM2-135M-Instruct."""

PAGE_SIZE = 256
"""Tokens per block of the continuous path's paged cache (transformers' default)."""


def prompts(tokenizer: Any, rows: int, seed: int) -> list[list[int]]:
    """`rows` chat prompts of 300-700 words of docs/*.md each, deterministic in `seed`."""
    text = " ".join(p.read_text() for p in sorted(Path(__file__).parents[1].glob("docs/*.md")))
    words = text.split()
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        n = rng.randint(300, 700)
        start = rng.randint(0, len(words) - n)
        messages = [
            {"role": "user", "content": " ".join(words[start : start + n]) + "\nSummarise."}
        ]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def static(model: Any, tokenizer: Any, rows: list[list[int]], config: Any) -> tuple[int, float]:
    """New tokens (up to each row's end of turn) and seconds of one left-padded `generate`."""
    import torch

    pad = tokenizer.pad_token_id
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    started = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    seconds = time.perf_counter() - started
    eos = tokenizer.eos_token_id
    new = [row[width:] for row in output.tolist()]
    return sum(r.index(eos) + 1 if eos in r else len(r) for r in new), seconds


def continuous(
    model: Any, rows: list[list[int]], config: Any, new_tokens: int
) -> tuple[int, float]:
    """New tokens and seconds of `model.generate_batch` with logprobs and a cache sized for
    the rows."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    need = sum(len(r) + new_tokens for r in rows)
    cb = ContinuousBatchingConfig(
        return_logprobs=True,
        page_size=PAGE_SIZE,
        num_blocks=2 * (need // PAGE_SIZE + len(rows)),
        max_batch_tokens=2048,
    )
    started = time.perf_counter()
    out = model.generate_batch(
        rows, generation_config=config, continuous_batching_config=cb, warmup=False
    )
    seconds = time.perf_counter() - started
    return sum(len(o.generated_tokens) for o in out.values()), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.model.is_dir():
        sys.exit(f"no model at {args.model}: run `epiflow models prepare smollm2` first")

    import torch
    import transformers

    tf: Any = transformers  # untyped

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    tokenizer = tf.AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    model = tf.AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.bfloat16, local_files_only=True
    ).eval()
    rows = prompts(tokenizer, args.rows, args.seed)
    config = tf.GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.new_tokens,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(args.seed)
    static_tokens, static_s = static(model, tokenizer, rows, config)
    torch.manual_seed(args.seed)
    cb_tokens, cb_s = continuous(model, rows, config, args.new_tokens)
    print(
        json.dumps(
            {
                "rows": args.rows,
                "prompt_tokens": sorted(len(r) for r in rows),
                "new_tokens_budget": args.new_tokens,
                "threads": args.threads,
                "static_tokens": static_tokens,
                "static_s": round(static_s, 1),
                "static_tokens_per_s": round(static_tokens / static_s, 1),
                "continuous_tokens": cb_tokens,
                "continuous_s": round(cb_s, 1),
                "continuous_tokens_per_s": round(cb_tokens / cb_s, 1),
                "continuous_over_static": round((cb_tokens / cb_s) / (static_tokens / static_s), 2),
                "load_avg": [round(x, 2) for x in (load_before[0], os.getloadavg()[0])],
                "cpu_flags": cpu_flags(),
            }
        )
    )


if __name__ == "__main__":
    main()
