"""Named model aliases (`champion`, …): what each points at now, and every change, kept.

An alias points at a checkpoint (or at an external endpoint registered as a policy spec).
It never changes in place: `point_alias` (a promotion, or a change by hand) and
`rollback_alias` (back to the target before the current one) each add a
`model_alias_change` row with who, when, why and the evidence, numbered in the alias's
own sequence. Two changes racing on one alias both read the same current `seq`; the
unique `(alias, seq)` lets exactly one write `seq` + 1, and the other gets `AliasConflict`
naming the winner's target.

A checkpoint may replace the alias's current one only when it can be deployed the same
way: the same tool-call protocol version, the same tools (by name) and the same prompt
style in its training config (`training.training_config`); otherwise `PromotionRefused`
and nothing is written. The decision *whether* a challenger is better is
`training.promotion` (pure); this module only records what was decided.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from models import ModelAliasChange
from storage.objects import ObjectStore
from training.errors import RegistryError
from training.registry import get_checkpoint, load_training_config

__all__ = [
    "AliasConflict",
    "AliasTarget",
    "PromotionRefused",
    "alias_history",
    "alias_target",
    "list_aliases",
    "point_alias",
    "rollback_alias",
]


class AliasConflict(RegistryError):
    """Another change of the alias was written first (two promotions raced)."""


class PromotionRefused(RegistryError):
    """The checkpoint cannot take the alias: unknown, or deployed differently from its
    current target (protocol, tools, prompt style)."""


@dataclass(frozen=True)
class AliasTarget:
    """One change of an alias: what it points at from then on (the current target is the
    latest)."""

    alias: str
    seq: int
    action: str
    checkpoint_id: uuid.UUID | None
    policy_spec: str | None
    previous_checkpoint_id: uuid.UUID | None
    reason: str
    evidence: dict[str, Any]
    actor: str
    changed_at: datetime

    @property
    def policy(self) -> str:
        """The policy spec a collection uses for it (`hf:checkpoint/<id>`, or the endpoint)."""
        if self.checkpoint_id is not None:
            return f"hf:checkpoint/{self.checkpoint_id}"
        return str(self.policy_spec)

    @classmethod
    def from_row(cls, row: ModelAliasChange) -> AliasTarget:
        return cls(
            alias=row.alias,
            seq=row.seq,
            action=row.action,
            checkpoint_id=row.checkpoint_id,
            policy_spec=row.policy_spec,
            previous_checkpoint_id=row.previous_checkpoint_id,
            reason=row.reason,
            evidence=dict(row.evidence or {}),
            actor=row.actor,
            changed_at=row.changed_at,
        )


def alias_target(engine: Engine, alias: str) -> AliasTarget | None:
    """The alias's current target (its latest change); None when it was never set."""
    with Session(engine) as session:
        row = session.execute(
            select(ModelAliasChange)
            .where(col(ModelAliasChange.alias) == alias)
            .order_by(col(ModelAliasChange.seq).desc())
            .limit(1)
        ).scalar_one_or_none()
        return None if row is None else AliasTarget.from_row(row)


def alias_history(engine: Engine, alias: str) -> list[AliasTarget]:
    """Every change of the alias, oldest first."""
    with Session(engine) as session:
        rows = session.execute(
            select(ModelAliasChange)
            .where(col(ModelAliasChange.alias) == alias)
            .order_by(col(ModelAliasChange.seq))
        ).scalars()
        return [AliasTarget.from_row(r) for r in rows]


def list_aliases(engine: Engine) -> list[AliasTarget]:
    """Every alias's current target, by name."""
    with Session(engine) as session:
        latest = (
            select(col(ModelAliasChange.alias), func.max(col(ModelAliasChange.seq)).label("seq"))
            .group_by(col(ModelAliasChange.alias))
            .subquery()
        )
        rows = session.execute(
            select(ModelAliasChange)
            .join(
                latest,
                (col(ModelAliasChange.alias) == latest.c.alias)
                & (col(ModelAliasChange.seq) == latest.c.seq),
            )
            .order_by(col(ModelAliasChange.alias))
        ).scalars()
        return [AliasTarget.from_row(r) for r in rows]


def point_alias(
    engine: Engine,
    store: ObjectStore,
    alias: str,
    checkpoint_id: uuid.UUID,
    *,
    reason: str,
    actor: str,
    evidence: dict[str, Any] | None = None,
    action: str = "promote",
    expected: AliasTarget | None = None,
) -> AliasTarget:
    """Point `alias` at `checkpoint_id` from now on, recording why.

    `expected` is the target the caller decided against (read before its decision); the
    change is written only if it is still current. Default: the current one, read now.

    Raises:
        PromotionRefused: no such checkpoint, or it is deployed differently (protocol
            version, tools, prompt style) from the alias's current checkpoint.
        AliasConflict: another change of the alias was written since `expected`.
    """
    try:
        get_checkpoint(engine, checkpoint_id)
    except RegistryError as e:
        raise PromotionRefused(f"alias {alias!r}: {e}", setting="CHECKPOINT") from e
    current = alias_target(engine, alias) if expected is None else expected
    if current is not None and current.checkpoint_id is not None:
        _check_compatible(engine, store, alias, current.checkpoint_id, checkpoint_id)
    return _write(
        engine,
        alias,
        current,
        checkpoint_id=checkpoint_id,
        action=action,
        reason=reason,
        evidence=evidence or {},
        actor=actor,
    )


def rollback_alias(
    engine: Engine,
    store: ObjectStore,
    alias: str,
    *,
    reason: str,
    actor: str,
    evidence: dict[str, Any] | None = None,
    expected_seq: int | None = None,
) -> AliasTarget:
    """Point `alias` back at the checkpoint it pointed at before its current one
    (`evidence`: what decided it, e.g. a monitor's breach figures, stored with the change).
    `expected_seq`: the change the caller judged (a monitor's champion); the rollback is
    written only while it is still current.

    Raises:
        RegistryError: the alias was never set, or has no earlier checkpoint.
        AliasConflict: another change of the alias was written meanwhile (or since
            `expected_seq`).
    """
    current = alias_target(engine, alias)
    if current is None:
        raise RegistryError(f"alias {alias!r} was never set: nothing to roll back", setting="ALIAS")
    if expected_seq is not None and current.seq != expected_seq:
        raise AliasConflict(
            f"alias {alias!r} changed since change {expected_seq} was judged: change "
            f"{current.seq} by {current.actor} points it at {current.policy}; nothing rolled "
            "back. Judge the new target",
            setting="ALIAS",
        )
    if current.previous_checkpoint_id is None:
        raise RegistryError(
            f"alias {alias!r} has no earlier checkpoint to roll back to (its first target, "
            f"{current.policy}, is current)",
            setting="ALIAS",
        )
    return _write(
        engine,
        alias,
        current,
        checkpoint_id=current.previous_checkpoint_id,
        action="rollback",
        reason=reason,
        evidence={
            **(evidence or {}),
            "rolled_back_from": str(current.checkpoint_id),
            "from_seq": current.seq,
        },
        actor=actor,
    )


def _check_compatible(
    engine: Engine, store: ObjectStore, alias: str, current: uuid.UUID, new: uuid.UUID
) -> None:
    """Refuse a checkpoint whose deployment differs from the current target's."""
    was, now = (load_training_config(engine, store, c) for c in (current, new))
    differences = []
    if was.protocol_version != now.protocol_version:
        differences.append(f"protocol {now.protocol_version} (the alias's: {was.protocol_version})")
    if {t.name for t in was.tools} != {t.name for t in now.tools}:
        differences.append(
            f"tools {sorted(t.name for t in now.tools)} (the alias's: "
            f"{sorted(t.name for t in was.tools)})"
        )
    if was.prompt_style != now.prompt_style:
        differences.append(
            f"prompt style {now.prompt_style.value} (the alias's: {was.prompt_style.value})"
        )
    if differences:
        raise PromotionRefused(
            f"alias {alias!r}: checkpoint {new} is deployed differently from the current "
            f"{current}: {'; '.join(differences)}",
            setting="CHECKPOINT",
        )


def _write(
    engine: Engine,
    alias: str,
    current: AliasTarget | None,
    *,
    checkpoint_id: uuid.UUID,
    action: str,
    reason: str,
    evidence: dict[str, Any],
    actor: str,
) -> AliasTarget:
    row = ModelAliasChange(
        alias=alias,
        seq=(current.seq if current is not None else 0) + 1,
        action=action,
        checkpoint_id=checkpoint_id,
        previous_checkpoint_id=current.checkpoint_id if current is not None else None,
        reason=reason,
        evidence=evidence,
        actor=actor,
    )
    with Session(engine) as session:
        session.add(row)
        try:
            session.commit()
        except IntegrityError as e:
            session.rollback()
            winner = alias_target(engine, alias)
            raise AliasConflict(
                f"alias {alias!r} changed meanwhile: change {row.seq} was written by "
                f"{winner.actor if winner else 'another process'}"
                + (f" (it points at {winner.policy})" if winner else "")
                + "; nothing written. Decide again against the current target",
                setting="ALIAS",
            ) from e
        session.refresh(row)
        return AliasTarget.from_row(row)
