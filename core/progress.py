"""Progress lines for long work: a line at least every `every_s` seconds while it runs.

Training (`training.callbacks.TrainingProgress`), evaluation
(`collection.evaluation.run_evaluation`) and the demo's stages report what is done so
far, e.g. `train sft: 40/200 steps (20%), loss 1.234, 1.9 s/step, elapsed 1m17s, ETA
5m08s`. A line goes out when an update comes `every_s` after the previous line (the
first update and the one that reaches the total always print). When no update comes for
`every_s` — one step of a real model on a busy machine, one slow episode — the heartbeat
thread prints the same figures with what it waits on: `…; still running, no step
finished for 42s`. So the terminal never stays silent longer than `every_s` (plus the
scheduling delay of a loaded machine), and no line says more than is known.

Lines go to `emit`; `log_lines(logger)` makes it INFO records of an epiflow module logger,
which reach the terminal through the root console handler and, inside a Prefect flow or
task run, that run's log (`flows.route_library_logs`). The heartbeat thread runs in a copy
of the context of the thread that started the reporter, so its lines belong to the same
flow run (Prefect's run context is a context variable).

Reporters nest: while a reporter opened later is still open (the training inside the
demo's train stage), an earlier one's heartbeats stay quiet — the inner one speaks and
knows more — while its own updates still print.

Pure standard library: no Prefect, no SQL. The clock is injected, and `tick()` is what
the thread calls at each deadline, so tests drive both by hand.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["PROGRESS_EVERY_S", "ProgressReporter", "format_duration", "log_lines"]

PROGRESS_EVERY_S = 20.0
"""Default longest silence, seconds: under the 30 s a watcher tolerates, with room for a
loaded machine's scheduling delay."""
_MIN_WAIT_S = 0.05
"""Shortest sleep of the heartbeat thread (a tiny `every_s` must not spin it)."""

Emit = Callable[[str], None]
FieldValue = float | int | str

_open: list[ProgressReporter] = []
"""Reporters started and not yet closed, in the order they started (for nesting)."""
_open_lock = threading.Lock()


def log_lines(logger: logging.Logger) -> Emit:
    """An `emit` that logs each line at INFO on `logger`."""

    def emit(line: str) -> None:
        logger.info("%s", line)

    return emit


def format_duration(seconds: float) -> str:
    """`42s`, `5m08s`, `2h03m`."""
    total = max(0, round(seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _field(name: str, value: FieldValue) -> str:
    if isinstance(value, float):
        return f"{name} {value:.4g}"
    return f"{name} {value}"


class ProgressReporter:
    """Progress of one long job as lines, at least one every `every_s` seconds once started.

    `update(done)` records progress (and prints when a line is due), `note(**fields)`
    records figures without progress (the loss), `tick()` is the heartbeat, `close()` the
    last line. Thread-safe: updates may come from any thread.
    """

    def __init__(
        self,
        what: str,
        *,
        emit: Emit,
        total: int | None = None,
        unit: str = "step",
        every_s: float = PROGRESS_EVERY_S,
        rate: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        Args:
            what: What the lines are about (`train sft`, `evaluate eval-…`, `demo`).
            emit: Where each line goes (`log_lines(logger)`, a console's print).
            total: Units planned, when known (it may move: `update(total=…)`).
            unit: What is counted, singular (`step`, `episode`, `stage`).
            every_s: Longest silence, seconds (> 0).
            rate: Whether lines show the rate and the time left (not for unlike units,
                e.g. the demo's stages).
            clock: Monotonic seconds (injected by tests).

        Raises:
            ValueError: `every_s` is not positive.
        """
        if every_s <= 0:
            raise ValueError(f"every_s must be positive (seconds), got {every_s}")
        self.what = what
        self.total = total
        self.unit = unit
        self.every_s = every_s
        self.rate = rate
        self._emit = emit
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._done = 0
        self._last_progress = self._started
        self._last_line: float | None = None
        self._fields: dict[str, FieldValue] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # Recording ---------------------------------------------------------------------------

    def update(
        self,
        done: int,
        *,
        total: int | None = None,
        force: bool = False,
        **fields: FieldValue | None,
    ) -> str | None:
        """Record `done` units (and `total`, `fields`); print a line when one is due: the
        first update, reaching the total, `every_s` since the last line, or `force` (a
        stage that begins); a field given as None is dropped. Returns it."""
        with self._lock:
            now = self._clock()
            if total is not None:
                self.total = total
            if done != self._done:
                self._last_progress = now
            self._done = done
            self._record(fields)
            finished = self.total is not None and done >= self.total
            due = self._last_line is None or now - self._last_line >= self.every_s
            if due or finished or force:
                return self._say(self._progress_text(now), now)
        return None

    def note(self, **fields: FieldValue | None) -> None:
        """Record figures shown on the next line (e.g. the last logged loss; None drops one)."""
        with self._lock:
            self._record(fields)

    def tick(self) -> str | None:
        """The heartbeat: print a line when none went out for `every_s` (unless a reporter
        opened later is still open, or this one is closed). Returns it."""
        with self._lock:
            now = self._clock()
            if self._closed or self._inner_open():
                return None
            last = self._last_line if self._last_line is not None else self._started
            if now - last < self.every_s:
                return None
            text = self._progress_text(now)
            waited = now - self._last_progress
            if waited >= self.every_s:
                text += f"; still running, no {self.unit} finished for {format_duration(waited)}"
            return self._say(text, now)

    def seconds_to_next_tick(self) -> float:
        """Seconds until the heartbeat is due (0 when it is)."""
        with self._lock:
            last = self._last_line if self._last_line is not None else self._started
            return max(0.0, last + self.every_s - self._clock())

    # Lifecycle ---------------------------------------------------------------------------

    def start(self, *, heartbeat: bool = True) -> ProgressReporter:
        """Open the reporter (for nesting) and, with `heartbeat`, start its thread in a copy
        of this thread's context. Returns self."""
        with _open_lock:
            if self not in _open:
                _open.append(self)
        if heartbeat and self._thread is None:
            context = contextvars.copy_context()
            self._thread = threading.Thread(
                target=context.run, args=(self._beat,), name=f"progress {self.what}", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> str | None:
        """Stop the heartbeat and print the last line (`finished …` when the total was
        reached, else `stopped at …`); idempotent. Returns it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with _open_lock:
            if self in _open:
                _open.remove(self)
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            now = self._clock()
            done, total = self._done, self.total
            reached = total is not None and done >= total
            count = f"{done}/{total}" if total is not None else str(done)
            verb = "finished" if reached else "stopped at"
            text = f"{self.what}: {verb} {count} {self.unit}s in {format_duration(now - self._started)}"
            if self._fields:
                text += ", " + ", ".join(_field(k, v) for k, v in self._fields.items())
            return self._say(text, now)

    def __enter__(self) -> ProgressReporter:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # Internals ---------------------------------------------------------------------------

    def _beat(self) -> None:
        while not self._stop.wait(max(self.seconds_to_next_tick(), _MIN_WAIT_S)):
            self.tick()

    def _inner_open(self) -> bool:
        with _open_lock:
            return self in _open and _open.index(self) < len(_open) - 1

    def _record(self, fields: dict[str, FieldValue | None]) -> None:
        for name, value in fields.items():
            if value is None:
                self._fields.pop(name, None)
            else:
                self._fields[name] = value

    def _say(self, text: str, now: float) -> str:
        self._last_line = now
        self._emit(text)
        return text

    def _progress_text(self, now: float) -> str:
        done, total = self._done, self.total
        elapsed = now - self._started
        if total is not None and total > 0:
            parts = [f"{done}/{total} {self.unit}s ({100 * min(done, total) // total}%)"]
        else:
            parts = [f"{done} {self.unit}s"]
        parts += [_field(k, v) for k, v in self._fields.items()]
        rate = done / elapsed if self.rate and elapsed > 0 and done > 0 else 0.0
        if rate >= 1:
            parts.append(f"{rate:.2f} {self.unit}s/s")
        elif rate > 0:
            parts.append(f"{1 / rate:.1f} s/{self.unit}")
        parts.append(f"elapsed {format_duration(elapsed)}")
        if rate > 0 and total is not None and done < total:
            parts.append(f"ETA {format_duration((total - done) / rate)}")
        return f"{self.what}: " + ", ".join(parts)
