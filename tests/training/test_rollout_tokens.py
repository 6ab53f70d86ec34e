"""An episode as a TRL rollout: prompt, completion, env mask and logprobs, token for token."""

from __future__ import annotations

import pytest

from agent.trajectory import Step, Trajectory
from tests.training.factory import call_step, episode, final_step
from training.errors import MissingTokenIds, RolloutTokenError, TokenPrefixError, TrainerError
from training.rollout_tokens import (
    TokenRollout,
    placeholder_rollout,
    rollout_func_output,
    token_rollout,
)


def _tokens(step: Step, prompt: list[int], sampled: list[int], logprobs: bool = True) -> Step:
    step.prompt_token_ids = prompt
    step.completion_token_ids = sampled
    step.logprobs = [-0.1 * (i + 1) for i in range(len(sampled))] if logprobs else None
    return step


def _three_turns() -> Trajectory:
    """Turn 0 samples [10, 11, 2]; the loop adds observation [50, 51]; turn 1 samples [12, 2];
    observation [52]; turn 2 samples [13, 14, 2]."""
    p0 = [1, 2, 3, 4]
    p1 = [*p0, 10, 11, 2, 50, 51]
    p2 = [*p1, 12, 2, 52]
    return episode(
        steps=[
            _tokens(call_step(0, "ls"), p0, [10, 11, 2]),
            _tokens(call_step(1, "cat a"), p1, [12, 2]),
            _tokens(final_step(2), p2, [13, 14, 2]),
        ]
    )


def test_turns_and_observations_in_order_with_observations_masked() -> None:
    traj = _three_turns()
    r = token_rollout(traj)
    assert r.episode_id == str(traj.episode_id)
    assert r.prompt_ids == [1, 2, 3, 4]
    assert r.completion_ids == [10, 11, 2, 50, 51, 12, 2, 52, 13, 14, 2]
    assert r.env_mask == [1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1]
    # Each id's turn: a turn's sampled ids, then its tool result's observation ids.
    assert r.turn_index == [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    # The prompt plus the completion is the last turn's prompt plus what it sampled.
    last = traj.steps[-1]
    assert last.prompt_token_ids is not None and last.completion_token_ids is not None
    assert r.prompt_ids + r.completion_ids == last.prompt_token_ids + last.completion_token_ids
    # Sampled ids are exactly the recorded completion ids, in order.
    assert r.sampled_ids == [t for s in traj.steps for t in s.completion_token_ids or []]


def test_logprobs_align_recorded_on_sampled_zero_on_observations() -> None:
    r = token_rollout(_three_turns())
    assert len(r.logprobs) == len(r.completion_ids)
    assert r.logprobs == pytest.approx(
        [-0.1, -0.2, -0.3, 0.0, 0.0, -0.1, -0.2, 0.0, -0.1, -0.2, -0.3]
    )


def test_a_turn_without_logprobs_gives_none_on_its_sampled_tokens() -> None:
    traj = _three_turns()
    traj.steps[1].logprobs = None
    r = token_rollout(traj)
    assert r.logprobs[5:7] == [None, None]
    assert r.logprobs[3:5] == [0.0, 0.0]


def test_one_turn_episode_has_no_observation() -> None:
    traj = episode(steps=[_tokens(final_step(0), [7, 8], [9, 2])])
    r = token_rollout(traj)
    assert (r.prompt_ids, r.completion_ids, r.env_mask) == ([7, 8], [9, 2], [1, 1])


def test_a_re_rendered_prompt_is_refused_naming_episode_and_step() -> None:
    traj = _three_turns()
    # Turn 2's prompt re-tokenized turn 1's answer: [12, 2] became [12, 3].
    p2 = list(traj.steps[2].prompt_token_ids or [])
    p2[10] = 3
    traj.steps[2].prompt_token_ids = p2
    with pytest.raises(TokenPrefixError) as caught:
        token_rollout(traj)
    err = caught.value
    assert (err.episode_id, err.step_index) == (str(traj.episode_id), 2)
    assert str(traj.episode_id) in str(err) and "step 2" in str(err)
    assert "first difference at token 10" in str(err)
    assert isinstance(err, RolloutTokenError) and isinstance(err, TrainerError)


def test_a_prompt_shorter_than_the_history_is_refused() -> None:
    traj = _three_turns()
    traj.steps[1].prompt_token_ids = [1, 2, 3, 4, 10]
    with pytest.raises(TokenPrefixError) as caught:
        token_rollout(traj)
    assert caught.value.step_index == 1


def test_steps_without_token_ids_are_refused() -> None:
    traj = _three_turns()
    traj.steps[1].completion_token_ids = None
    with pytest.raises(MissingTokenIds, match="step 1 recorded no completion token ids"):
        token_rollout(traj)
    plain = episode()  # what a scripted policy records: no ids at all
    with pytest.raises(MissingTokenIds, match="step 0 recorded no prompt token ids"):
        token_rollout(plain)
    with pytest.raises(MissingTokenIds, match="has no step"):
        token_rollout(episode(steps=[]))


def test_logprobs_of_another_length_are_refused() -> None:
    traj = _three_turns()
    traj.steps[0].logprobs = [-1.0]
    with pytest.raises(MissingTokenIds, match="1 logprobs for 3 completion ids"):
        token_rollout(traj)


def test_rollout_func_output_is_trls_shape() -> None:
    rollouts: list[TokenRollout] = [token_rollout(_three_turns()), placeholder_rollout(0)]
    out = rollout_func_output(rollouts)
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_mask"}
    assert out["completion_ids"][1] == [0] and out["env_mask"][1] == [0]
    for key in ("completion_ids", "logprobs", "env_mask"):
        assert [len(x) for x in out[key]] == [11, 1]
