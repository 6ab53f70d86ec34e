"""The champion's night (issue 45 item 3) through the real collect flow: a request naming
its policy by alias (`hf:alias/champion`) collects, before any promotion, with the
fallback the nightly deployment gives it (no base model registered here: the scripted
policy), under the alias's run key; without a fallback an unset alias is the request's
error and nothing is written. (With the alias set, the collection runs the checkpoint it
names: tests/training/test_aliases.py, `test_a_collection_runs_the_model_an_alias_names`;
the resolution of all three cases: tests/training/test_champion.py.)"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Engine, text

from collection.errors import RequestError
from collection.request import CollectRequest
from storage.objects import LocalObjectStore


def test_an_unset_champion_falls_back_and_keeps_the_alias_run_key(
    prefect_harness: None, gated_env: tuple[Engine, LocalObjectStore]
) -> None:
    from flows.collect import collect_episodes

    engine, _ = gated_env
    request = CollectRequest(
        policy="hf:alias/champion", tasks=1, rollouts=1, concurrency=2, templates=["csv_to_json"]
    )
    with pytest.raises(RequestError, match="alias 'champion' was never set"):
        asyncio.run(collect_episodes(request=request))

    night = asyncio.run(collect_episodes(request=request, alias_fallback="scripted:oracle"))
    assert night.run_key.startswith("builtin-hf-alias-champion-")
    assert (night.episodes, night.success_rate) == (1, 1.0)
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT run_key, policy_id, status FROM collection_run")).all()
        policies = conn.execute(text("SELECT DISTINCT policy_id FROM episode")).scalars().all()
    assert [tuple(r) for r in runs] == [(night.run_key, "scripted:oracle", "completed")]
    assert policies == ["scripted:oracle"]
