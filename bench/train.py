"""Benchmark: the TRL SFT path vs a plain torch training loop, same model, batches and steps.

    python bench/train.py --json [--steps 8] [--batch 4] [--examples 24] [--hidden 256] [--layers 4]

Builds the local base model (tokenizer on the protocol corpus, a Qwen2 from a config),
then SFT conversations from the built-in suite's reference solutions (system prompt,
task, each call, an observation, the final answer), and trains twice from the same
initial weights:

- `trl_tokens_per_s`: `training.trainers.run_training("sft", …)` (TRL's `SFTTrainer`,
  assistant-only loss), non-padding tokens seen / wall time of `trainer.train()`.
- `torch_tokens_per_s`: the same tokenized examples (TRL's training chat template and
  assistant mask), the same batch size, padding and step count, AdamW with the same
  learning rate, in a bare `forward / backward / step` loop.

`ratio = trl_tokens_per_s / torch_tokens_per_s`; target ≥ 0.8. Both exclude model loading
and tokenization; an untimed warm-up run of each path comes first, then `--repeat`
alternating runs, best of each (the machine is shared: best-of filters other load).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl
import torch

from agent.render import render_final, render_tool_call
from sandbox.tool_specs import BUILTIN_TOOLS
from suites.registry import load_suite
from training.base_model import build_base_model, protocol_corpus
from training.conversations import system_prompt_for
from training.settings import TrainingSettings
from training.trainers import run_training
from training.trainers.common import load_model, load_tokenizer


def conversations(n: int) -> list[list[dict[str, str]]]:
    """Oracle-style chats: every reference call, a short observation, the final answer."""
    system = system_prompt_for(BUILTIN_TOOLS.values())
    tasks = load_suite("builtin").instances(max(1, n // 13 + 1))[:n]
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
) -> float:
    """Tokens per second of a bare training loop on the same examples."""
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
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += int(attention.sum())
    return tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--examples", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    settings = TrainingSettings(
        vocab_size=4096,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 4,
        num_layers=args.layers,
        max_length=1536,
        max_position_embeddings=2048,
        max_steps=args.steps,
        batch_size=args.batch,
        logging_steps=args.steps,
    )
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        suite_tasks = load_suite("builtin").instances(1)
        base = build_base_model(root / "base", protocol_corpus(suite_tasks), settings=settings)
        chats = conversations(args.examples)
        frame = pl.DataFrame({"messages": chats, "weight": [1.0] * len(chats)})
        examples = tokenized(base, chats, settings.max_length)
        pad_id = int(load_tokenizer(base).pad_token_id)
        # One-time costs (imports, kernel selection, allocator warm-up) hit whichever path
        # runs first in the process; a short untimed run of each keeps them out of the numbers.
        warm = settings.model_copy(update={"max_steps": 2})
        run_training(
            "sft", dataset=frame, base_model_dir=base, output_dir=root / "warm", settings=warm
        )
        torch_loop(
            base, examples, steps=2, batch=args.batch, lr=settings.sft_learning_rate, pad_id=pad_id
        )
        trl_best = 0.0
        torch_best = 0.0
        for i in range(args.repeat):
            result = run_training(
                "sft",
                dataset=frame,
                base_model_dir=base,
                output_dir=root / f"out{i}",
                settings=settings,
            )
            trl_best = max(trl_best, result.tokens_per_s)
            torch_best = max(
                torch_best,
                torch_loop(
                    base,
                    examples,
                    steps=args.steps,
                    batch=args.batch,
                    lr=settings.sft_learning_rate,
                    pad_id=pad_id,
                ),
            )
    report = {
        "trl_tokens_per_s": round(trl_best, 1),
        "torch_tokens_per_s": round(torch_best, 1),
        "ratio": round(trl_best / torch_best, 3) if torch_best else None,
        "steps": args.steps,
        "batch": args.batch,
        "hidden": args.hidden,
        "layers": args.layers,
        "examples": len(examples),
        "mean_tokens_per_example": round(
            sum(len(e["input_ids"]) for e in examples) / len(examples), 1
        ),
    }
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
