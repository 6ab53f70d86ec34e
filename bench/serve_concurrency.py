"""Aggregate generation tokens/s of one `transformers serve` with 8 concurrent chat
requests against one stream (issue 22 item 2: concurrent episodes must not be served one
at a time). Prints JSON only.

    python bench/serve_concurrency.py --model-dir DIR [--concurrency 8] [--requests 16] --json

The server is started by `agent.serving.serve_checkpoint` (continuous batching on); each
request asks for a long story capped at `--max-tokens` (`transformers serve` refuses
`ignore_eos` with 422, so the prompt makes the answers long); tokens are those actually
generated, the server's `usage.completion_tokens`, reported with the per-request range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from agent.serving import serve_checkpoint


async def _one(client: httpx.AsyncClient, url: str, model: str, max_tokens: int, i: int) -> int:
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {
                "role": "user",
                "content": f"Write a long, detailed story (at least 500 words) about a robot "
                f"named Unit {i} who learns to sort files in a directory tree.",
            },
        ],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    response = await client.post(f"{url}/chat/completions", json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


async def _arm(
    url: str, model: str, *, concurrency: int, requests: int, max_tokens: int
) -> dict[str, float | int]:
    async with httpx.AsyncClient(timeout=600) as client:
        gate = asyncio.Semaphore(concurrency)

        async def gated(i: int) -> int:
            async with gate:
                return await _one(client, url, model, max_tokens, i)

        started = time.perf_counter()
        each = await asyncio.gather(*(gated(i) for i in range(requests)))
        wall = time.perf_counter() - started
    tokens = sum(each)
    return {
        "requests": requests,
        "tokens": tokens,
        "tokens_per_request_min": min(each),
        "tokens_per_request_max": max(each),
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as work,
        serve_checkpoint(args.model_dir, log_path=Path(work) / "serve.log") as served,
    ):
        common = {"max_tokens": args.max_tokens}
        # Warm-up (first-request compilation and caches) outside both measurements.
        asyncio.run(_arm(served.base_url, served.model, concurrency=1, requests=1, **common))
        single = asyncio.run(
            _arm(
                served.base_url,
                served.model,
                concurrency=1,
                requests=max(2, args.requests // 4),
                **common,
            )
        )
        concurrent = asyncio.run(
            _arm(
                served.base_url,
                served.model,
                concurrency=args.concurrency,
                requests=args.requests,
                **common,
            )
        )
    print(
        json.dumps(
            {
                "model_dir": str(args.model_dir),
                "max_tokens": args.max_tokens,
                "single_stream": single,
                f"concurrent_{args.concurrency}": concurrent,
                "speedup": round(concurrent["tokens_per_s"] / single["tokens_per_s"], 2),
                "load_average": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    main()
