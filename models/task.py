"""`task`: one generated task instance (template + seed + version) that episodes work on."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import SQLModel

from models.columns import doc, text_col, time_col


class Task(SQLModel, table=True):
    """A task instance. Its id is stable across runs: suite/template@version#seed-hash."""

    __tablename__ = "task"

    id: str = doc("Stable task id: suite/template@version#seed-contenthash.", primary_key=True)
    suite: str = doc("Suite the task belongs to.", index=True)
    suite_version: str = doc("Version of the suite.")
    template: str = doc("Template that generated the instance.", index=True)
    template_version: str = doc("Version of the template.")
    seed: int = doc("Seed the instance was generated from.")
    difficulty: int | None = doc(
        "Difficulty 1 (2-step chore) … 5 (15-step job with traps).", default=None
    )
    prompt: str = text_col("The task as the agent sees it.")
    created_at: datetime = time_col(
        "Start time of the episode whose ingest created the row (UTC); not when it was written."
    )
