"""The promotion rule (`training.promotion`): a paired sign test on the same tasks, no
template regression, no rise in tool failures, infrastructure outcomes left out. Pure:
hand-built episodes."""

from __future__ import annotations

import pytest

from agent.trajectory import EpisodeStatus, FailureCategory, Trajectory
from tests.training.factory import episode
from training.promotion import PromotionRule, decide_promotion, sign_test_p


def _episodes(
    solved: list[bool], *, template: str = "csv_to_json", offset: int = 0
) -> list[Trajectory]:
    return [episode(task=offset + i, success=ok, template=template) for i, ok in enumerate(solved)]


def test_the_sign_test_is_binomial_on_the_discordant_pairs() -> None:
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(3, 0) == pytest.approx(1 / 8)
    assert sign_test_p(5, 1) == pytest.approx(7 / 64)
    assert sign_test_p(10, 0) == pytest.approx(1 / 1024)


def test_a_clear_gain_is_promoted_with_its_figures() -> None:
    champion = _episodes([False] * 10 + [True] * 2)
    challenger = _episodes([True] * 12)
    decision = decide_promotion(challenger, champion)
    assert decision.promote, decision.reason
    assert (
        decision.evidence["discordant_wins"] == 10 and decision.evidence["discordant_losses"] == 0
    )
    assert decision.evidence["p_value"] == pytest.approx(1 / 1024, abs=1e-6)
    assert decision.evidence["gain"] == pytest.approx(10 / 12, abs=1e-4)


def test_a_small_gain_that_could_be_noise_is_not_promoted() -> None:
    champion = _episodes([True, False] * 5)
    challenger = _episodes([True, True] + [True, False] * 4)  # one more task solved
    decision = decide_promotion(challenger, champion, PromotionRule(margin=0.05))
    assert not decision.promote
    assert "could be noise" in decision.reason


def test_a_regressed_template_blocks_an_overall_gain() -> None:
    champion = _episodes([False] * 10) + _episodes([True] * 4, template="dir_tree", offset=100)
    challenger = _episodes([True] * 10) + _episodes([False] * 4, template="dir_tree", offset=100)
    decision = decide_promotion(challenger, champion)
    assert not decision.promote
    assert "dir_tree -1.00" in decision.reason
    assert decision.evidence["template_delta"] == {"csv_to_json": 1.0, "dir_tree": -1.0}


def test_infrastructure_outcomes_are_no_evidence_either_way() -> None:
    champion = _episodes([False] * 12)
    challenger = _episodes([True] * 12)
    for t in challenger[:6]:  # the sandbox broke for half of the challenger's episodes
        t.status, t.failure_category = EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR
    decision = decide_promotion(challenger, champion, PromotionRule(min_pairs=8))
    assert not decision.promote
    assert decision.evidence == {**decision.evidence, "pairs": 6, "left_out": 6}
    assert "not enough evidence" in decision.reason
