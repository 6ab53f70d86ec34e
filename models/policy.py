"""`policy`: who produced the assistant turns (scripted, an endpoint, a local checkpoint)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, time_col


class Policy(SQLModel, table=True):
    """A policy, identified by its spec string (e.g. `scripted:oracle`, `hf:/ckpt`)."""

    __tablename__ = "policy"

    id: str = doc(
        "The policy spec string, e.g. `scripted:noisy` or `openai:http://…#model`.",
        primary_key=True,
    )
    kind: str = doc(
        "Policy family: `scripted`, `openai` or `hf` for policies epiflow ran; `atif` for an "
        "imported ATIF agent (id `atif:<agent>@<version>#<model>`); `imported` for imported "
        "OpenAI chat messages.",
        index=True,
    )
    config: dict[str, Any] = json_col(
        "Non-secret configuration of the policy; for an `atif` policy the agent's name, "
        "version and model."
    )
    checkpoint_id: uuid.UUID | None = fk(
        "The epiflow checkpoint an `hf:` policy runs, when it came from training.", "checkpoint.id"
    )
    created_at: datetime = time_col(
        "Start time of the episode whose ingest created the row (UTC); not when it was written."
    )
