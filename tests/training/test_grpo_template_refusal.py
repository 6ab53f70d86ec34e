"""`epiflow train --algo grpo` refuses a base whose chat template cannot render protocol v1
(none at all; one that drops the system role) in one line with exit 2, before it opens a
training run or a rollout collection run, so no jail starts. A real `epiflow`
subprocess, the shared Prefect test server, SQLite, the tiny local base model."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from agent.trajectory import episode_id_for
from models import CollectionRun, TrainingRun, run_id_for
from sandbox.tool_specs import BUILTIN_TOOLS
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from suites.builtin import builtin_suite
from tests.cli.local import EPIFLOW, epiflow, one_error_line
from tests.training.factory import episode
from tests.training.test_chat_templates import DROPS_SYSTEM
from training.registry import register_base_model
from training.settings import TrainingSettings
from training.snapshots import build_snapshot
from training.training_config import build_training_config

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow(reason=f"runs {EPIFLOW} train --algo grpo as a subprocess")


def _base_with_template(
    engine: Engine, store: LocalObjectStore, source: Path, dest: Path, template: str | None
) -> uuid.UUID:
    """The tiny base with `template` as its chat template (None: none), registered."""
    from transformers import AutoTokenizer

    shutil.copytree(source, dest)
    for saved in dest.glob("chat_template.*"):
        saved.unlink()
    tokenizer = AutoTokenizer.from_pretrained(dest)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(dest)
    assert AutoTokenizer.from_pretrained(dest).chat_template == template
    config = build_training_config(
        dest, tools=list(BUILTIN_TOOLS.values()), settings=TrainingSettings()
    )
    return register_base_model(engine, store, dest, config=config)


def _rows(engine: Engine, table: type) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_a_base_that_cannot_render_the_protocol_is_refused_in_one_line(
    tiny_base_model: Path,
    engine: Engine,
    store: LocalObjectStore,
    prefect_api_url: str,
    tmp_path: Path,
) -> None:
    tasks = builtin_suite().instances(1, templates=["dir_tree"])
    collected = []
    for i, task in enumerate(tasks):
        t = episode(task=i, template=task.template)
        collected.append(
            t.model_copy(
                update={
                    "task_id": task.task_id,
                    "instance_seed": task.seed,
                    "episode_id": episode_id_for(t.run_key, task.task_id, 0),
                }
            )
        )
    persist_episodes(engine, store, collected)
    snapshot = build_snapshot(engine, store, kind="grpo", run_ids=[run_id_for("train-run")])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPIFLOW_", "PREFECT_API"))}
    env.update(
        PYTHONPATH=str(ROOT),
        TMPDIR=str(tmp_path),
        EPIFLOW_HOME=str(tmp_path / "home"),
        EPIFLOW_DATABASE_URL=engine.url.render_as_string(hide_password=False),
        EPIFLOW_OBJECTS_URL=str(store.root),
        EPIFLOW_PREFECT_API_URL=prefect_api_url,
    )
    runs_before = _rows(engine, CollectionRun)

    for name, template, problem in (
        ("none", None, "its chat template is missing (the tokenizer has no chat_template)"),
        ("no-system", DROPS_SYSTEM, "its chat template drops the system message"),
    ):
        base = _base_with_template(
            engine, store, tiny_base_model, tmp_path / f"base-{name}", template
        )
        result = epiflow(
            env,
            "train",
            "--algo",
            "grpo",
            "--dataset",
            str(snapshot.id),
            "--base-checkpoint",
            str(base),
            cwd=tmp_path,
        )
        line = one_error_line(result)
        assert f"checkpoint {base} cannot train with agentic GRPO: {problem}" in line, line
        assert "--base-checkpoint" in line, line
        # Refused before anything opened: no training run, no rollout run, so no jail.
        assert _rows(engine, TrainingRun) == 0
        assert _rows(engine, CollectionRun) == runs_before
