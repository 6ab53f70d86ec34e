"""A checkpoint served by a real `transformers serve`, collected through `openai:` (issue 22
item 2): the tiny locally built base model, a real server process on a loopback port, real
sandboxes and SQLite. The episodes are the model's (it is untrained, so they fail as the
agent's, never as infrastructure), every step carries the server's usage and model name,
and the server is gone once the block exits."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

from sqlalchemy import Engine, text

from agent.serving import serve_checkpoint
from agent.settings import LoopSettings, PolicySettings
from collection.request import CollectRequest
from collection.runner import collect_in_process
from config.settings import load_settings
from storage.objects import LocalObjectStore


def test_collect_through_transformers_serve(
    tiny_base_model: Path, engine: Engine, store: LocalObjectStore, tmp_path: Path
) -> None:
    # Few tokens, two turns per episode: the server and the path are under test, not the
    # untrained model's answers.
    settings = dataclasses.replace(
        load_settings(),
        policy=PolicySettings(max_tokens=8, request_timeout_s=300),
        loop=LoopSettings(max_steps=2),
    )
    with serve_checkpoint(tiny_base_model, log_path=tmp_path / "serve.log") as served:
        request = CollectRequest(
            run_key="served",
            policy=served.policy_spec,
            tasks=1,
            concurrency=2,
            templates=["csv_to_json", "dir_tree"],
        )
        result = asyncio.run(
            collect_in_process(request, engine=engine, store=store, settings=settings)
        )
        pid = served.pid
    assert result.episodes == 2
    assert not {"endpoint_error", "policy_error", "env_error"} & set(result.by_status)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT completion_tokens, prompt_tokens, response_model FROM step")
        ).all()
    assert rows
    assert all(c and p and m == str(tiny_base_model.resolve()) for c, p, m in rows)
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, "transformers serve outlived serve_checkpoint"
    assert "Uvicorn running" in (tmp_path / "serve.log").read_text()
