"""Progress lines: when a line goes out, what it says, heartbeats, nesting, the thread.

The clock is a counter the test moves and `tick()` is called by hand (what the heartbeat
thread does at each deadline), so nothing depends on the machine's speed; the thread
itself is checked by waiting for the line it must print, never by timing it.
"""

from __future__ import annotations

import contextvars
import threading

import pytest

from core.progress import ProgressReporter, format_duration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _reporter(clock: Clock, lines: list[str], **kwargs: object) -> ProgressReporter:
    options: dict[str, object] = {"total": 100, "unit": "step", "every_s": 20.0} | kwargs
    return ProgressReporter("train sft", emit=lines.append, clock=clock, **options)  # type: ignore[arg-type]


def test_lines_go_out_on_the_first_update_every_interval_and_at_the_total():
    clock, lines = Clock(), list[str]()
    progress = _reporter(clock, lines)
    clock.now += 2
    assert progress.update(1) is not None  # the first update always prints
    for step in range(2, 10):
        clock.now += 2
        assert progress.update(step) is None  # at most 16 s since the last line
    clock.now += 4
    line = progress.update(10, loss=1.23456)
    assert line == ("train sft: 10/100 steps (10%), loss 1.235, 2.2 s/step, elapsed 22s, ETA 3m18s")
    clock.now += 1
    assert progress.update(100) is not None  # the total always prints
    assert len(lines) == 3


def test_heartbeat_only_after_a_silence_and_says_what_it_waits_on():
    clock, lines = Clock(), list[str]()
    progress = _reporter(clock, lines)
    clock.now += 5
    progress.update(3)
    clock.now += 19
    assert progress.tick() is None  # 19 s of silence: not yet
    clock.now += 1
    line = progress.tick()
    assert line is not None
    assert line.startswith("train sft: 3/100 steps (3%), 8.3 s/step, elapsed 25s, ETA 13m")
    assert line.endswith("; still running, no step finished for 20s")
    assert progress.seconds_to_next_tick() == 20.0
    clock.now += 20
    assert progress.tick() is not None and "no step finished for 40s" in lines[-1]


def test_heartbeat_after_throttled_progress_is_a_plain_progress_line():
    """Updates came but no line was due: the heartbeat shows them without 'still running'."""
    clock, lines = Clock(), list[str]()
    progress = _reporter(clock, lines)
    progress.update(0)
    clock.now += 15
    assert progress.update(5) is None
    clock.now += 5
    line = progress.tick()
    assert line is not None and "5/100 steps" in line and "still running" not in line


def test_no_line_before_start_when_nothing_happened_and_a_first_heartbeat_from_the_start():
    clock, lines = Clock(), list[str]()
    progress = _reporter(clock, lines, total=None)
    clock.now += 19
    assert progress.tick() is None
    clock.now += 1
    assert progress.tick() == (
        "train sft: 0 steps, elapsed 20s; still running, no step finished for 20s"
    )


def test_fields_notes_forced_lines_and_dropped_fields():
    clock, lines = Clock(), list[str]()
    progress = _reporter(clock, lines, unit="stage", total=4, rate=False)
    progress.update(0, running="collect")
    clock.now += 1
    assert progress.update(1, running="gate") is None
    assert progress.update(1, force=True, running="gate") == (
        "train sft: 1/4 stages (25%), running gate, elapsed 1s"
    )
    progress.note(loss=0.5)
    clock.now += 1
    progress.update(4, running=None)
    assert lines[-1] == "train sft: 4/4 stages (100%), loss 0.5, elapsed 2s"


def test_close_says_finished_or_stopped_once():
    clock, lines = Clock(), list[str]()
    done = _reporter(clock, lines, total=2)
    done.update(2, loss=0.25)
    clock.now += 61
    assert done.close() == "train sft: finished 2/2 steps in 1m01s, loss 0.25"
    assert done.close() is None and done.tick() is None
    stopped = _reporter(clock, lines, total=8, unit="episode")
    stopped.update(3)
    assert stopped.close() == "train sft: stopped at 3/8 episodes in 0s"


def test_an_inner_reporter_quiets_the_outer_heartbeat_but_not_its_updates():
    clock, lines = Clock(), list[str]()
    outer = _reporter(clock, lines, total=4, unit="stage").start(heartbeat=False)
    inner = _reporter(clock, lines).start(heartbeat=False)
    try:
        clock.now += 30
        assert outer.tick() is None
        assert inner.tick() is not None
        assert outer.update(1, force=True) is not None
        inner.close()
        clock.now += 30
        assert outer.tick() is not None
    finally:
        inner.close()
        outer.close()


def test_the_heartbeat_thread_prints_in_the_starting_context():
    """The thread calls tick at its deadlines, in a copy of the starter's context (a Prefect
    run context is a context variable: the line belongs to the same run)."""
    run = contextvars.ContextVar("run", default="none")
    run.set("flow-run-1")
    seen: list[tuple[str, str]] = []
    printed = threading.Event()

    def emit(line: str) -> None:
        seen.append((line, run.get()))
        if "still running" in line:
            printed.set()

    progress = ProgressReporter("evaluate", emit=emit, total=2, unit="episode", every_s=0.01)
    with progress:
        progress.update(0)
        assert printed.wait(timeout=60), "no heartbeat line from the thread"
    assert any("still running, no episode finished" in line for line, _ in seen)
    assert {ctx for _, ctx in seen} == {"flow-run-1"}
    assert seen[-1][0].startswith("evaluate: stopped at 0/2 episodes")


def test_durations_and_a_bad_interval():
    assert [format_duration(s) for s in (0.4, 42, 308, 7380)] == ["0s", "42s", "5m08s", "2h03m"]
    with pytest.raises(ValueError, match="every_s must be positive"):
        ProgressReporter("x", emit=print, every_s=0)
