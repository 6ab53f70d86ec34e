"""Row builders per dataset kind, and the chat rendering they share with the episode loop."""

from __future__ import annotations

from agent.prompt import render_system_prompt
from agent.trajectory import EpisodeStatus, FailureCategory
from sandbox.tool_specs import BUILTIN_TOOLS
from tests.training.factory import call_step, episode, final_step, garbage_step
from training.builders import DatasetKind, SourceEpisode, build_rows
from training.conversations import episode_messages, plain_text, prompt_messages


def src(traj, verdict="keep", quality=0.8):
    return SourceEpisode(trajectory=traj, verdict=verdict, quality_score=quality)


def test_episode_messages_are_the_loops_history():
    traj = episode(steps=[call_step(0, "ls"), garbage_step(1), final_step(2)])
    messages = episode_messages(traj)
    assert messages[0] == {
        "role": "system",
        "content": render_system_prompt(BUILTIN_TOOLS.values()),
    }
    assert messages[1] == {"role": "user", "content": traj.prompt}
    assistant = [m["content"] for m in messages if m["role"] == "assistant"]
    assert assistant == [s.raw_output for s in traj.steps]
    observations = [m["content"] for m in messages[2:] if m["role"] == "user"]
    assert observations == [s.observation for s in traj.steps if s.observation]
    assert messages[-1]["role"] == "assistant"
    assert prompt_messages(traj) == messages[:2]


def test_trailing_observation_is_dropped():
    traj = episode(success=False, steps=[call_step(0, "ls"), call_step(1, "ls -a")])
    assert episode_messages(traj)[-1] == {"role": "assistant", "content": traj.steps[-1].raw_output}


def test_sft_never_trains_on_an_unparsed_assistant_turn():
    """A verified episode that recovered from a malformed turn is cut before it (TRL trains
    every assistant turn of a chat); one whose first turn did not parse gives no row; both
    are counted in the manifest."""
    recovered = episode(task=1, steps=[call_step(0, "ls"), garbage_step(1), final_step(2)])
    first_bad = episode(task=2, steps=[garbage_step(0), call_step(1, "ls"), final_step(2)])
    clean = episode(task=3)
    for kind in (DatasetKind.SFT, DatasetKind.DISTILL):
        built = build_rows(kind, [src(recovered), src(first_bad), src(clean)])
        by_id = {r["episode_id"]: r for r in built.rows}
        assert set(by_id) == {str(recovered.episode_id), str(clean.episode_id)}
        trained = [
            m for m in by_id[str(recovered.episode_id)]["messages"] if m["role"] == "assistant"
        ]
        assert [m["content"] for m in trained] == [recovered.steps[0].raw_output]
        assert by_id[str(recovered.episode_id)]["messages"][-1]["role"] == "assistant"
        assert by_id[str(clean.episode_id)]["messages"] == episode_messages(clean)
        assert built.manifest == {
            "episodes_cut": 2,
            "episodes_without_parsed_turn": 1,
            "turns_after_unparsed_cut": 3,
            "unparsed_turns_cut": 2,
        }
        assert str(first_bad.episode_id) not in {str(e.episode_id) for e in built.lineage}
    assert build_rows(DatasetKind.SFT, [src(clean)]).manifest == {}


def test_sft_keeps_verified_non_discarded_episodes_weighted_by_quality():
    good = episode(task=1)
    downweighted = episode(task=2)
    failed = episode(task=3, success=False)
    discarded = episode(task=4)
    built = build_rows(
        DatasetKind.SFT,
        [
            src(good, quality=0.9),
            src(downweighted, "downweight", 0.4),
            src(failed),
            src(discarded, "discard"),
        ],
    )
    assert [r["episode_id"] for r in built.rows] == [
        str(good.episode_id),
        str(downweighted.episode_id),
    ]
    assert [r["weight"] for r in built.rows] == [0.9, 0.4]
    assert abs(built.weight_sum - 1.3) < 1e-9
    assert {(e.episode_id, e.role) for e in built.lineage} == {
        (good.episode_id, "example"),
        (downweighted.episode_id, "example"),
    }
    assert built.rows[0]["messages"] == episode_messages(good)


def test_dpo_pairs_success_and_failure_at_their_first_divergence():
    win = episode(
        task=1, rollout=0, steps=[call_step(0, "ls"), call_step(1, "cat a.csv"), final_step(2)]
    )
    loss = episode(
        task=1, rollout=1, success=False, steps=[call_step(0, "ls"), final_step(1, "gave up")]
    )
    other_task_loss = episode(task=2, rollout=0, success=False)
    built = build_rows(DatasetKind.DPO, [src(win), src(loss), src(other_task_loss)])
    assert len(built.rows) == 1
    row = built.rows[0]
    # shared history: system, task, first call, its observation
    assert row["prompt"] == episode_messages(win)[:4]
    assert row["chosen"] == [{"role": "assistant", "content": win.steps[1].raw_output}]
    assert row["rejected"] == [{"role": "assistant", "content": loss.steps[1].raw_output}]
    roles = {(e.episode_id, e.role) for e in built.lineage}
    assert roles == {(win.episode_id, "chosen"), (loss.episode_id, "rejected")}


def test_dpo_skips_pairs_that_never_diverge_in_an_assistant_turn():
    win = episode(task=1, rollout=0)
    twin = episode(task=1, rollout=1, success=False)  # same turns, different verdict
    assert build_rows(DatasetKind.DPO, [src(win), src(twin)]).rows == []


def test_kto_labels_turns_by_outcome_and_parse():
    win = episode(task=1, steps=[garbage_step(0), call_step(1, "ls"), final_step(2)])
    loss = episode(task=2, success=False)
    built = build_rows(DatasetKind.KTO, [src(win), src(loss)])
    labels = [(r["episode_id"], r["step_index"], r["label"]) for r in built.rows]
    assert labels == [
        (str(win.episode_id), 0, False),
        (str(win.episode_id), 1, True),
        (str(win.episode_id), 2, True),
        (str(loss.episode_id), 0, False),
        (str(loss.episode_id), 1, False),
    ]
    for row in built.rows:
        assert row["prompt"][-1]["role"] != "assistant"
        assert row["completion"][0]["role"] == "assistant"


def test_grpo_has_one_prompt_per_task():
    built = build_rows(
        DatasetKind.GRPO,
        [src(episode(task=1, rollout=0)), src(episode(task=1, rollout=1)), src(episode(task=2))],
    )
    assert len(built.rows) == 2
    assert all(len(r["prompt"]) == 2 for r in built.rows)
    assert {r["instance_seed"] for r in built.rows} == {1, 2}


def test_distill_keeps_the_shortest_verified_trajectory_per_task():
    long_ = episode(
        task=1,
        rollout=0,
        policy="teacher-a",
        steps=[call_step(0, "ls"), call_step(1, "ls"), final_step(2)],
    )
    short = episode(task=1, rollout=1, policy="teacher-b")
    wrong = episode(task=1, rollout=2, policy="teacher-c", success=False, steps=[final_step(0)])
    unsolved = episode(task=2, rollout=0, policy="teacher-a", success=False)
    built = build_rows(DatasetKind.DISTILL, [src(long_), src(short), src(wrong), src(unsolved)])
    assert len(built.rows) == 1
    row = built.rows[0]
    assert row["episode_id"] == str(short.episode_id)
    assert row["teacher"] == "teacher-b"
    assert row["n_candidates"] == 2 and row["n_teachers"] == 2


def test_cpt_keeps_failures_and_observations_as_plain_text():
    failed = episode(
        task=1,
        success=False,
        steps=[call_step(0, "cat missing", output="No such file", exit_code=1), garbage_step(1)],
    )
    failed.status, failed.failure_category = EpisodeStatus.FAILED, FailureCategory.PARSE_FAILURES
    built = build_rows(DatasetKind.CPT, [src(failed), src(episode(task=2), verdict="discard")])
    assert len(built.rows) == 1
    text = built.rows[0]["text"]
    assert text == plain_text(failed)
    assert "No such file" in text and "hmm, let me think" in text and "<tool_error" in text
    assert "parse_failures" in text
