"""Each TRL trainer runs a few steps on the tiny model and writes a checkpoint the hf: policy loads.

Warnings filtered here come from inside transformers/TRL (deprecations they trigger
themselves), not from epiflow code; see docs/training.md.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import polars as pl
import pytest
import torch

from agent.policies.base import PolicyRequest
from agent.policies.hf import HFPolicy
from agent.settings import PolicySettings
from sandbox.tool_specs import BUILTIN_TOOLS
from suites.builtin import builtin_suite
from tests.training.factory import call_step, episode, final_step, garbage_step
from training.builders import DatasetKind, SourceEpisode, build_rows
from training.conversations import prompt_messages
from training.errors import TrainerError
from training.rewards import ProtocolReward
from training.trainers import run_training
from training.trainers.common import load_model, load_tokenizer, saves_dir

TRL_DEPRECATIONS = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)


def _episodes() -> list[SourceEpisode]:
    out = []
    for task in range(3):
        win = episode(
            task=task,
            rollout=0,
            steps=[call_step(0, "ls"), call_step(1, f"cat data{task}.csv"), final_step(2)],
        )
        loss = episode(
            task=task, rollout=1, success=False, steps=[call_step(0, "ls"), garbage_step(1)]
        )
        out += [SourceEpisode(trajectory=win, verdict="keep", quality_score=0.5 + 0.2 * task)]
        out += [SourceEpisode(trajectory=loss, verdict="downweight", quality_score=0.2)]
    return out


def _frame(kind: DatasetKind) -> pl.DataFrame:
    return pl.DataFrame(build_rows(kind, _episodes()).rows)


def _changed(before: Path, after: Path) -> bool:
    a, b = load_model(before).state_dict(), load_model(after).state_dict()
    return any(not torch.equal(a[k], b[k]) for k in a)


def _generates(model_dir: Path) -> None:
    """The checkpoint answers a real request through the hf: policy."""
    policy = HFPolicy(model_dir, PolicySettings(max_tokens=4))
    request = PolicyRequest(
        task=builtin_suite().instances(1, templates=["csv_to_json"])[0],
        messages=prompt_messages(episode()),
        tools=list(BUILTIN_TOOLS.values()),
    )
    response = asyncio.run(policy.respond(request))
    assert response.completion_tokens is not None and response.completion_tokens >= 1


def test_sft_trains_assistant_turns_only_and_saves_a_loadable_checkpoint(
    tiny_base_model, tiny_settings, tmp_path
):
    out = tmp_path / "sft"
    result = run_training(
        "sft",
        dataset=_frame(DatasetKind.SFT),
        base_model_dir=tiny_base_model,
        output_dir=out,
        settings=tiny_settings,
    )
    assert result.steps == tiny_settings.max_steps
    assert result.train_loss is not None and result.train_loss > 0
    assert result.tokens > 0 and result.tokens_per_s > 0
    assert _changed(tiny_base_model, out)
    # the saved tokenizer keeps the verbatim template deployment renders with
    assert load_tokenizer(out).chat_template == load_tokenizer(tiny_base_model).chat_template
    _generates(out)


def test_sft_mask_covers_exactly_the_assistant_turns(tiny_base_model):
    """TRL's training template marks assistant text (and its end token) only."""
    from trl.chat_template_utils import get_training_chat_template

    tokenizer = load_tokenizer(tiny_base_model)
    messages = _frame(DatasetKind.SFT)["messages"].to_list()[0]
    out = tokenizer.apply_chat_template(
        messages,
        chat_template=get_training_chat_template(tokenizer),
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    trained = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    expected = "".join(m["content"] + "<|im_end|>\n" for m in messages if m["role"] == "assistant")
    assert trained.replace("\n", "") == expected.replace("\n", "")
    assert "<tool_result" not in trained and "You are an agent" not in trained


def test_sft_on_plain_text_cpt(tiny_base_model, tiny_settings, tmp_path):
    result = run_training(
        "sft",
        dataset=_frame(DatasetKind.CPT),
        base_model_dir=tiny_base_model,
        output_dir=tmp_path / "cpt",
        settings=tiny_settings,
    )
    assert result.steps == tiny_settings.max_steps
    assert _changed(tiny_base_model, tmp_path / "cpt")


@TRL_DEPRECATIONS
def test_dpo_with_an_explicit_reference(tiny_base_model, tiny_settings, tmp_path):
    out = tmp_path / "dpo"
    result = run_training(
        "dpo",
        dataset=_frame(DatasetKind.DPO),
        base_model_dir=tiny_base_model,
        output_dir=out,
        settings=tiny_settings,
    )
    assert result.steps == tiny_settings.max_steps
    assert "rewards/margins" in result.metrics
    assert _changed(tiny_base_model, out)
    _generates(out)


@pytest.mark.slow
@TRL_DEPRECATIONS
def test_kto_with_an_explicit_reference(tiny_base_model, tiny_settings, tmp_path):
    out = tmp_path / "kto"
    frame = _frame(DatasetKind.KTO).head(8)
    assert set(frame["label"].to_list()) == {True, False}
    result = run_training(
        "kto", dataset=frame, base_model_dir=tiny_base_model, output_dir=out, settings=tiny_settings
    )
    assert result.steps == tiny_settings.max_steps
    assert "kl" in result.metrics
    assert _changed(tiny_base_model, out)
    _generates(out)


@pytest.mark.slow
@TRL_DEPRECATIONS
def test_grpo_online_with_the_protocol_reward(tiny_base_model, tiny_settings, tmp_path):
    out = tmp_path / "grpo"
    seen: list[float] = []
    protocol = ProtocolReward()

    def reward(prompts, completions, **kwargs):
        assert {"task_id", "suite", "template", "instance_seed"} <= kwargs.keys()
        scores = protocol(prompts, completions, **kwargs)
        seen.extend(scores)
        return scores

    settings = tiny_settings.model_copy(update={"max_steps": 1})
    result = run_training(
        "grpo",
        dataset=_frame(DatasetKind.GRPO).head(2),
        base_model_dir=tiny_base_model,
        output_dir=out,
        settings=settings,
        reward_fn=reward,
    )
    assert result.steps == 1
    # one step = whole groups of rollouts, every one scored
    assert seen and len(seen) % settings.rollouts_per_task == 0
    assert all(s in (-1.0, 0.0, 1.0) for s in seen)
    assert "reward" in result.metrics and "kl" in result.metrics
    _generates(out)


@pytest.mark.slow
@TRL_DEPRECATIONS
def test_grpo_says_so_when_every_group_has_one_reward(
    tiny_base_model, tiny_settings, tmp_path, caplog
):
    """A reward that never varies within a group gives zero advantages: the run still ends,
    and says why it learned nothing and what to change (log and result)."""

    def constant(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    with caplog.at_level("WARNING", logger="training.trainers.common"):
        result = run_training(
            "grpo",
            dataset=_frame(DatasetKind.GRPO).head(2),
            base_model_dir=tiny_base_model,
            output_dir=tmp_path / "grpo",
            settings=tiny_settings.model_copy(update={"max_steps": 1, "logging_steps": 1}),
            reward_fn=constant,
        )
    assert result.metrics.get("frac_reward_zero_std") == 1.0
    assert len(result.warnings) == 1 and "frac_reward_zero_std" in result.warnings[0]
    assert any("frac_reward_zero_std" in r.getMessage() for r in caplog.records)


def test_unknown_algorithm_and_wrong_columns_are_refused(tiny_base_model, tiny_settings, tmp_path):
    with pytest.raises(TrainerError, match="unknown training algorithm"):
        run_training(
            "ppo",
            dataset=_frame(DatasetKind.SFT),
            base_model_dir=tiny_base_model,
            output_dir=tmp_path,
            settings=tiny_settings,
        )
    with pytest.raises(TrainerError, match="needs the columns"):
        run_training(
            "dpo",
            dataset=_frame(DatasetKind.SFT),
            base_model_dir=tiny_base_model,
            output_dir=tmp_path,
            settings=tiny_settings,
        )
    with pytest.raises(TrainerError, match="reward_fn"):  # the entry point builds GRPO's reward
        run_training(
            "grpo",
            dataset=_frame(DatasetKind.GRPO).head(2),
            base_model_dir=tiny_base_model,
            output_dir=tmp_path,
            settings=tiny_settings,
        )
    only_wins = _frame(DatasetKind.KTO).filter(pl.col("label"))
    with pytest.raises(TrainerError, match="both desirable and undesirable"):
        run_training(
            "kto",
            dataset=only_wins,
            base_model_dir=tiny_base_model,
            output_dir=tmp_path,
            settings=tiny_settings,
        )


def test_wall_time_budget_metrics_hook_and_a_quiet_stdout(
    tiny_base_model, tiny_settings, tmp_path, capfd
):
    """Training stops at max_time_s (no step limit), every log event reaches on_metrics,
    nothing is printed on stdout, and save_steps writes intermediate checkpoints."""
    seen: list[tuple[int, int, dict[str, float]]] = []
    settings = tiny_settings.model_copy(
        update={
            "max_steps": -1,
            "max_time_s": 6.0,
            "logging_steps": 1,
            "save_steps": 2,
            "lr_scheduler": "cosine",
            "warmup_ratio": 0.1,
        }
    )
    result = run_training(
        "sft",
        dataset=_frame(DatasetKind.SFT),
        base_model_dir=tiny_base_model,
        output_dir=tmp_path / "timed",
        settings=settings,
        on_metrics=lambda step, max_steps, logs: seen.append((step, max_steps, logs)),
    )
    assert result.stopped_by_time
    # It stops at the first step boundary past the budget: one step's time at most over.
    assert 6.0 <= result.runtime_s < 6.0 + 3 * result.runtime_s / max(result.steps, 1) + 2.0
    assert result.steps >= 2 and result.threads and result.cpu_s > 0
    steps = [s for s, _, logs in seen if "loss" in logs]
    assert steps == list(range(1, result.steps + 1))
    last = next(logs for _, _, logs in reversed(seen) if "loss" in logs)
    assert {"loss", "learning_rate", "grad_norm"} <= last.keys()
    # Under a budget, max_steps is the estimate of the steps that fit, never the sentinel.
    assert all(0 < planned < 10_000 for _, planned, _ in seen)
    # The time-based cosine has decayed by the end.
    assert last["learning_rate"] < 0.5 * settings.sft_learning_rate
    saves = saves_dir(tmp_path / "timed")
    saved = [int(p.name.removeprefix("checkpoint-")) for p in saves.glob("checkpoint-*")]
    assert saved and all(step % 2 == 0 for step in saved)
    assert capfd.readouterr().out == ""
