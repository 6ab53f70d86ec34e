"""`model_alias_change`: every change of a named model alias (`champion`, …), in order.

An alias names the model a user, a server or the next night's collection points at: a
checkpoint, or an external endpoint registered as a policy spec. Nothing is updated in
place: each promotion or rollback is a new row with who, when, why and the evidence
(the evaluation figures that decided it), so the alias's current target is its latest
row and its history is the rows in `seq` order (the `model_history` view). `(alias, seq)`
is unique: of two promotions racing on one alias, exactly one writes `seq` n + 1
(`storage.aliases`).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import UniqueConstraint
from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, text_col, time_col


class ModelAliasChange(SQLModel, table=True):
    """One change of an alias: what it points at from then on, and why."""

    __tablename__ = "model_alias_change"
    __table_args__ = (UniqueConstraint("alias", "seq", name="uq_model_alias_change_seq"),)

    id: int | None = doc("Row id.", default=None, primary_key=True)
    alias: str = doc("The alias's name, e.g. `champion`.", index=True)
    seq: int = doc("Position of this change in the alias's history (1 = first).")
    action: str = doc(
        "`promote` (a new target), `rollback` (back to the previous target) or `set` (by hand)."
    )
    checkpoint_id: uuid.UUID | None = fk(
        "The checkpoint the alias points at from this change on; NULL for an endpoint.",
        "checkpoint.id",
    )
    policy_spec: str | None = doc(
        "The policy spec it points at when not a checkpoint (an external `openai:` endpoint).",
        default=None,
    )
    previous_checkpoint_id: uuid.UUID | None = doc(
        "The checkpoint it pointed at before this change (NULL: none, or an endpoint).",
        default=None,
    )
    reason: str = text_col("Why the alias changed, in one line (the decision's rule and figures).")
    evidence: dict[str, Any] = json_col(
        "What decided it: the evaluation figures compared, the test and its p-value, the "
        "per-template deltas (empty for a change by hand)."
    )
    actor: str = doc("Who changed it: `user@host` of a command, or the flow run that decided.")
    changed_at: datetime = time_col("When it changed (UTC).", index=True)
