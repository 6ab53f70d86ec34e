"""Training progress without Prefect: a metrics hook and a wall-time budget for TRL.

`run_training(on_metrics=...)` (and `train_checkpoint`) hand every TRL log event to a plain
callable, `on_metrics(step, max_steps, logs)` — the train flow turns it into a progress
artifact and a loss table; and `TrainingSettings.max_time_s` stops training at the next
optimizer step once the budget is spent. transformers' own printer callback is removed so
metric dicts never reach stdout.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["MetricsHook", "TrainingHooks", "attach", "training_hooks"]

logger = logging.getLogger(__name__)

MetricsHook = Callable[[int, int, dict[str, float]], None]
"""`on_metrics(step, max_steps, logs)`: called on every TRL log event with its numbers."""


@dataclass(frozen=True)
class TrainingHooks:
    """What the trainers add to TRL for one `run_training` call."""

    on_metrics: MetricsHook | None = None
    """Receives every log event (loss, learning rate, grad norm, tokens/s…)."""
    max_time_s: float | None = None
    """Wall-time budget of `trainer.train()`, seconds; None: no limit."""


_hooks: contextvars.ContextVar[TrainingHooks | None] = contextvars.ContextVar(
    "epiflow_training_hooks", default=None
)


@contextmanager
def training_hooks(hooks: TrainingHooks) -> Iterator[None]:
    """Use `hooks` for the trainers run inside the block (context-local, thread-safe)."""
    token = _hooks.set(hooks)
    try:
        yield
    finally:
        _hooks.reset(token)


def _numbers(logs: dict[str, Any] | None) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in (logs or {}).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _callback_class() -> type[Any]:
    from transformers import TrainerCallback

    class HooksCallback(TrainerCallback):
        """Forwards log events to the hook; stops at the wall-time budget."""

        def __init__(self, hooks: TrainingHooks) -> None:
            self.hooks = hooks
            self.started = time.monotonic()
            self.stopped_by_time = False

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self.started = time.monotonic()
            return control

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> Any:
            if self.hooks.on_metrics is not None:
                self.hooks.on_metrics(int(state.global_step), int(state.max_steps), _numbers(logs))
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            budget = self.hooks.max_time_s
            if budget is not None and time.monotonic() - self.started >= budget:
                if not self.stopped_by_time:
                    logger.info(
                        "training stopped at step %d of %d: wall-time budget of %.0f s spent",
                        state.global_step,
                        state.max_steps,
                        budget,
                    )
                self.stopped_by_time = True
                control.should_training_stop = True
                # The last step's metrics still reach the hook.
                control.should_log = True
            return control

    return HooksCallback


def attach(trainer: Any) -> Any:
    """Add the current hooks' callback to `trainer` and drop transformers' printer (metric
    dicts on stdout); returns the callback (its `stopped_by_time` says how training ended)."""
    from transformers import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    callback = _callback_class()(_hooks.get() or TrainingHooks())
    trainer.add_callback(callback)
    return callback
