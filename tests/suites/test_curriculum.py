"""Curriculum: success rates per template and the 30–70 % band."""

from __future__ import annotations

import polars as pl
import pytest

from suites.curriculum import TemplateStats, select_band, success_rates


def episodes(
    template, successes, failures, *, suite="builtin", policy="p", score=None, status_fail="failed"
):
    ok = [
        {
            "suite": suite,
            "template": template,
            "policy": policy,
            "status": "success",
            "verifier_score": 1.0,
        }
    ]
    bad = [
        {
            "suite": suite,
            "template": template,
            "policy": policy,
            "status": status_fail,
            "verifier_score": score,
        }
    ]
    return ok * successes + bad * failures


def test_rates_from_records_and_from_a_frame_agree():
    records = (
        episodes("easy", 9, 1, score=0.0)
        + episodes("mid", 5, 5, score=0.5)
        + episodes("hard", 0, 4, score=0.0)
    )
    from_records = success_rates(records)
    from_frame = success_rates(pl.DataFrame(records))
    assert from_records == from_frame
    by_name = {s.template: s for s in from_records}
    assert [s.template for s in from_records] == ["easy", "hard", "mid"]
    assert (by_name["easy"].episodes, by_name["easy"].successes, by_name["easy"].success_rate) == (
        10,
        9,
        0.9,
    )
    assert by_name["mid"].mean_score == pytest.approx(0.75)
    assert by_name["hard"].success_rate == 0.0


def test_environment_failures_are_not_counted_and_policy_filters():
    records = (
        episodes("t", 1, 1)
        + episodes("t", 0, 5, status_fail="env_error")
        + episodes("t", 0, 3, status_fail="aborted")
        + episodes("t", 4, 0, policy="other")
    )
    (stats,) = success_rates(records, policy="p")
    assert (stats.episodes, stats.successes) == (2, 1)
    (pooled,) = success_rates(records)
    assert (pooled.episodes, pooled.successes) == (6, 5)


def test_minimal_columns_only():
    (stats,) = success_rates(
        [{"template": "t", "status": "success"}, {"template": "t", "status": "timeout"}]
    )
    assert (stats.suite, stats.success_rate, stats.mean_score) == ("", 0.5, None)
    assert success_rates([]) == []
    with pytest.raises(ValueError, match="status"):
        success_rates([{"template": "t"}])


def stat(template, rate, episodes=10):
    return TemplateStats(
        suite="s",
        template=template,
        episodes=episodes,
        successes=round(rate * episodes),
        success_rate=rate,
        mean_score=None,
    )


def test_band_selection():
    stats = [
        stat("easy", 0.9),
        stat("mid", 0.5),
        stat("edge", 0.3),
        stat("hard", 0.1),
        stat("new", 0.0, episodes=2),
    ]
    picked = select_band(stats, all_templates=[("s", "mid"), ("s", "never_run")])
    assert [s.template for s in picked.in_band] == ["mid", "edge"]
    assert [s.template for s in picked.too_easy] == ["easy"]
    assert [s.template for s in picked.too_hard] == ["hard"]
    assert picked.unexplored == [("s", "new"), ("s", "never_run")]
    assert picked.selected == [("s", "mid"), ("s", "edge"), ("s", "new"), ("s", "never_run")]


def test_nothing_in_band_falls_back_to_the_nearest():
    picked = select_band(
        [stat("a", 1.0), stat("b", 0.8), stat("c", 0.0), stat("d", 0.25)], nearest_k=2
    )
    assert picked.in_band == [] and picked.unexplored == []
    assert picked.selected == [("s", "d"), ("s", "b")]


def test_band_arguments_are_validated():
    with pytest.raises(ValueError, match="low <= high"):
        select_band([], low=0.8, high=0.2)
    with pytest.raises(ValueError, match="positive integer"):
        select_band([], min_episodes=0)
