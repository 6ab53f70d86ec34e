"""Pure parts of the trainer plumbing: the LR schedule shape, the thread policy, the wall-time clock."""

from __future__ import annotations

import math
import time

import pytest

from training import threads
from training.callbacks import WallTimeStop, lr_factor, lr_lambda


def test_warmup_then_cosine_to_the_floor() -> None:
    f = lambda p: lr_factor(p, warmup=0.1, kind="cosine", min_ratio=0.1)  # noqa: E731
    assert f(0.0) == 0.0
    assert f(0.05) == pytest.approx(0.5)
    assert f(0.1) == pytest.approx(1.0)
    assert f(0.55) == pytest.approx(0.1 + 0.9 * 0.5)
    assert f(1.0) == pytest.approx(0.1)
    assert f(2.0) == pytest.approx(0.1)  # past the end: stays at the floor


def test_linear_and_constant_shapes() -> None:
    assert lr_factor(0.5, warmup=0.0, kind="linear", min_ratio=0.0) == pytest.approx(0.5)
    assert lr_factor(0.9, warmup=0.0, kind="constant", min_ratio=0.0) == 1.0
    values = [lr_factor(i / 10, warmup=0.0, kind="cosine", min_ratio=0.0) for i in range(11)]
    assert values == sorted(values, reverse=True)
    assert values[5] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


def test_schedule_follows_the_clock_under_a_budget() -> None:
    budget = WallTimeStop(max_time_s=100.0)
    by_time = lr_lambda(
        total_steps=10**9,
        warmup=0.0,
        kind="linear",
        min_ratio=0.0,
        budget=budget,
        step_limited=False,
    )
    assert by_time(5) == 1.0  # not started: progress 0
    budget.started = time.perf_counter() - 50.0
    assert by_time(5) == pytest.approx(0.5, abs=0.01)
    # With a step limit as well, whichever limit is further along sets the progress.
    both = lr_lambda(total_steps=10, warmup=0.0, kind="linear", min_ratio=0.0, budget=budget)
    assert both(9) == pytest.approx(0.1, abs=0.01)
    assert both(1) == pytest.approx(0.5, abs=0.01)


def test_wall_time_stop_estimates_the_steps_that_fit() -> None:
    budget = WallTimeStop(max_time_s=10.0)
    assert budget.fraction() == 0.0 and budget.estimated_steps(0) == 0
    budget.started = time.perf_counter() - 2.5
    assert budget.estimated_steps(5) == pytest.approx(20, abs=1)


@pytest.mark.parametrize(
    ("load", "own", "expected"),
    [
        (0.9, 1, 2),  # only this process: both cores
        (1.3, 1, 2),  # a little background noise
        (2.2, 1, 1),  # one other busy process
        (9.0, 1, 1),  # a crowded machine: never below one
        (2.1, 2, 2),  # while training on two threads alone
        (3.0, 2, 1),  # ... and someone else started
    ],
)
def test_automatic_threads_leave_busy_cores_alone(monkeypatch, load, own, expected) -> None:
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr("training.threads.os.getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(threads, "others_busy_now", lambda: 1.0)  # one core taken now
    assert threads.choose_threads(0, own_threads=own) == expected


@pytest.mark.parametrize(("now", "expected"), [(0.1, 2), (0.45, 2), (0.8, 1), (None, 1)])
def test_a_load_average_of_work_that_ended_does_not_cost_a_core(monkeypatch, now, expected) -> None:
    """The load average still says one core is taken (a minute's memory of an evaluation
    that just ended); what others used in the last moment decides, unless /proc is
    unreadable (None)."""
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr("training.threads.os.getloadavg", lambda: (2.2, 2.0, 1.5))
    monkeypatch.setattr(threads, "others_busy_now", lambda: now)
    assert threads.choose_threads(0, own_threads=1) == expected


def test_others_busy_now_leaves_this_process_out(monkeypatch) -> None:
    """The machine's busy ticks less this process's over the window, in cores (the
    counters scripted: 1.5 core-seconds busy in 1 s, 0.5 of them this process's); on
    this Linux machine the real counters read."""
    counters = iter([(1_000, 100), (1_150, 150)])
    monkeypatch.setattr(threads, "_busy_ticks", lambda: next(counters))
    monkeypatch.setattr("training.threads.time.sleep", lambda s: None)
    monkeypatch.setattr("training.threads.os.sysconf", lambda name: 100)
    assert threads.others_busy_now(1.0) == pytest.approx(1.0)
    monkeypatch.undo()
    real = threads.others_busy_now(0.1)
    assert real is not None and real >= 0.0


def test_explicit_thread_count_wins(monkeypatch) -> None:
    monkeypatch.setattr("training.threads.os.getloadavg", lambda: (50.0, 50.0, 50.0))
    assert threads.choose_threads(3) == 3
