"""An alias's champion: what a challenger is evaluated against, the promotion that follows,
and the policy the next night collects with.

- **Against what.** `comparison_for(alias=...)` reads the alias's current target once,
  before anything is evaluated: a challenger is compared with the champion, never merely
  with its predecessor. An alias not set yet has no champion: the first promotion needs
  the challenger to beat the base it was trained from (its parent checkpoint). Without an
  alias the comparison is the previous checkpoint, as before (`previous_checkpoint`).
- **The decision, recorded.** `promote_if_better` runs `training.promotion.decide_promotion`
  (pure) on the two checkpoints' episodes on the same held-out tasks and, when it says so,
  points the alias at the challenger (`training.aliases.point_alias`, `expected` = the
  target read before deciding: an alias that moved meanwhile is a conflict, not an
  overwrite). Either way the outcome (`PromotionOutcome`: promoted or kept, the reason,
  the figures) is returned for the caller to store with the challenger's evaluation; a
  promotion is also the alias change's row, with the same evidence.
- **Who collects.** `champion_policy` turns a request's `hf:alias/NAME` into what runs
  tonight: the alias as it is when set (the collection resolves it when it opens and
  labels its episodes with the checkpoint); before the first promotion, the newest base
  model, and without any base model the caller's fallback (a scripted policy).

Nothing here imports Prefect: the evaluate and collect flows call these as plain functions.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from sqlalchemy import Engine

from agent.trajectory import Trajectory
from storage.objects import ObjectStore
from training.aliases import AliasConflict, AliasTarget, PromotionRefused, alias_target, point_alias
from training.promotion import PromotionRule, decide_promotion
from training.registry import get_checkpoint, newest_base_model, previous_checkpoint

__all__ = [
    "ALIAS_PREFIX",
    "ChampionPolicy",
    "Comparison",
    "PromotionOutcome",
    "champion_policy",
    "comparison_for",
    "promote_if_better",
]

ALIAS_PREFIX = "hf:alias/"
"""A policy spec naming a model alias (resolved by `collection.lifecycle` when it opens)."""

Role = Literal["champion", "base", "previous"]
"""What the comparison checkpoint is to the challenger."""


@dataclass(frozen=True)
class Comparison:
    """The checkpoint a challenger is evaluated against, read before the evaluation."""

    checkpoint_id: uuid.UUID | None
    """The comparison checkpoint; None: nothing to compare with."""
    role: Role
    """`champion` (the alias's target), `base` (the challenger's parent, the alias being
    unset) or `previous` (no alias: its parent, else the newest older checkpoint)."""
    expected: AliasTarget | None
    """The alias's target as read (None: unset, or no alias); a promotion is written only
    if it is still current."""
    note: str = ""
    """Why there is no comparison, when `checkpoint_id` is None."""


def comparison_for(engine: Engine, challenger: uuid.UUID, *, alias: str | None) -> Comparison:
    """What `challenger` is compared with: the alias's champion; with the alias unset, the
    base it was trained from; without an alias, the previous checkpoint.

    Raises:
        CheckpointNotFound: no checkpoint `challenger`.
    """
    if alias is None:
        return Comparison(previous_checkpoint(engine, challenger), "previous", None)
    current = alias_target(engine, alias)
    if current is None:
        parent = get_checkpoint(engine, challenger).parent_checkpoint_id
        return Comparison(
            parent,
            "base",
            None,
            note=""
            if parent is not None
            else f"alias {alias!r} is not set and checkpoint {challenger} has no base "
            "checkpoint to beat",
        )
    if current.checkpoint_id is None:
        return Comparison(
            None,
            "champion",
            current,
            note=f"alias {alias!r} points at the endpoint {current.policy}, which the "
            "evaluation cannot run as a checkpoint",
        )
    return Comparison(current.checkpoint_id, "champion", current)


class PromotionOutcome(BaseModel):
    """What the promote stage decided for one challenger (stored with its evaluation)."""

    alias: str
    """The alias decided on."""
    challenger_id: uuid.UUID
    """The checkpoint evaluated."""
    compared_with: uuid.UUID | None
    """The checkpoint it was compared with (None: nothing to compare with)."""
    role: Role
    """What that checkpoint was: the alias's `champion`, or the `base` (alias unset)."""
    promoted: bool
    """Whether the alias now points at the challenger."""
    reason: str
    """One line: the rule's verdict and its figures, or why no decision was possible."""
    evidence: dict[str, Any]
    """The figures compared (`PromotionDecision.evidence`), with what was compared."""
    seq: int | None = None
    """The alias change written (promoted), else None."""

    def line(self) -> str:
        """The decision in one line (the flow's log, the CLI's output)."""
        if self.promoted:
            return (
                f"{self.alias}: promoted checkpoint {self.challenger_id} over the "
                f"{self.role} {self.compared_with} (change {self.seq}): {self.reason}"
            )
        against = f" over the {self.role} {self.compared_with}" if self.compared_with else ""
        return f"{self.alias}: checkpoint {self.challenger_id} not promoted{against}: {self.reason}"


def promote_if_better(
    engine: Engine,
    store: ObjectStore,
    *,
    alias: str,
    challenger: uuid.UUID,
    challenger_episodes: Sequence[Trajectory],
    comparison: Comparison,
    comparison_episodes: Sequence[Trajectory],
    rule: PromotionRule,
    actor: str,
) -> PromotionOutcome:
    """Decide whether `challenger` replaces `comparison` (episodes of both on the same
    held-out tasks) under `rule`, and point `alias` at it when it does.

    Every way of not promoting is an outcome, never an exception: the rule's refusal, no
    comparison checkpoint, the challenger already the champion, a checkpoint deployed
    differently from the champion (`PromotionRefused`), and another change of the alias
    written since `comparison.expected` was read (`AliasConflict`).
    """

    def kept(reason: str, evidence: dict[str, Any] | None = None) -> PromotionOutcome:
        return PromotionOutcome(
            alias=alias,
            challenger_id=challenger,
            compared_with=comparison.checkpoint_id,
            role=comparison.role,
            promoted=False,
            reason=reason,
            evidence=evidence or {},
        )

    if comparison.checkpoint_id is None:
        return kept(f"nothing to compare with: {comparison.note}")
    if comparison.checkpoint_id == challenger:
        return kept("already the champion")
    decision = decide_promotion(challenger_episodes, comparison_episodes, rule)
    evidence = {
        **decision.evidence,
        "challenger": str(challenger),
        "compared_with": str(comparison.checkpoint_id),
        "role": comparison.role,
    }
    if not decision.promote:
        return kept(decision.reason, evidence)
    try:
        change = point_alias(
            engine,
            store,
            alias,
            challenger,
            reason=decision.reason,
            actor=actor,
            evidence=evidence,
            action="promote",
            expected=comparison.expected,
        )
    except (AliasConflict, PromotionRefused) as e:
        return kept(f"the rule would promote, but the alias was not changed: {e}", evidence)
    return PromotionOutcome(
        alias=alias,
        challenger_id=challenger,
        compared_with=comparison.checkpoint_id,
        role=comparison.role,
        promoted=True,
        reason=decision.reason,
        evidence=evidence,
        seq=change.seq,
    )


@dataclass(frozen=True)
class ChampionPolicy:
    """The policy a request naming an alias collects with tonight."""

    spec: str
    """`hf:alias/NAME` when the alias is set (its endpoint's spec when it names one); else
    the base model's or the fallback's spec."""
    fell_back: bool
    """Whether the alias was unset and something else collects."""
    line: str
    """What runs and why, for the run's log."""


def champion_policy(engine: Engine, spec: str, *, fallback: str) -> ChampionPolicy:
    """What a request whose policy is `spec` collects with: an `hf:alias/NAME` set to a
    checkpoint stays as it is (the collection resolves it when it opens), one set to an
    endpoint becomes that endpoint's spec; an unset one falls back to the newest base
    model, else to `fallback` (the first night). Any other spec is kept."""
    if not spec.startswith(ALIAS_PREFIX):
        return ChampionPolicy(spec, False, f"policy {spec}")
    alias = spec.removeprefix(ALIAS_PREFIX)
    target = alias_target(engine, alias)
    if target is not None:
        # A checkpoint stays named by the alias (resolved when the collection opens); an
        # endpoint registered as the champion is collected from directly.
        runs = spec if target.checkpoint_id is not None else target.policy
        return ChampionPolicy(
            runs, False, f"policy {spec}: the champion, {target.policy} (change {target.seq})"
        )
    why = f"model alias {alias!r} is not set yet (no promotion so far)"
    base = newest_base_model(engine)
    if base is not None:
        return ChampionPolicy(
            f"hf:checkpoint/{base}", True, f"{why}: collecting with the base model {base}"
        )
    return ChampionPolicy(
        fallback, True, f"{why} and no base model is registered: collecting with {fallback}"
    )
