"""Harbor's multi-reward form: a `reward.json` of named rewards is scored by the suite's
reward rule (the mean by default) and every named reward lands in SQL.

The rule itself is pure logic (fast tests); the end-to-end test runs a task whose
`tests/test.sh` writes `{"correctness": 1, "performance": 0.5}` through the real episode
loop and verifier runner in real nsjail jails (image built with mmdebstrap: needs root).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from suites.harbor.suite import load_harbor_suite
from suites.settings import SuitesSettings
from tasks.harbor_reward import combine, reward_from
from tests.suites.test_harbor_tasks import IMAGES, _episode, _task, builds_images, needs_builder

NAMED = '{"correctness": 1, "performance": 0.5, "note": "slow"}'


def test_named_rewards_combine_by_the_rule_and_reward_wins_when_present() -> None:
    score, keys, source = reward_from({"reward_json": NAMED})
    assert score == 0.75 and keys == {"correctness": 1, "performance": 0.5, "note": "slow"}
    assert source == "reward.json (mean of correctness, performance)"
    assert reward_from({"reward_json": NAMED}, "min")[0] == 0.5
    assert reward_from({"reward_json": NAMED}, "max")[0] == 1.0
    assert reward_from({"reward_json": NAMED}, "product")[0] == 0.5
    assert reward_from({"reward_json": NAMED}, "key:performance")[0] == 0.5
    with_reward = '{"reward": 0.2, "correctness": 1, "performance": 1}'
    assert reward_from({"reward_json": with_reward}, "max")[:3:2] == (0.2, "reward.json")
    assert reward_from({"reward_json": '{"correctness": 0.25}'}, "min")[0] == 0.25
    with pytest.raises(ValueError, match="no numeric 'speed'"):
        reward_from({"reward_json": NAMED}, "key:speed")
    with pytest.raises(ValueError, match="no numeric reward"):
        reward_from({"reward_json": '{"note": "x", "ok": true}'})
    assert combine({"a": 0.0, "b": 1.0, "c": 0.5}, "mean") == 0.5


def test_the_rule_is_a_suite_setting_checked_where_it_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPIFLOW_SUITES_HARBOR_REWARD_RULE", "min")
    monkeypatch.setenv("EPIFLOW_SUITES_HARBOR_REWARD_RULES", '{"tb": "key:correctness"}')
    settings = SuitesSettings()
    assert (settings.reward_rule_for("tb"), settings.reward_rule_for("other")) == (
        "key:correctness",
        "min",
    )
    monkeypatch.setenv("EPIFLOW_SUITES_HARBOR_REWARD_RULE", "average")
    with pytest.raises(ValueError, match="must be one of mean, min, max, product or key:NAME"):
        SuitesSettings()


@pytest.fixture(scope="module")
def named_reward_episodes():
    root = Path(tempfile.mkdtemp(dir=IMAGES.parent))
    root.chmod(0o755)
    try:
        _task(
            root, "multi-reward",
            toml='version = "1.0"\n[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 60\n',
            # a base built as named: the oracle's partial score (0.75 < 1.0) is scored, not
            # stored as `substituted-base` as it would be on ubuntu:24.04 (docs/harbor.md)
            dockerfile="FROM debian:trixie\nWORKDIR /app\n",
            test_sh=f"#!/bin/bash\necho '{NAMED}' > /logs/verifier/reward.json\n",
            solve="#!/bin/bash\ntrue\n",
        )  # fmt: skip
        IMAGES.mkdir(exist_ok=True)
        by_rule = {}
        for rule in ("mean", "min"):
            suite = load_harbor_suite(root, name="rewards", images_dir=IMAGES, reward_rule=rule)
            by_rule[rule] = _episode(suite.generate("multi-reward", 0), "scripted:oracle")
        yield by_rule
    finally:
        shutil.rmtree(root, ignore_errors=True)


@needs_builder
@builds_images
def test_named_rewards_through_the_verifier_runner_are_scored_and_stored(
    named_reward_episodes, db_url: str, tmp_path: Path
) -> None:
    from agent.trajectory import EpisodeStatus
    from models import HarborEpisode
    from storage.episodes import persist_episodes
    from storage.migrate import upgrade
    from storage.objects import LocalObjectStore

    mean, low = named_reward_episodes["mean"], named_reward_episodes["min"]
    for traj in (mean, low):
        assert traj.status != EpisodeStatus.ENV_ERROR, traj.failure_reason
    assert (mean.verifier_score, low.verifier_score) == (0.75, 0.5)
    assert "reward.json (min of correctness, performance)" in (low.verifier_reason or "")

    engine = create_engine(db_url)
    upgrade(engine)
    # Both episodes are the same task, seed and run key (one episode id): store the mean's.
    persist_episodes(engine, LocalObjectStore(tmp_path / "objects"), [mean])
    with engine.connect() as conn:
        rows = conn.execute(select(HarborEpisode.__table__)).mappings().all()  # type: ignore[attr-defined]
    engine.dispose()
    assert [(r["reward_source"], r["reward"]) for r in rows] == [
        (
            "reward.json (mean of correctness, performance)",
            {"correctness": 1, "performance": 0.5, "note": "slow"},
        )
    ]
