"""The metrics hook, the wall-time budget, intermediate saves and the progress lines
(`training.callbacks`), on the locally built tiny model with real TRL."""

from __future__ import annotations

import logging
import re

import pytest

from tests.training.test_trainers import _frame
from training.builders import DatasetKind
from training.trainers import run_training
from training.trainers.common import saves_dir


def test_hook_sees_every_log_event_and_nothing_is_printed(
    tiny_base_model, tiny_settings, tmp_path, capsys: pytest.CaptureFixture[str]
):
    seen: list[tuple[int, int, dict[str, float]]] = []
    settings = tiny_settings.model_copy(update={"save_steps": 1})
    result = run_training(
        "sft",
        dataset=_frame(DatasetKind.SFT),
        base_model_dir=tiny_base_model,
        output_dir=tmp_path / "sft",
        settings=settings,
        on_metrics=lambda step, max_steps, logs: seen.append((step, max_steps, logs)),
    )
    steps = [s for s, _, logs in seen if "loss" in logs]
    assert steps == list(range(1, result.steps + 1))
    assert all(m == settings.max_steps for _, m, _ in seen)
    assert all("learning_rate" in logs for _, _, logs in seen if "loss" in logs)
    assert "train_loss" in seen[-1][2]  # the closing summary event
    # Every event carries the process's memory after the last step's release of freed heap
    # (`MemoryRelease`, real glibc): resident, what the release returned, the peak so far.
    for _, _, logs in seen:
        assert 0 < logs["memory/rss_gib"] <= logs["memory/peak_gib"]
        assert logs["memory/freed_gib"] >= 0
    assert not result.stopped_by_time
    assert "'loss'" not in capsys.readouterr().out  # no metric dicts on stdout
    # save_steps: the intermediate checkpoint of every step, beside the model directory
    # (which stays a clean HF directory to register)
    assert (saves_dir(tmp_path / "sft") / f"checkpoint-{result.steps}").is_dir()
    assert not list((tmp_path / "sft").glob("checkpoint-*"))


def test_wall_time_budget_stops_training(tiny_base_model, tiny_settings, tmp_path):
    settings = tiny_settings.model_copy(update={"max_steps": 500, "max_time_s": 0.01})
    result = run_training(
        "sft",
        dataset=_frame(DatasetKind.SFT),
        base_model_dir=tiny_base_model,
        output_dir=tmp_path / "sft",
        settings=settings,
    )
    assert result.stopped_by_time and result.steps == 1
    assert (tmp_path / "sft" / "config.json").exists()  # the model is saved as usual


def test_a_real_training_run_prints_progress_lines_with_step_loss_and_eta(
    tiny_base_model, tiny_settings, tmp_path, caplog: pytest.LogCaptureFixture
):
    """Every update prints at a tiny interval: the lines of a real 3-step SFT run on the
    `training.progress` logger (the terminal's and a Prefect run's) carry step / planned,
    the last logged loss, the rate and the ETA, and the run ends with a `finished` line."""
    settings = tiny_settings.model_copy(
        update={"max_steps": 3, "logging_steps": 1, "progress_every_s": 1e-6}
    )
    with caplog.at_level(logging.INFO, logger="training.progress"):
        result = run_training(
            "sft",
            dataset=_frame(DatasetKind.SFT),
            base_model_dir=tiny_base_model,
            output_dir=tmp_path / "sft",
            settings=settings,
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "training.progress"]
    assert result.steps == 3
    assert any(line.startswith("train sft: 1/3 steps (33%)") for line in lines)
    step_two = next(line for line in lines if line.startswith("train sft: 2/3 steps (66%)"))
    assert re.search(r", loss \d+(\.\d+)?, ", step_two)
    assert re.search(r"(s/step|steps/s), elapsed \d+s, ETA \d+", step_two)
    assert re.fullmatch(
        r"train sft: finished 3/3 steps in \d+s, loss \d+(\.\d+)?, "
        r"rss_gib \d+(\.\d+)?, peak_gib \d+(\.\d+)?",
        lines[-1],
    )


def test_grpo_progress_lines_carry_the_steps_figures() -> None:
    """Agentic GRPO's line: reward mean and std, success rate, KL, grad norm, the groups
    dropped (zero variance, infrastructure, gate), the step's rollout tokens and tokens/s
    between log events."""
    from types import SimpleNamespace

    from training import callbacks
    from training.grpo_figures import TokenRate

    clock = iter([100.0, 102.0])  # the token rate's clock only: the reporter keeps its own
    lines: list[str] = []
    progress = callbacks.TrainingProgress("train grpo", every_s=1e-6, emit=lines.append)
    progress._token_rate = TokenRate(clock=lambda: next(clock))
    state = SimpleNamespace(global_step=1, max_steps=2)
    progress.on_train_begin(None, state, None)
    logs = {
        "loss": 0.5,
        "reward": 0.25,
        "reward_std": 0.75,
        "kl": 0.01,
        "grad_norm": 1.5,
        "num_tokens": 1000.0,
        "grpo/success_rate": 0.5,
        "grpo/groups_dropped_zero_variance": 1.0,
        "grpo/groups_dropped_infrastructure": 1.0,
        "grpo/groups_dropped_qc": 0.0,
        "grpo/rollout_tokens": 24000.0,
    }
    progress.on_log(None, state, None, logs=logs)
    progress.on_log(None, state, None, logs={**logs, "num_tokens": 1500.0})
    state.global_step = 2
    progress.on_step_end(None, state, None)
    progress.close()
    line = next(line for line in lines if line.startswith("train grpo: 2/2 steps"))
    for part in (
        "loss 0.5",
        "reward 0.25",
        "reward_std 0.75",
        "success 0.5",
        "kl 0.01",
        "grad_norm 1.5",
        "dropped_zero_variance 1",
        "dropped_infrastructure 1",
        "dropped_gate 0",
        "tokens 24000",
        "tokens/s 250",
    ):
        assert part in line, line


def test_memory_is_released_at_the_first_step_end_then_at_most_every_every_s() -> None:
    """`MemoryRelease` on an injected clock (the releases are real glibc ones): a step end
    releases when none did for `every_s`, and the peak follows every step end."""
    from types import SimpleNamespace

    from training.callbacks import MemoryRelease

    now = [0.0]
    release = MemoryRelease(every_s=60.0, clock=lambda: now[0])
    state, control = SimpleNamespace(global_step=0), SimpleNamespace()
    for t in (0.0, 6.0, 59.0, 60.0, 61.0, 130.0):
        now[0] = t
        release.on_step_end(None, state, control)
    assert release.releases == 3  # at 0, 60 and 130 seconds
    logs: dict[str, float] = {"loss": 1.0}
    release.on_log(None, state, control, logs=logs)
    assert logs["loss"] == 1.0
    assert 0 < logs["memory/rss_gib"] <= logs["memory/peak_gib"]
    assert logs["memory/freed_gib"] >= 0
