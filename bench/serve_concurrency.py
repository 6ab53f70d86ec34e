"""Aggregate generation tokens/s of one `transformers serve` with 8 concurrent chat
requests against one stream (issue 22 item 2: concurrent episodes must not be served one
at a time). Prints JSON only.

    python bench/serve_concurrency.py --model-dir DIR [--concurrency 8] [--requests 8] --json
    python bench/serve_concurrency.py --base-url http://127.0.0.1:8000/v1 --model DIR --json

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
from agent.settings import PolicySettings


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


def _measure(url: str, model: str, args: argparse.Namespace) -> dict[str, object]:
    common = {"max_tokens": args.max_tokens}
    # Warm-up (the first completion of a continuous-batching server on a CPU takes minutes:
    # its cache and warm-up) outside both measurements.
    asyncio.run(_arm(url, model, concurrency=1, requests=1, **common))
    single = asyncio.run(_arm(url, model, concurrency=1, requests=args.single_requests, **common))
    concurrent = asyncio.run(
        _arm(url, model, concurrency=args.concurrency, requests=args.requests, **common)
    )
    return {
        "model": model,
        "max_tokens": args.max_tokens,
        "single_stream": single,
        f"concurrent_{args.concurrency}": concurrent,
        "speedup": round(float(concurrent["tokens_per_s"]) / float(single["tokens_per_s"]), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, help="checkpoint to serve (started here)")
    parser.add_argument("--base-url", help="or a running server (e.g. http://127.0.0.1:8000/v1)")
    parser.add_argument("--model", help="with --base-url: the model name it serves")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=8, help="requests of the concurrent arm")
    parser.add_argument("--single-requests", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--no-continuous-batching",
        action="store_true",
        help="serve without continuous batching (the comparison: requests one at a time)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.base_url:
        figures = _measure(args.base_url, args.model or "", args)
    elif args.model_dir:
        with (
            tempfile.TemporaryDirectory() as work,
            serve_checkpoint(
                args.model_dir,
                log_path=Path(work) / "serve.log",
                policy=PolicySettings(),
                continuous_batching=not args.no_continuous_batching,
            ) as served,
        ):
            figures = _measure(served.base_url, served.model, args)
    else:
        parser.error("give --model-dir, or --base-url and --model")
    figures["continuous_batching"] = not args.no_continuous_batching
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
