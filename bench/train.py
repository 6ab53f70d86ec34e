"""Benchmark: the trainer's SFT step and GRPO update against bare torch loops, and a FLOP bound.

    python bench/train.py --json [--recipe loop] [--part sft|grpo|both] [--steps 12]
                                 [--examples 48] [--repeat 2] [--variants]
                                 [--grpo-steps 2] [--grpo-groups 1]

The model shape, prompt style, batch size, sequence length, precision and thread policy
are the recipe's (`training.recipes`, default `loop`: what `bench/loop.py` trains); a
recipe with a pretrained base (`--recipe smollm2`) measures that model (SmolLM2-135M,
converted once and cached) instead of building one.
Conversations are oracle-style chats built from the built-in suite's reference solutions
for the recipe's templates (system prompt in the recipe's style, task, each call, a short
observation, the final answer); no sandbox is involved.

- `trl_tokens_per_s`: `training.trainers.run_training("sft", …)` with the recipe's
  settings (its trainer, `WeightedSFTTrainer`: on CPU, the loss without TRL's fused LM
  head, `training.trainers.cpu_sft_loss`): non-padding tokens / wall time of
  `trainer.train()`.
- `torch_tokens_per_s`: the same tokenized examples, batch size, padding, precision,
  thread count and step count in a bare `forward / backward / clip / AdamW` loop. Both
  paths run at one thread count, chosen once before the warm-up (the recipe's
  `torch_threads`, else the idle cores then): `threads`.
- `trl_tokens_per_cpu_s`: the same tokens over the process's CPU time during training,
  i.e. the speed with the cores to itself; `trl_cpu_share` = CPU time / wall time, the
  cores training actually got from the shared machine.
- `flop_bound_tokens_per_s`: what the machine's matmul speed allows. `matmul_gflops` is
  measured now (a square matmul at the trainer's precision and thread count, on the
  machine as loaded now), `flops_per_token` counts the model's training FLOPs
  (6 × non-embedding parameters, the LM head on the trained positions, causal
  attention at the mean sequence length); bound = matmul_gflops / flops_per_token.
- With `--variants`, the TRL path again with one setting changed each time (two threads
  forced, one thread forced, bf16 off), to show what each choice is worth on this machine.
- `bf16`, `autocast`, `eval_dtype` and `precision` (`training.precision.precision_report`):
  whether the trainer ran under bf16 autocast (the recipe's precision, or
  `EPIFLOW_TRAINING_PRECISION`), and the dtype its saved checkpoint is evaluated in.

- With `--part grpo` or `both` (the default), the GRPO update (`bench/train_grpo.py`):
  TRL's `GRPOTrainer` set up as the project's episode GRPO sets it up against a bare
  torch GRPO loop (the same clipped objective, KL to the reference, loss mask and
  normalisation), `--grpo-steps` steps on one fixed batch of `--grpo-groups` groups of
  the recipe's `rollouts_per_task` rollouts built from the same chats (observations
  masked; no generation: the figure is the update's). The recipe's GRPO settings are
  its RL stage's, or its `-rl` twin's (`smollm2` → `smollm2-rl`). Keys `grpo_…`:
  `grpo_trl_tokens_per_s`, `grpo_torch_tokens_per_s` (prompt + completion tokens, no
  padding, × steps / wall time), `grpo_ratio`, `grpo_first_loss` (both paths' first-step
  loss: they agree).
- `cpu_flags`: the `/proc/cpuinfo` flags that decide CPU training speed (AVX-512, AVX512-BF16, AMX).

Every path gets an untimed warm-up, then `--repeat` alternating runs, best of each (the
machine is shared; `load_avg` is the 1-minute load average at the start and the end).
stdout carries only the JSON (or the `key: value` lines without `--json`); libraries'
output goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def conversations(n: int, templates: list[str], style: str) -> list[list[dict[str, str]]]:
    """Oracle-style chats: every reference call, a short observation, the final answer."""
    from agent.render import render_final, render_tool_call
    from sandbox.tool_specs import BUILTIN_TOOLS
    from suites.builtin import builtin_suite
    from training.conversations import system_prompt_for

    system = system_prompt_for(BUILTIN_TOOLS.values(), style)
    per_template = max(1, n // len(templates) + 1)
    tasks = builtin_suite().instances(per_template, templates=templates)[:n]
    chats = []
    for task in tasks:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]
        for i, call in enumerate(task.reference_solution[:4]):
            call_id = f"c{i + 1}"
            messages.append(
                {"role": "assistant", "content": render_tool_call(call_id, call.tool, call.args)}
            )
            result = (
                f'<tool_result id="{call_id}" name="{call.tool}" exit_code="0">ok</tool_result>'
            )
            messages.append({"role": "user", "content": result})
        messages.append({"role": "assistant", "content": render_final(task.reference_final)})
        chats.append(messages)
    return chats


def tokenized(
    model_dir: Path, chats: list[list[dict[str, str]]], max_length: int
) -> list[dict[str, Any]]:
    """What TRL trains on: the training template's ids and assistant mask, cut at max_length."""
    from trl.chat_template_utils import get_training_chat_template

    from training.trainers.common import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    template = get_training_chat_template(tokenizer)
    out = []
    for chat in chats:
        enc = tokenizer.apply_chat_template(
            chat, chat_template=template, return_dict=True, return_assistant_tokens_mask=True
        )
        out.append(
            {
                "input_ids": enc["input_ids"][:max_length],
                "mask": enc["assistant_masks"][:max_length],
            }
        )
    return out


def torch_loop(
    model_dir: Path,
    examples: list[dict[str, Any]],
    *,
    steps: int,
    batch: int,
    lr: float,
    pad_id: int,
    bf16: bool,
    threads: int,
) -> float:
    """Tokens per second of a bare training loop on the same examples."""
    import torch

    from training.trainers.common import load_model

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = load_model(model_dir)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    batches = [examples[(i * batch) % len(examples) :][:batch] for i in range(steps)]
    batches = [b if len(b) == batch else (b + examples)[:batch] for b in batches]
    tokens = 0
    started = time.perf_counter()
    for group in batches:
        width = max(len(e["input_ids"]) for e in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(group), width), dtype=torch.long)
        labels = torch.full((len(group), width), -100, dtype=torch.long)
        for row, e in enumerate(group):
            n = len(e["input_ids"])
            ids[row, :n] = torch.tensor(e["input_ids"])
            attention[row, :n] = 1
            target = torch.tensor(e["input_ids"])
            target[torch.tensor(e["mask"]) == 0] = -100
            labels[row, :n] = target
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += int(attention.sum())
    elapsed = time.perf_counter() - started
    torch.set_num_threads(previous)
    return tokens / elapsed


def matmul_gflops(*, threads: int, bf16: bool, size: int = 512, seconds: float = 1.0) -> float:
    """Measured matmul speed (GFLOP/s) at this precision and thread count, best of 3."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if bf16 else torch.float32
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    best = 0.0
    for _ in range(3):
        n = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds / 3:
            torch.mm(a, b)
            n += 1
        best = max(best, 2 * size**3 * n / (time.perf_counter() - started) / 1e9)
    torch.set_num_threads(previous)
    return best


def flops_per_token(model_dir: Path, *, mean_length: float, trained_fraction: float) -> float:
    """Training FLOPs per token: weights, LM head on trained positions, causal attention."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * config.intermediate_size
    weights = 6 * layers * per_layer
    head = 6 * vocab * h * trained_fraction
    # QKᵀ and AV: 2·T·h multiply-adds per token per layer, half of them under the causal mask.
    attention = 6 * layers * mean_length * h
    return float(weights + head + attention)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from loop_rl import cpu_flags
    from train_grpo import grpo_report, rl_settings_of

    from core.home import epiflow_home
    from suites.builtin import builtin_suite
    from training.base_model import build_base_model, protocol_corpus
    from training.precision import precision_report
    from training.pretrained import PRETRAINED, prepare_pretrained
    from training.recipes import get_recipe
    from training.settings import TrainingSettings
    from training.trainers.common import load_tokenizer, use_bf16

    load_start = os.getloadavg()[0]
    recipe = get_recipe(args.recipe)
    settings = recipe.training_settings(TrainingSettings()).model_copy(
        update={"max_steps": args.steps, "max_time_s": None, "logging_steps": args.steps}
    )
    # Resolved before anything runs: a recipe without GRPO settings fails in one line.
    rl = rl_settings_of(recipe, settings) if args.part in ("grpo", "both") else None
    bf16 = use_bf16(settings)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tasks = builtin_suite().instances(8, templates=recipe.templates)
        if recipe.pretrained is not None:
            # The recipe's pretrained base (SmolLM2 for `smollm2`), converted once, cached.
            base = prepare_pretrained(PRETRAINED[recipe.pretrained], home=epiflow_home())
        else:
            base = build_base_model(
                root / "base",
                protocol_corpus(tasks, prompt_style=settings.prompt_style),
                settings=settings,
            )
        chats = conversations(args.examples, recipe.templates, settings.prompt_style)
        examples = tokenized(base, chats, settings.max_length)
        pad_id = int(load_tokenizer(base).pad_token_id)
        report: dict[str, Any] = {"recipe": recipe.name, "part": args.part}
        if args.part in ("sft", "both"):
            report |= sft_report(args, base, chats, examples, settings, root, pad_id, bf16)
        if rl is not None:
            report |= grpo_report(
                base,
                examples,
                rl,
                root,
                steps=args.grpo_steps,
                groups=args.grpo_groups,
                repeat=args.repeat,
                pad_id=pad_id,
                bf16=use_bf16(rl),
            )
        # The dtype a checkpoint saved by the trainer loads in (either part's warm-up save).
        saved = root / ("warm" if args.part in ("sft", "both") else "grpo-warm")
        precision = precision_report(settings, bf16=bf16, eval_model_dir=saved)
    return report | {
        "bf16": bf16,
        "autocast": precision["autocast"],
        "eval_dtype": precision["eval_dtype"],
        "precision": precision,
        "pretrained": recipe.pretrained,
        "hidden": settings.hidden_size if recipe.pretrained is None else None,
        "layers": settings.num_layers if recipe.pretrained is None else None,
        "prompt_style": settings.prompt_style.value,
        "cores": os.cpu_count(),
        "cpu_flags": cpu_flags(),
        "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }


def sft_report(
    args: argparse.Namespace,
    base: Path,
    chats: list[list[dict[str, str]]],
    examples: list[dict[str, Any]],
    settings: Any,
    root: Path,
    pad_id: int,
    bf16: bool,
) -> dict[str, Any]:
    """The SFT part: TRL's SFT against the bare loop, the FLOP bound, the variants.

    Both paths run at one thread count, chosen once (`torch_threads`, or the idle cores
    now), as the GRPO part does: the trainer's automatic thread tuning would otherwise
    move TRL to two threads mid-run on a quiet machine while the bare loop ran TRL's
    first count. The variants still force their own counts."""
    import polars as pl

    from training.threads import choose_threads
    from training.trainers import run_training

    threads = choose_threads(settings.torch_threads)
    settings = settings.model_copy(update={"torch_threads": threads})
    frame = pl.DataFrame({"messages": chats, "weight": [1.0] * len(chats)})
    mean_length = sum(len(e["input_ids"]) for e in examples) / len(examples)
    trained = sum(sum(e["mask"]) for e in examples) / sum(len(e["mask"]) for e in examples)

    def trl(update: dict[str, Any], name: str) -> dict[str, Any]:
        result = run_training(
            "sft",
            dataset=frame,
            base_model_dir=base,
            output_dir=root / name,
            settings=settings.model_copy(update=update),
        )
        return {
            "tokens_per_s": result.tokens_per_s,
            "tokens_per_cpu_s": result.tokens / result.cpu_s if result.cpu_s else 0.0,
            "cpu_share": result.cpu_s / result.runtime_s if result.runtime_s else 0.0,
            "threads": result.threads,
        }

    def bare(threads: int) -> float:
        return torch_loop(
            base,
            examples,
            steps=args.steps,
            batch=settings.batch_size,
            lr=settings.sft_learning_rate,
            pad_id=pad_id,
            bf16=bf16,
            threads=threads,
        )

    # One-time costs (imports, kernel selection, allocator warm-up) hit whichever path
    # runs first in the process; a short untimed run of each keeps them out of the numbers.
    trl({"max_steps": 2}, "warm")
    bare(threads)
    trl_best: dict[str, Any] = {
        "tokens_per_s": 0.0,
        "tokens_per_cpu_s": 0.0,
        "cpu_share": 0.0,
        "threads": [],
    }
    torch_best = 0.0
    for i in range(args.repeat):
        measured = trl({}, f"trl{i}")
        if measured["tokens_per_s"] > trl_best["tokens_per_s"]:
            trl_best = measured
        torch_best = max(torch_best, bare(threads))
    variants: dict[str, float] = {}
    if args.variants:
        for name, update in (
            ("threads_2", {"torch_threads": 2}),
            ("threads_1", {"torch_threads": 1}),
            ("fp32", {"precision": "fp32", "bf16": None}),
        ):
            variants[name] = round(trl(update, name)["tokens_per_s"], 1)
    gflops = matmul_gflops(threads=threads, bf16=bf16)
    per_token = flops_per_token(base, mean_length=mean_length, trained_fraction=trained)
    bound = gflops * 1e9 / per_token
    return {
        "trl_tokens_per_s": round(trl_best["tokens_per_s"], 1),
        "torch_tokens_per_s": round(torch_best, 1),
        "ratio": round(trl_best["tokens_per_s"] / torch_best, 3) if torch_best else None,
        "trl_tokens_per_cpu_s": round(trl_best["tokens_per_cpu_s"], 1),
        "trl_cpu_share": round(trl_best["cpu_share"], 2),
        "flop_bound_tokens_per_s": round(bound, 1),
        "of_flop_bound": round(trl_best["tokens_per_s"] / bound, 3) if bound else None,
        "matmul_gflops": round(gflops, 1),
        "flops_per_token": round(per_token),
        "threads": trl_best["threads"],
        "variants_tokens_per_s": variants or None,
        "steps": args.steps,
        "batch": settings.batch_size,
        "examples": len(examples),
        "mean_tokens_per_example": round(mean_length, 1),
        "trained_token_fraction": round(trained, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--recipe", default="loop", help="training.recipes preset")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--examples", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--variants", action="store_true", help="also measure forced thread counts and fp32"
    )
    parser.add_argument(
        "--part",
        choices=("sft", "grpo", "both"),
        default="both",
        help="what to measure: the SFT step, the GRPO update, or both",
    )
    parser.add_argument("--grpo-steps", type=int, default=2, help="GRPO optimiser steps per run")
    parser.add_argument(
        "--grpo-groups", type=int, default=1, help="groups of rollouts_per_task per GRPO step"
    )
    args = parser.parse_args()
    # Libraries print progress and notices on stdout; the benchmark's stdout is its JSON.
    with contextlib.redirect_stdout(sys.stderr):
        report = run(args)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
