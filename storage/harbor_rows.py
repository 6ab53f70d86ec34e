"""Rows of `harbor_episode` and `harbor_test` from trajectories of Harbor tasks.

`persist_episodes` writes them right after the episodes' own batch committed, for the
episodes that batch inserted (a re-run that skips stored episodes writes nothing again).
Pure row building (`harbor_rows`) is apart from the SQL (`write_harbor_rows`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Engine, insert

from agent.trajectory import Trajectory
from models import HarborEpisode, HarborTest


def harbor_details(t: Trajectory) -> dict[str, Any] | None:
    details = (t.verifier_details or {}).get("harbor")
    return details if isinstance(details, dict) else None


def harbor_rows(
    trajectories: Iterable[Trajectory],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(`harbor_episode` rows, `harbor_test` rows) of the trajectories of Harbor tasks."""
    episodes: list[dict[str, Any]] = []
    tests: list[dict[str, Any]] = []
    for t in trajectories:
        info = harbor_details(t)
        if info is None:
            continue
        meta = info.get("metadata") or {}
        results = [r for r in info.get("tests") or [] if isinstance(r, dict)]
        episodes.append(
            {
                "episode_id": t.episode_id,
                "task_name": str(meta.get("task", t.template)),
                "task_version": str(meta.get("version", "")),
                "content_hash": str(meta.get("content_hash", "")),
                "difficulty": str(meta.get("difficulty", "")),
                "category": str(meta.get("category", "")),
                "tags": [str(tag) for tag in meta.get("tags") or []],
                "image_digest": str(info.get("image", "")),
                "substitutions": [str(s) for s in info.get("substitutions") or []],
                "reward": dict(info.get("reward") or {}),
                "reward_source": str(info.get("reward_source", "")),
                "test_sh_exit_code": info.get("test_sh_exit_code"),
                "tests_total": len(results),
                "tests_passed": sum(1 for r in results if r.get("status") == "passed"),
                "build_s": float(info.get("build_s") or 0.0),
                "verify_s": info.get("verify_s"),
            }
        )
        tests += [
            {
                "episode_id": t.episode_id,
                "index": i,
                "name": str(r.get("name", "")),
                "status": str(r.get("status", "other")),
                "duration_ms": r.get("duration_ms"),
                "message": str(r.get("message", "")),
            }
            for i, r in enumerate(results)
        ]
    return episodes, tests


def write_harbor_rows(
    engine: Engine, trajectories: Sequence[Trajectory], inserted: Iterable[uuid.UUID]
) -> None:
    """Insert the Harbor rows of the `inserted` episodes among `trajectories` (one transaction)."""
    new = set(inserted)
    episodes, tests = harbor_rows(t for t in trajectories if t.episode_id in new)
    if not episodes:
        return
    with engine.begin() as conn:
        conn.execute(insert(HarborEpisode.__table__), episodes)  # type: ignore[attr-defined]
        if tests:
            conn.execute(insert(HarborTest.__table__), tests)  # type: ignore[attr-defined]
