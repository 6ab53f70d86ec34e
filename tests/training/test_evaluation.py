"""Evaluation metrics, and training's rendering checked against a real episode's recorded history."""

from __future__ import annotations

import asyncio

from agent.loop import run_episode
from agent.policies import make_policy
from agent.render import render_tool_call
from agent.settings import LoopSettings, PolicySettings
from agent.trajectory import EpisodeStatus, ParseKind, Step, history_hash
from sandbox import SandboxSettings, SandboxSpec, sandbox_opener
from sandbox.tool_specs import BUILTIN_TOOLS
from suites.builtin import builtin_suite
from tests.training.factory import call_step, episode, final_step, garbage_step
from training.conversations import episode_messages
from training.evaluation import compare_metrics, evaluation_metrics, turn_kind


def test_metrics_of_hand_built_episodes():
    ok = episode(task=1, steps=[call_step(0, "ls"), final_step(1)])
    bad = episode(
        task=2,
        success=False,
        steps=[
            call_step(0, "cat nope", exit_code=1),
            garbage_step(1),
            call_step(2, "ls"),
            final_step(3),
        ],
    )
    m = evaluation_metrics([ok, bad])
    assert m.completion_rate == 0.5
    assert m.avg_steps == 3.0
    assert m.n_acting_turns == 4  # finals do not count
    assert m.tool_failure_rate == 0.5  # the failed cat and the garbage turn
    assert evaluation_metrics([]).n_episodes == 0
    assert compare_metrics(m, None) == {}
    # An endpoint that failed is not the agent's failure: counted apart, in no rate.
    lost = episode(task=3, success=False, steps=[call_step(0, "ls")]).model_copy(
        update={"status": EpisodeStatus.ENDPOINT_ERROR}
    )
    with_lost = evaluation_metrics([ok, bad, lost])
    assert (with_lost.completion_rate, with_lost.n_episodes) == (0.5, 2)
    assert with_lost.n_infrastructure == 1
    assert with_lost.avg_steps == m.avg_steps
    assert compare_metrics(m, m) == {
        "completion_rate": 0.0,
        "avg_steps": 0.0,
        "tool_failure_rate": 0.0,
    }


def test_training_renders_exactly_the_history_the_loop_sent():
    """Seed 000 §4.5: each step's recorded history hash equals the hash of training's messages."""
    task = builtin_suite().instances(1, templates=["csv_to_json"])[0]
    traj = asyncio.run(
        run_episode(
            task,
            make_policy("scripted:oracle", settings=PolicySettings()),
            spec=SandboxSpec(),
            run_key="render-check",
            settings=LoopSettings(),
            open_sandbox=sandbox_opener(SandboxSettings()),
        )
    )
    assert traj.status == EpisodeStatus.SUCCESS and traj.n_steps >= 2
    messages = episode_messages(traj)
    assistant_positions = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(assistant_positions) == traj.n_steps
    for step, position in zip(traj.steps, assistant_positions, strict=True):
        assert history_hash(messages[:position]) == step.history_hash


def _step(index: int, tool: str, args: dict[str, object], *, ok: bool = True) -> Step:
    call_id = f"c{index + 1}"
    return Step(
        index=index,
        history_hash=f"{index:064x}",
        raw_output=render_tool_call(call_id, tool, args),
        parse_kind=ParseKind.TOOL_CALL,
        call_id=call_id,
        tool=tool,
        args=args,
        observation=f'<tool_result id="{call_id}" name="{tool}" exit_code="{0 if ok else 1}"></tool_result>',
        exit_code=0 if ok else 1,
    )


def test_turns_are_compared_with_the_reference_solution():
    """Each turn against the reference call the oracle would make at that point."""
    task = builtin_suite().instances(1, templates=["csv_to_json"])[0]
    read, write = task.reference_solution
    right = episode(
        task=0,
        template="csv_to_json",
        steps=[
            _step(0, read.tool, dict(read.args)),  # exact
            _step(1, write.tool, {**write.args, "content": "[]\n"}),  # right call, wrong content
            final_step(2),  # final once the reference calls are done
        ],
    ).model_copy(update={"task_id": task.task_id})
    wrong = episode(
        task=0,
        template="csv_to_json",
        success=False,
        steps=[
            _step(0, "list_dir", {"path": "."}),  # wrong tool
            garbage_step(1),  # parse error
            final_step(2),  # premature: nothing of the reference was done
        ],
    ).model_copy(update={"task_id": task.task_id})
    assert [turn_kind(s, right.steps[:i], task) for i, s in enumerate(right.steps)] == [
        "exact",
        "wrong_content",
        "final",
    ]
    assert [turn_kind(s, wrong.steps[:i], task) for i, s in enumerate(wrong.steps)] == [
        "wrong_tool",
        "parse_error",
        "premature_final",
    ]
    m = evaluation_metrics([right, wrong], [task])
    assert m.n_turns == 6
    assert m.exact_call_rate == m.wrong_content_rate == m.wrong_tool_rate == 1 / 6
    assert m.parse_error_rate == m.premature_final_rate == 1 / 6
    assert m.by_template == {"csv_to_json": 0.5}
    # Without the tasks, the reference-based rates are unknown, not zero.
    assert evaluation_metrics([right, wrong]).wrong_tool_rate is None


def test_a_compact_checkpoint_sees_in_the_loop_exactly_what_training_renders(tmp_path):
    """The same-prompt invariant for the compact style: the loop asks the hf: policy for its
    system prompt (the style its checkpoint records), and the first step's recorded history
    hash equals the hash of training's compact messages."""
    from agent.policies.hf import HFPolicy
    from agent.settings import PolicySettings
    from training.base_model import build_base_model, protocol_corpus
    from training.settings import TrainingSettings
    from training.training_config import check_deployment, load_training_config_file

    settings = TrainingSettings(
        vocab_size=600,
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        max_length=256,
        max_position_embeddings=1024,
        architecture="qwen3",
        tokenizer_split="words",
        prompt_style="compact",
    )
    task = builtin_suite().instances(1, templates=["dir_tree"])[0]
    model_dir = build_base_model(
        tmp_path / "m", protocol_corpus([task], prompt_style="compact"), settings=settings
    )
    policy = HFPolicy(model_dir, PolicySettings(max_tokens=4))
    traj = asyncio.run(
        run_episode(
            task,
            policy,
            spec=SandboxSpec(),
            run_key="compact-check",
            settings=LoopSettings(max_steps=1, max_consecutive_parse_failures=1),
            open_sandbox=sandbox_opener(SandboxSettings()),
        )
    )
    assert traj.n_steps == 1
    messages = episode_messages(traj, "compact")
    assert messages[0]["content"].startswith("Protocol v1.")
    assert history_hash(messages[:2]) == traj.steps[0].history_hash
    # The full-style rendering is not what this model saw.
    assert history_hash(episode_messages(traj)[:2]) != traj.steps[0].history_hash
    config = load_training_config_file(model_dir)
    tools = list(BUILTIN_TOOLS.values())
    assert check_deployment(config, tools, system_prompt=policy.system_prompt(tools)) == []
    assert check_deployment(config, tools, system_prompt=messages[0]["content"]) == []
    assert check_deployment(config, tools, system_prompt=episode_messages(traj)[0]["content"])
