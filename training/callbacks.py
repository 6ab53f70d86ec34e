"""TRL trainer callbacks: the wall-time budget, the metrics hook, thread tuning; the LR schedule.

Imports transformers at module level: import this module only where a trainer is built
(`training.trainers.common` does so lazily).

- `WallTimeStop` ends training at the first optimizer-step boundary past
  `TrainingSettings.max_time_s` (measured from the first step, so model loading and
  dataset preparation do not count) and owns the clock the time-based schedule reads.
- `MetricsLogger` routes every TRL log event (loss, learning rate, grad norm, tokens/s, …)
  to the caller's `on_metrics(step, max_steps, logs)` and to `logging`: never to stdout,
  which is where transformers' `PrinterCallback` would print the dicts.
- `TrainingProgress` prints a progress line (step / planned, last loss, rate, ETA) at
  least every `TrainingSettings.progress_every_s` on the `training.progress` logger, the
  terminal's and the Prefect run's (`core.progress`), with heartbeats while a step runs long.
- `TimedSaves` asks for a checkpoint every N seconds of training and records, in each
  save, how long training had run.
- `ThreadCallback` re-chooses the intra-op thread count as the machine's load changes.
- `MemoryRelease` hands the heap the training freed back to the kernel at a step's end,
  at most every `RELEASE_EVERY_S` (`core.memory.release_freed_memory`), and adds the
  process's memory to every log event (`memory/rss_gib` after the release,
  `memory/freed_gib`, `memory/peak_gib`): an RL stage's process otherwise grew by
  ~0.9 GiB a step, in heap glibc kept, until the machine ran out (docs/training.md).
- `StopWhenAsked` ends training with `TrainingStopped` at the next micro-batch once its
  event is set (a cancelled flow or command: `core.worker_threads.in_worker_thread`).
- `lr_factor` is the warm-up + decay shape; `lr_lambda` turns it into a `LambdaLR`
  function over steps, or over elapsed time when a wall-time budget is set.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from core.memory import release_freed_memory, status_kib
from core.progress import ProgressReporter, log_lines
from training.errors import TrainingStopped
from training.grpo_figures import TokenRate, grpo_step_figures, is_grpo_step
from training.threads import ThreadTuner

__all__ = [
    "ELAPSED_FILE",
    "RELEASE_EVERY_S",
    "MemoryRelease",
    "MetricsHook",
    "MetricsLogger",
    "StopWhenAsked",
    "ThreadCallback",
    "TimedSaves",
    "TrainingProgress",
    "WallTimeStop",
    "lr_factor",
    "lr_lambda",
]

logger = logging.getLogger("epiflow.training")
progress_logger = logging.getLogger("training.progress")
"""Progress lines: under `training`, so they reach a Prefect run's log and the terminal."""

ELAPSED_FILE = "epiflow_elapsed.json"
"""Written into every `checkpoint-<step>` save: `{"step": …, "elapsed_s": …}`."""


MetricsHook = Callable[[int, int, dict[str, float]], None]
"""`on_metrics(step, max_steps, logs)`: called on every TRL log event with its numbers.

`max_steps` is the planned number of optimizer steps; under a wall-time budget it is the
current estimate of the steps that fit (it moves as the speed does)."""


class WallTimeStop(TrainerCallback):
    """Stops training at the first step boundary past `max_time_s` seconds of training."""

    def __init__(self, max_time_s: float) -> None:
        self.max_time_s = max_time_s
        self.started: float | None = None
        self.stopped_early = False
        """True when the budget, not the step count, ended training."""

    def fraction(self) -> float:
        """Elapsed share of the budget in [0, 1] (0 before the first step)."""
        if self.started is None:
            return 0.0
        return min(1.0, (time.perf_counter() - self.started) / self.max_time_s)

    def estimated_steps(self, step: int) -> int:
        """Steps the budget holds at the speed so far."""
        frac = self.fraction()
        return max(step, round(step / frac)) if frac > 0 and step > 0 else step

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.started = time.perf_counter()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.fraction() >= 1.0:
            self.stopped_early = True
            control.should_training_stop = True
            # The last step's metrics still reach the hook (the loss table ends there).
            control.should_log = True
        return control


class StopWhenAsked(TrainerCallback):
    """Raises `TrainingStopped` at the first step or micro-batch boundary after `stop` is
    set: a trainer in a worker thread whose caller was cancelled ends within one
    micro-batch instead of at the end of its run (`control.should_training_stop` would
    wait for the optimiser step, minutes of GRPO rollouts and updates)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def _check(self, state: Any) -> None:
        if self.stop.is_set():
            raise TrainingStopped(f"training stopped at step {state.global_step}: asked to stop")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._check(state)
        return control

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._check(state)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._check(state)
        return control


RELEASE_EVERY_S = 60.0
"""Least seconds between two releases of `MemoryRelease`: after a release the next step
faults its memory in again from the kernel. A release at every step cost `bench/train.py`'s
SFT step (~6 s) 13 % of its tokens/s on the AMX Xeon (565-571 → 488-497; at most every
60 s: 535-550, as without; docs/training.md); a GRPO step over episodes (~3 minutes)
still releases at every step."""


class MemoryRelease(TrainerCallback):
    """At the end of an optimiser step, the heap the training freed goes back to the kernel
    (`core.memory.release_freed_memory`, without a garbage collection: tensors are freed
    by reference counting): at the first step's end, then at the first step end
    `every_s` after the last release. Every log event carries the process's memory:
    `memory/rss_gib` (resident after the last release), `memory/freed_gib` (what it
    returned) and `memory/peak_gib` (the most the process has held so far, `VmHWM`). Must
    come before the callbacks that read the event (`MetricsLogger`, `TrainingProgress`):
    it adds to the event's dict. Nothing is added where the C library has no
    `malloc_trim`."""

    def __init__(
        self, every_s: float = RELEASE_EVERY_S, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = every_s
        self._clock = clock
        self._last: float | None = None
        self.releases = 0
        """Releases done so far."""
        self.figures: dict[str, float] = {}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        now = self._clock()
        if self._last is None or now - self._last >= self.every_s:
            released = release_freed_memory(collect=False)
            self._last = now
            if released is not None:
                self.releases += 1
                before, after = released
                self.figures["memory/rss_gib"] = round(after, 3)
                self.figures["memory/freed_gib"] = round(max(0.0, before - after), 3)
        if self.figures:
            self.figures["memory/peak_gib"] = round(status_kib("VmHWM") / 2**20, 3)
        return control

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        if logs is not None:
            logs.update(self.figures)
        return control


class MetricsLogger(TrainerCallback):
    """Every log event to `on_metrics` (numeric values only) and to the `epiflow.training` logger."""

    def __init__(
        self, on_metrics: MetricsHook | None, *, budget: WallTimeStop | None = None
    ) -> None:
        self.on_metrics = on_metrics
        self.budget = budget

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        numeric = {
            k: float(v)
            for k, v in (logs or {}).items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        step = int(state.global_step)
        planned = int(state.max_steps)
        if self.budget is not None:
            planned = self.budget.estimated_steps(step)
        logger.info("step %d/%d %s", step, planned, numeric)
        if self.on_metrics is not None:
            self.on_metrics(step, planned, numeric)
        return control


class TrainingProgress(TrainerCallback):
    """Progress lines of one training run (`core.progress.ProgressReporter`): opened at the
    first event, updated at every step end, the last logged loss noted, closed at the end
    (`close()` also on failure: the trainer skips `on_train_end` when it raises)."""

    def __init__(
        self,
        what: str,
        *,
        every_s: float,
        budget: WallTimeStop | None = None,
        emit: Callable[[str], None] | None = None,
    ) -> None:
        self.budget = budget
        self._token_rate = TokenRate()
        self.reporter = ProgressReporter(
            what, unit="step", every_s=every_s, emit=emit or log_lines(progress_logger)
        )

    def _planned(self, state: Any) -> int | None:
        step = int(state.global_step)
        if self.budget is not None:
            # The estimate of the steps the budget holds; unknown before the first step.
            return self.budget.estimated_steps(step) if step > 0 else None
        return int(state.max_steps) if state.max_steps and state.max_steps > 0 else None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.reporter.start()
        self.reporter.update(int(state.global_step), total=self._planned(state))
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.reporter.update(int(state.global_step), total=self._planned(state))
        return control

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        figures = {k: float(v) for k, v in (logs or {}).items() if _is_number(v)}
        if "loss" in figures:
            self.reporter.note(loss=figures["loss"])
        if is_grpo_step(figures):
            self.reporter.note(**grpo_step_figures(figures, self._token_rate(figures)))
        if "memory/rss_gib" in figures:
            self.reporter.note(
                rss_gib=figures["memory/rss_gib"], peak_gib=figures.get("memory/peak_gib")
            )
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.close()
        return control

    def close(self) -> None:
        """The last line and the heartbeat stopped; idempotent."""
        self.reporter.close()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class TimedSaves(TrainerCallback):
    """Saves a checkpoint every `every_s` seconds of training, recording the elapsed time."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.started: float | None = None
        self._next = every_s

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.started = time.perf_counter()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.started is not None and time.perf_counter() - self.started >= self._next:
            control.should_save = True
            self._next += self.every_s
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.started is None:
            return control
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.is_dir():
            elapsed = time.perf_counter() - self.started
            (folder / ELAPSED_FILE).write_text(
                json.dumps({"step": int(state.global_step), "elapsed_s": round(elapsed, 2)})
            )
        return control


class ThreadCallback(TrainerCallback):
    """Re-chooses the thread count (`training.threads.ThreadTuner`, at most every
    `interval_s`) when a step begins and ends and after each micro-batch of gradient
    accumulation: a GRPO step over episodes (its rollouts generated when it begins, then
    one micro-batch per group) takes minutes."""

    def __init__(self, tuner: ThreadTuner) -> None:
        self.tuner = tuner

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.tuner.maybe_retune()
        return control

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.tuner.maybe_retune()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.tuner.maybe_retune()
        return control


def lr_factor(progress: float, *, warmup: float, kind: str, min_ratio: float) -> float:
    """Learning-rate multiplier at `progress` ∈ [0, 1] of training.

    Linear warm-up over the first `warmup` share, then `constant`, `linear` or `cosine`
    decay from 1 to `min_ratio` at the end.
    """
    progress = min(1.0, max(0.0, progress))
    if warmup > 0 and progress < warmup:
        return progress / warmup
    if kind == "constant":
        return 1.0
    rest = (progress - warmup) / (1.0 - warmup) if warmup < 1 else 1.0
    shape = 1.0 - rest if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * rest))
    return min_ratio + (1.0 - min_ratio) * shape


def lr_lambda(
    *,
    total_steps: int,
    warmup: float,
    kind: str,
    min_ratio: float,
    budget: WallTimeStop | None = None,
    step_limited: bool = True,
) -> Callable[[int], float]:
    """The `LambdaLR` function over training progress.

    Progress is step / `total_steps`; under a wall-time `budget` it is the budget's elapsed
    share, or whichever is further along when a step limit (`step_limited`) applies too,
    so the decay ends at whichever limit ends training.
    """

    def factor(step: int) -> float:
        by_steps = step / total_steps if total_steps > 0 else 1.0
        if budget is None:
            progress = by_steps
        elif step_limited:
            progress = max(by_steps, budget.fraction())
        else:
            progress = budget.fraction()
        return lr_factor(progress, warmup=warmup, kind=kind, min_ratio=min_ratio)

    return factor
