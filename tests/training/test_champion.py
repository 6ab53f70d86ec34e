"""An alias's champion (`training.champion`): what a challenger is compared with, the
promotion recorded (or why not), and what the nightly request naming the alias collects
with — alias set, alias unset with a base model, alias unset and no model at all. SQLite
and PostgreSQL (`migrated_engine`); checkpoint rows with stored training configs, no
weights (nothing here runs a model)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agent.trajectory import Trajectory
from storage.objects import LocalObjectStore
from tests.training.factory import episode
from tests.training.test_aliases import _checkpoint
from training.aliases import alias_history, alias_target, point_alias
from training.champion import champion_policy, comparison_for, promote_if_better
from training.promotion import PromotionRule


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    s = LocalObjectStore(tmp_path / "objects")
    s.check()
    return s


def _child_of(engine: Engine, store: LocalObjectStore, parent: uuid.UUID) -> uuid.UUID:
    from sqlmodel import Session

    from models import Checkpoint

    child = _checkpoint(engine, store)
    with Session(engine) as session:
        row = session.get(Checkpoint, child)
        assert row is not None
        row.parent_checkpoint_id = parent
        session.add(row)
        session.commit()
    return child


def _played(solved: list[bool]) -> list[Trajectory]:
    return [episode(task=i, success=ok) for i, ok in enumerate(solved)]


RULE = PromotionRule(min_pairs=4)


def test_the_nightly_request_collects_with_the_champion_the_base_or_the_fallback(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    spec = "hf:alias/champion"
    first = champion_policy(migrated_engine, spec, fallback="scripted:noisy")
    assert (first.spec, first.fell_back) == ("scripted:noisy", True)
    assert "'champion' is not set yet" in first.line and "no base model" in first.line

    base = _checkpoint(migrated_engine, store)  # a checkpoint no training run produced
    with_base = champion_policy(migrated_engine, spec, fallback="scripted:noisy")
    assert (with_base.spec, with_base.fell_back) == (f"hf:checkpoint/{base}", True)
    assert f"collecting with the base model {base}" in with_base.line

    point_alias(migrated_engine, store, "champion", base, reason="r", actor="t")
    set_ = champion_policy(migrated_engine, spec, fallback="scripted:noisy")
    assert (set_.spec, set_.fell_back) == (spec, False)  # resolved when the run opens
    assert f"the champion, hf:checkpoint/{base} (change 1)" in set_.line
    other = champion_policy(migrated_engine, "scripted:oracle", fallback="scripted:noisy")
    assert (other.spec, other.fell_back) == ("scripted:oracle", False)


def test_a_challenger_is_compared_with_the_champion_else_with_its_base(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    base = _checkpoint(migrated_engine, store)
    a, b = _child_of(migrated_engine, store, base), _child_of(migrated_engine, store, base)
    unset = comparison_for(migrated_engine, a, alias="champion")
    assert (unset.checkpoint_id, unset.role, unset.expected) == (base, "base", None)
    orphan = comparison_for(migrated_engine, base, alias="champion")
    assert orphan.checkpoint_id is None and "no base checkpoint" in orphan.note

    promoted = promote_if_better(
        migrated_engine, store, alias="champion", challenger=a,
        challenger_episodes=_played([True] * 4), comparison=unset,
        comparison_episodes=_played([False] * 4), rule=RULE, actor="t",
    )  # fmt: skip
    assert promoted.promoted and promoted.seq == 1, promoted.reason
    champion = comparison_for(migrated_engine, b, alias="champion")
    assert (champion.checkpoint_id, champion.role) == (a, "champion")
    assert comparison_for(migrated_engine, b, alias=None).role == "previous"
    again = promote_if_better(
        migrated_engine, store, alias="champion", challenger=a,
        challenger_episodes=[], comparison=comparison_for(migrated_engine, a, alias="champion"),
        comparison_episodes=[], rule=RULE, actor="t",
    )  # fmt: skip
    assert (again.promoted, again.reason) == (False, "already the champion")


def test_an_alias_moved_since_it_was_read_is_a_kept_outcome_not_an_overwrite(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    base = _checkpoint(migrated_engine, store)
    a, b = _child_of(migrated_engine, store, base), _child_of(migrated_engine, store, base)
    point_alias(migrated_engine, store, "champion", base, reason="r", actor="t")
    read_first = comparison_for(migrated_engine, b, alias="champion")
    point_alias(migrated_engine, store, "champion", a, reason="meanwhile", actor="other")
    outcome = promote_if_better(
        migrated_engine, store, alias="champion", challenger=b,
        challenger_episodes=_played([True] * 4), comparison=read_first,
        comparison_episodes=_played([False] * 4), rule=RULE, actor="t",
    )  # fmt: skip
    assert not outcome.promoted and "changed meanwhile" in outcome.reason
    assert outcome.evidence["discordant_wins"] == 4  # the figures are kept with the refusal
    current = alias_target(migrated_engine, "champion")
    assert current is not None and current.checkpoint_id == a
    assert len(alias_history(migrated_engine, "champion")) == 2
