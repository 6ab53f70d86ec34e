"""Benchmark: Harbor task images (cold and cached builds) and what an episode pays for them.

    python bench/harbor.py --json [--episodes 3] [--images-dir DIR] [--no-cold]

Uses the two tasks of `../shared/interop/harbor-tasks/` (root and mmdebstrap needed):

- `cold_build_s`: both images built from nothing in a fresh images folder (one shared
  trixie base by mmdebstrap, then each task's steps), `cold_build_by_task_s` per task;
- `cached_build_ms`: `ensure_image` again once built (the content hash and the manifest);
- per episode on `hello-world` (`scripted:idle`, so the time is the environment's):
  `episode_p50_s`, `verify_p50_s` (export, verifier jail, `tests/test.sh` with the offline
  uv/pytest toolkit), `image_jail_open_p50_ms` against `toolchain_jail_open_p50_ms`
  (a jail started, populated and closed; the image jail's workdir seeded from the image).

Prints one JSON object on stdout, with the 1-minute load average at start and end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox.images import ensure_image
from suites.harbor.suite import HarborSuite, load_harbor_suite

INTEROP = Path(__file__).resolve().parents[2] / "shared" / "interop" / "harbor-tasks"


def _p50(values: list[float]) -> float:
    return round(statistics.median(values), 3)


async def _opens(suite: HarborSuite, n: int) -> tuple[list[float], list[float]]:
    from sandbox import SandboxSettings, SandboxSpec, open_sandbox

    settings = SandboxSettings()
    image_spec = suite.environment("hello-world").sandbox_spec(SandboxSpec())
    image_ms: list[float] = []
    plain_ms: list[float] = []
    for _ in range(n):
        for spec, sink in ((image_spec, image_ms), (SandboxSpec(), plain_ms)):
            started = time.perf_counter()
            box = await open_sandbox(spec, files={"a.txt": "x"}, settings=settings)
            await box.close()
            sink.append((time.perf_counter() - started) * 1000.0)
    return image_ms, plain_ms


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print JSON (the only output)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument(
        "--images-dir", type=Path, default=Path(tempfile.gettempdir()) / "epiflow-test-images"
    )
    parser.add_argument("--no-cold", action="store_true", help="skip the build from nothing")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    out: dict[str, object] = {}
    if not args.no_cold:
        cold_dir = Path(tempfile.mkdtemp(prefix="epiflow-bench-images-", dir="/var/tmp"))
        cold_dir.chmod(0o755)
        try:
            suite = load_harbor_suite(INTEROP, name="harbor-tasks", images_dir=cold_dir)
            by_task: dict[str, float] = {}
            started = time.perf_counter()
            for name in ("hello-world", "csv-filter"):
                t0 = time.perf_counter()
                suite.environment(name)
                by_task[name] = round(time.perf_counter() - t0, 2)
            out["cold_build_s"] = round(time.perf_counter() - started, 2)
            out["cold_build_by_task_s"] = by_task
        finally:
            shutil.rmtree(cold_dir, ignore_errors=True)
    args.images_dir.mkdir(exist_ok=True)
    args.images_dir.chmod(0o755)
    suite = load_harbor_suite(INTEROP, name="harbor-tasks", images_dir=args.images_dir)
    suite.environment("hello-world")
    suite.environment("csv-filter")
    cached: list[float] = []
    for _ in range(5):
        started = time.perf_counter()
        ensure_image(suite.plans["csv-filter"], args.images_dir)
        cached.append((time.perf_counter() - started) * 1000.0)
    out["cached_build_ms"] = _p50(cached)

    from agent.loop import run_episode
    from agent.policies import make_policy
    from agent.settings import LoopSettings, PolicySettings
    from sandbox import SandboxSettings, SandboxSpec, sandbox_opener

    task = suite.generate("hello-world", 0)
    episode_s: list[float] = []
    verify_s: list[float] = []
    for i in range(args.episodes):
        started = time.perf_counter()
        traj = asyncio.run(
            run_episode(
                task,
                make_policy("scripted:idle", settings=PolicySettings()),
                spec=SandboxSpec(),
                run_key=f"bench-harbor-{i}",
                settings=LoopSettings(),
                open_sandbox=sandbox_opener(SandboxSettings()),
            )
        )
        episode_s.append(time.perf_counter() - started)
        verify_s.append(float((traj.verifier_details or {}).get("harbor", {}).get("verify_s", 0.0)))
    image_ms, plain_ms = asyncio.run(_opens(suite, args.episodes))
    out.update(
        episodes=args.episodes,
        episode_p50_s=_p50(episode_s),
        verify_p50_s=_p50(verify_s),
        image_jail_open_p50_ms=_p50(image_ms),
        toolchain_jail_open_p50_ms=_p50(plain_ms),
        load_start=round(load_start, 2),
        load_end=round(os.getloadavg()[0], 2),
    )
    print(json.dumps(out, indent=2 if not args.json else None))


if __name__ == "__main__":
    main()
