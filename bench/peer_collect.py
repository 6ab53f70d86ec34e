"""Benchmark: epiflow's collection side by side with a peer harness, inspect_ai.

    python bench/peer_collect.py --json [--tasks 4] [--concurrency 8]

The same episodes run twice, at the same concurrency:

- `epiflow_s`: the `collect-episodes` flow (what `epiflow collect` runs), scripted oracle
  over every template of the built-in suite: one nsjail per episode, the verifier in the
  jail, every object and row persisted (SQLite + a local object directory), Prefect tasks
  and artifacts, on a warmed Prefect test server (`bench/collect_throughput.py`'s
  `collect_timed`, the same timing).
- `inspect_s`: inspect_ai's own harness (`inspect_ai.eval`) with its `local` sandbox (no
  isolation: a temporary directory on the host): one `Sample` per stored episode, a solver
  that replays the episode's recorded tool calls (the trajectory's steps, as stored by the
  epiflow run) in the sample's sandbox, and a scorer that runs the task's verifier there.
  The workspace files are written with `sandbox().write_file`, `execute_shell` and
  `list_dir` run through `sandbox().exec()`, `read_file` and `write_file` through the
  sandbox's file API; the verifier is the task's own `python3 -I -` script run through
  `sandbox().exec()` with the sandbox interpreter (`python3 -I -S`, as the jail runs it),
  `/workspace` rewritten to the sample's directory. `max_samples`, `max_sandboxes` and
  `max_subprocesses` are the concurrency; the eval log is written to a temporary directory
  (inspect's own persistence). `inspect_score` is the mean score: 1.0 when the replay did
  what the oracle did. Before it, untimed, one sample is evaluated in this process so
  that inspect's lazy imports (its model providers, the openai types, its control
  server: tens of seconds here, where the venv has no bytecode) are paid, as in a
  harness that has run before; epiflow's own first-flow costs (Prefect's lazy imports,
  clients) are timed, so the comparison leans towards inspect.

`ratio = epiflow_s / inspect_s`: target ≤ 1.0 (issue 26: epiflow, isolated and persisting
everything, no slower than inspect without isolation). Both phases are CPU-bound on a
2-core machine; the load average is printed at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collect_throughput import collect_timed  # this folder: the script's own, first on sys.path

if TYPE_CHECKING:
    from inspect_ai import Task

    from agent.trajectory import Trajectory

WORKSPACE = "/workspace"


def replay_calls(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The tool calls an episode made, in order: `{"tool", "args"}`."""
    from agent.trajectory import ParseKind

    return [
        {"tool": s.tool, "args": dict(s.args or {})}
        for s in trajectory.steps
        if s.parse_kind == ParseKind.TOOL_CALL and s.tool
    ]


def samples(trajectories: list[Trajectory]) -> list[Any]:
    """One inspect `Sample` per episode: its task's prompt, workspace files, recorded calls
    and verifier (the task regenerated from the built-in suite, as `epiflow replay` does)."""
    from inspect_ai.dataset import Sample

    from sandbox.settings import SandboxSettings
    from suites.registry import load_suite
    from suites.settings import SuitesSettings

    suite = load_suite("builtin", settings=SuitesSettings(), sandbox=SandboxSettings())
    out = []
    for t in trajectories:
        task = suite.generate(t.template, t.instance_seed)
        inline = task.verifier.inline_python
        if inline is None:
            raise SystemExit(f"{task.task_id}: the peer replays `python3 -I -` verifiers only")
        script, args = inline
        out.append(
            Sample(
                id=str(t.episode_id),
                input=task.prompt,
                metadata={
                    "files": task.files,
                    "calls": replay_calls(t),
                    "verifier": {
                        "script": script,
                        "args": args,
                        "timeout_s": task.verifier.timeout_s,
                    },
                },
            )
        )
    return out


def peer_task(dataset: list[Any], python: str) -> Task:
    """The inspect Task: replay each sample's calls in its `local` sandbox, score with its
    verifier."""
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset
    from inspect_ai.scorer import Score, Target, mean, scorer
    from inspect_ai.solver import Generate, TaskState, solver
    from inspect_ai.util import sandbox

    from tasks.verify import parse_verifier_stdout

    @solver
    def replay() -> Any:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            box = sandbox()
            for path, content in state.metadata["files"].items():
                await box.write_file(path, content)
            for call in state.metadata["calls"]:
                tool, args = call["tool"], call["args"]
                if tool == "execute_shell":
                    timeout = int(args.get("timeout") or 30)
                    await box.exec(["/bin/sh", "-c", args["command"]], timeout=timeout)
                elif tool == "list_dir":
                    await box.exec(["ls", "-la", args["path"]], timeout=30)
                elif tool == "read_file":
                    try:
                        await box.read_file(args["path"])
                    except (FileNotFoundError, IsADirectoryError, PermissionError):
                        pass  # a tool error is an observation, not a harness failure
                elif tool == "write_file":
                    await box.write_file(args["path"], args["content"])
                else:
                    raise ValueError(f"no replay for tool {tool!r}")
            return state

        return solve

    @scorer(metrics=[mean()])
    def verifier() -> Any:
        async def score(state: TaskState, target: Target) -> Score:
            box = sandbox()
            spec = state.metadata["verifier"]
            script = spec["script"]
            if WORKSPACE in script:
                here = (await box.exec(["pwd"])).stdout.strip()
                script = script.replace(WORKSPACE, here)
            done = await box.exec(
                [python, "-I", "-S", "-", *spec["args"]],
                input=script,
                timeout=int(spec["timeout_s"]),
            )
            if not done.success:
                return Score(value=0.0, explanation=f"verifier error: {done.stderr[-300:]}")
            try:
                value, reason = parse_verifier_stdout(done.stdout)
            except ValueError as e:
                return Score(value=0.0, explanation=f"verifier error: {e}")
            return Score(value=value, explanation=reason)

        return score

    return Task(dataset=MemoryDataset(dataset), solver=replay(), scorer=verifier(), sandbox="local")


def run_inspect(task: Task, concurrency: int, log_dir: Path) -> tuple[float, float, int]:
    """`inspect_ai.eval` of `task`; (wall seconds, mean score, samples scored)."""
    from inspect_ai import eval as inspect_eval

    started = time.perf_counter()
    (log,) = inspect_eval(
        task,
        model="mockllm/model",
        max_samples=concurrency,
        max_sandboxes=concurrency,
        max_subprocesses=concurrency,
        log_dir=str(log_dir),
        display="none",
        fail_on_error=True,
    )
    inspect_s = time.perf_counter() - started
    if log.status != "success" or log.results is None:
        raise SystemExit(f"inspect eval ended {log.status}: {log.error}")
    score = log.results.scores[0].metrics["mean"].value
    return inspect_s, float(score), log.results.completed_samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4, help="instances per template")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_start = os.getloadavg()

    work = Path(tempfile.mkdtemp(prefix="epiflow-bench-peer-"))
    try:
        result, epiflow_s, _cpu_s, trajectories = collect_timed(
            work, tasks=args.tasks, concurrency=args.concurrency
        )
        from config.settings import load_settings

        python = load_settings().sandbox.python_path
        dataset = samples(trajectories)
        run_inspect(peer_task(dataset[:1], python), 1, work / "warm-up-logs")
        task = peer_task(dataset, python)
        inspect_s, inspect_score, scored = run_inspect(task, args.concurrency, work / "logs")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {
        "episodes": result.episodes,
        "inspect_samples": scored,
        "tool_calls": sum(len(replay_calls(t)) for t in trajectories),
        "concurrency": args.concurrency,
        "epiflow_s": round(epiflow_s, 3),
        "inspect_s": round(inspect_s, 3),
        "ratio": round(epiflow_s / inspect_s, 3),
        "epiflow_episodes_per_s": round(result.episodes / epiflow_s, 2),
        "inspect_episodes_per_s": round(scored / inspect_s, 2),
        "epiflow_success_rate": result.success_rate,
        "inspect_score": inspect_score,
        "target_ratio": 1.0,
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
