"""Benchmark: Harbor task images (cold and cached builds) and what an episode pays for them.

    python bench/harbor.py --json [--episodes 3] [--images-dir DIR] [--no-cold]
    python bench/harbor.py --dataset DIR --json [--tasks a,b | --limit N] [--no-run]
        [--images-dir DIR] [--keep-images]

Dataset mode (`--dataset`, issue 44) is described in `dataset_main`; what follows is the
two-task mode.

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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.substituted_base import SUBSTITUTED_BASE
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


# ---- dataset mode (issue 44): a whole Harbor dataset, one outcome per task -------------

ENV_REASONS = (
    (SUBSTITUTED_BASE, f"{SUBSTITUTED_BASE}: "),
    ("verifier-network", "needs the network"),
    ("verifier-space", "do not fit its jail"),
    ("verifier-timeout", "timed out"),
    ("verifier-no-reward", "wrote neither"),
    ("verifier-jail", "verifier jail"),
    ("workdir-too-large", "too large"),
)
"""`env_error_by_reason` buckets: a bench-side summary of the stored reason text (an
episode records no structured kind of environment error); the full reason is in `per_task`.
`substituted-base` first: its reason quotes the verifier's, which may hold another's words."""


@dataclass(frozen=True)
class Refusal:
    """A task directory the loader left out."""

    category: str
    message: str


@dataclass(frozen=True)
class LoadedDataset:
    """A dataset as the loader gave it: the suite (None when no task loads), every task
    directory, the suite's task name per loaded directory, and a `Refusal` per other one."""

    suite: HarborSuite | None
    dirs: list[str]
    loaded: dict[str, str]
    refused: dict[str, Refusal]
    load_s: float


def load_dataset(folder: Path, images_dir: Path) -> LoadedDataset:
    """Load `folder` as a user does (`EPIFLOW_SUITES_PATH=folder`, then the suite of that
    name): the loader never raises for a task; each one it left out is a `RefusedTask` with
    its documented category (`suites.harbor.errors`)."""
    from sandbox import SandboxSettings
    from suites.harbor.suite import task_dirs
    from suites.registry import load_suite
    from suites.settings import SuitesSettings

    settings = SuitesSettings(path=[folder], include_examples=False, harbor_image_dir=images_dir)
    dirs = [p.name for p in task_dirs(folder)]
    started = time.perf_counter()
    loaded = load_suite(folder.name, settings=settings, sandbox=SandboxSettings())
    if not isinstance(loaded, HarborSuite):
        raise SystemExit(f"--dataset: {folder} is not a Harbor dataset (it holds suite.yaml)")
    load_s = round(time.perf_counter() - started, 3)
    refused = {
        r.task.name: Refusal(str(r.category), r.message.replace(f"{folder}/", ""))
        for r in loaded.refused
    }
    names = {t.path.name: t.name for t in loaded.tasks.values()}
    return LoadedDataset(loaded, dirs, names, refused, load_s)


def _env_reason(reason: str) -> str:
    for name, needle in ENV_REASONS:
        if needle in reason:
            return name
    return "verifier-other" if reason.startswith("verifier error") else "episode"


def run_oracle(suite: HarborSuite, name: str, sandbox_settings: Any) -> dict[str, Any]:
    """Build the task's image (timed: cold when the images folder was fresh), then one
    `scripted:oracle` episode through `epiflow suites check`'s episode path."""
    from agent.trajectory import INFRASTRUCTURE_STATUSES
    from cli.suites import _run_check
    from core.errors import EpiflowError
    from sandbox.images import ImageBuildError
    from suites.check import ORACLE_POLICY

    out: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        env = suite.environment(name)
    except ImageBuildError as e:  # the task's infrastructure outcome, never an abort
        out.update(
            outcome="env_error", reason="build", detail=str(e)[-400:],
            cold_build_s=round(time.perf_counter() - started, 2),
        )  # fmt: skip
        return out
    out["cold_build_s"] = round(time.perf_counter() - started, 2)
    out["image_build_s"] = env.build_s
    started = time.perf_counter()
    try:
        task = suite.generate(name, 0)
        report = asyncio.run(_run_check(suite, [task], ORACLE_POLICY, 1, sandbox_settings, []))
    except EpiflowError as e:  # recorded as this task's outcome; the others still run
        out.update(outcome="bench_error", detail=f"{type(e).__name__}: {e}"[:400])
        return out
    out["episode_s"] = round(time.perf_counter() - started, 2)
    check = report.templates[0]
    if check.failed:
        result = check.failed[0]
        status, score, reason, verify_s = (
            result.status,
            result.score,
            result.reason,
            result.verify_s,
        )
        out["failed_steps"] = len(result.failed_steps)
    else:
        status, score, reason, verify_s = "success", check.mean_score, "", check.verify_s
    out.update(status=status, score=score, verify_s=verify_s)
    if status in {str(s) for s in INFRASTRUCTURE_STATUSES}:
        out.update(outcome="env_error", reason=_env_reason(reason), detail=reason[:400])
    elif status == "success":
        out["outcome"] = "oracle_1_0" if score >= 1.0 else "oracle_below_1_0"
    else:
        out.update(outcome="agent_failed", detail=reason[:400])
    return out


def dataset_main(args: argparse.Namespace) -> None:
    """`--dataset DIR`: every task directory of DIR, loaded as a user loads it, one outcome each.

    Prints one JSON object: `tasks` (task directories), `loaded`, `refused_by_category`,
    `load_s`; unless `--no-run`, for the selected loaded tasks (`--tasks`, `--limit`), one at
    a time: the image built (`cold_build_s`, summed; cold when `--images-dir` is not given:
    a fresh folder, bases included), a `scripted:oracle` episode, then every image asked
    for again from a freshly loaded suite (`warm_build_s`); `oracle_1_0`,
    `oracle_below_1_0`, `env_error_by_reason` (a failed build is `build`), `agent_failed`,
    `bench_error`, `by_status`; `per_task` (every task directory: its outcome, category or
    reason, times); `load_avg` (1-minute, start and end).
    """
    load_start = os.getloadavg()[0]
    folder = args.dataset.resolve()
    fresh = args.images_dir is None
    images = (
        Path(tempfile.mkdtemp(prefix="epiflow-bench-dataset-", dir="/var/tmp"))
        if fresh
        else args.images_dir.resolve()
    )
    images.mkdir(parents=True, exist_ok=True)
    images.chmod(0o755)
    try:
        out = _run_dataset(args, folder, images)
    finally:
        if fresh and not args.keep_images:
            shutil.rmtree(images, ignore_errors=True)
    out.update(
        images_dir=str(images), images_dir_fresh=fresh,
        load_avg={"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)},
    )  # fmt: skip
    print(json.dumps(out, indent=None if args.json else 2))


def _run_dataset(args: argparse.Namespace, folder: Path, images: Path) -> dict[str, Any]:
    dataset = load_dataset(folder, images)
    wanted = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    unknown = sorted(set(wanted or ()) - set(dataset.dirs))
    if unknown:
        raise SystemExit(f"--tasks: no task directory {', '.join(unknown)} in {folder}")
    per_task: dict[str, dict[str, Any]] = {}
    for name in dataset.dirs:
        if name in dataset.refused:
            refusal = dataset.refused[name]
            per_task[name] = {
                "outcome": "refused", "category": refusal.category, "message": refusal.message,
            }  # fmt: skip
        else:
            per_task[name] = {"outcome": "loaded" if args.no_run else "not_selected"}
    out: dict[str, Any] = {
        "dataset": str(folder),
        "tasks": len(dataset.dirs),
        "loaded": len(dataset.loaded),
        "refused_by_category": dict(Counter(r.category for r in dataset.refused.values())),
        "load_s": dataset.load_s,
    }
    selected = [d for d in dataset.dirs if d in dataset.loaded and (wanted is None or d in wanted)]
    selected = selected[: args.limit] if args.limit is not None else selected
    if args.no_run or dataset.suite is None:
        return {**out, "selected": len(selected), "ran": 0, "per_task": per_task}
    from sandbox import SandboxSettings

    sandbox_settings = SandboxSettings()
    for i, name in enumerate(selected, 1):
        per_task[name] = run_oracle(dataset.suite, dataset.loaded[name], sandbox_settings)
        print(f"[{i}/{len(selected)}] {name}: {per_task[name]['outcome']}", file=sys.stderr)
    warm = load_dataset(folder, images).suite
    built = [n for n in selected if "image_build_s" in per_task[n]]
    for name in built:
        if warm is None:
            break
        started = time.perf_counter()
        warm.environment(dataset.loaded[name])
        per_task[name]["warm_build_s"] = round(time.perf_counter() - started, 3)
    ran = [per_task[n] for n in selected]
    outcomes = Counter(r["outcome"] for r in ran)
    return {
        **out,
        "selected": len(selected),
        "ran": len(ran),
        "oracle_1_0": outcomes["oracle_1_0"],
        "oracle_below_1_0": outcomes["oracle_below_1_0"],
        "env_error": outcomes["env_error"],
        "env_error_by_reason": dict(
            Counter(r["reason"] for r in ran if r["outcome"] == "env_error")
        ),
        "agent_failed": outcomes["agent_failed"],
        "bench_error": outcomes["bench_error"],
        "by_status": dict(Counter(r["status"] for r in ran if "status" in r)),
        "cold_build_s": round(sum(r.get("cold_build_s", 0.0) for r in ran), 2),
        "warm_build_s": round(sum(per_task[n].get("warm_build_s", 0.0) for n in built), 3),
        "per_task": per_task,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print JSON (the only output)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument(
        "--images-dir",
        type=Path,
        default=None,
        help="images folder (two-task mode: default $TMPDIR/epiflow-test-images; "
        "--dataset: default a fresh folder under /var/tmp, removed at the end)",
    )
    parser.add_argument("--no-cold", action="store_true", help="skip the build from nothing")
    parser.add_argument("--dataset", type=Path, help="a Harbor dataset folder: run it per task")
    parser.add_argument("--tasks", help="--dataset: only these task directories (a,b,…)")
    parser.add_argument("--limit", type=int, help="--dataset: only the first N loaded tasks")
    parser.add_argument("--no-run", action="store_true", help="--dataset: only load and categorise")
    parser.add_argument(
        "--keep-images", action="store_true", help="--dataset: keep a fresh images folder"
    )
    args = parser.parse_args()
    if args.dataset is not None:
        dataset_main(args)
        return
    if args.images_dir is None:
        args.images_dir = Path(tempfile.gettempdir()) / "epiflow-test-images"
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
