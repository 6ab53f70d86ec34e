"""Model aliases (`training.aliases`): every change a row, rollback to the previous
target, refusals that write nothing, and two promotions racing on one alias (exactly one
wins). SQLite and PostgreSQL (`migrated_engine`), a local object store for the configs."""

from __future__ import annotations

import tempfile
import threading
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlmodel import Session

from agent.prompt import PromptStyle
from models import Checkpoint
from sandbox.tool_specs import BUILTIN_TOOLS
from storage.objects import LocalObjectStore
from training.aliases import (
    AliasConflict,
    PromotionRefused,
    alias_history,
    alias_target,
    list_aliases,
    point_alias,
    rollback_alias,
)
from training.errors import RegistryError
from training.settings import TrainingSettings
from training.training_config import TokenizerInfo, TrainingConfig


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    s = LocalObjectStore(tmp_path / "objects")
    s.check()
    return s


def _checkpoint(
    engine: Engine,
    store: LocalObjectStore,
    *,
    tools: list[str] | None = None,
    style: PromptStyle = PromptStyle.COMPACT,
) -> uuid.UUID:
    """A checkpoint row with a stored training config (no weights: not needed here)."""
    checkpoint_id = uuid.uuid4()
    config = TrainingConfig(
        protocol_version="1",
        tools=[BUILTIN_TOOLS[n] for n in (tools or ["read_file", "write_file"])],
        prompt_style=style,
        system_prompt="s",
        system_prompt_sha256="0" * 64,
        chat_template=None,
        tokenizer=TokenizerInfo(
            tokenizer_class="t", vocab_size=1, eos_token=None, pad_token=None,
            chat_template_sha256=None,
        ),
        algo="sft",
        base_model=None,
        dataset_id=None,
    )  # fmt: skip
    key = f"checkpoints/{checkpoint_id}/training_config.json"
    store.put(key, config.model_dump_json().encode())
    with Session(engine) as session:
        session.add(
            Checkpoint(
                id=checkpoint_id, object_prefix=f"checkpoints/{checkpoint_id}/", config_key=key
            )
        )
        session.commit()
    return checkpoint_id


def test_promotions_and_a_rollback_are_rows_with_their_reasons(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    base, a = _checkpoint(migrated_engine, store), _checkpoint(migrated_engine, store)
    assert alias_target(migrated_engine, "champion") is None
    point_alias(
        migrated_engine,
        store,
        "champion",
        base,
        reason="first night: the base",
        actor="t",
        action="set",
    )
    promoted = point_alias(
        migrated_engine, store, "champion", a, reason="promoted: 0.8 vs 0.2", actor="flow",
        evidence={"p_value": 0.01},
    )  # fmt: skip
    assert (promoted.seq, promoted.previous_checkpoint_id, promoted.policy) == (
        2, base, f"hf:checkpoint/{a}",
    )  # fmt: skip
    back = rollback_alias(migrated_engine, store, "champion", reason="monitor breach", actor="m")
    assert (back.checkpoint_id, back.action, back.seq) == (base, "rollback", 3)
    assert [c.checkpoint_id for c in alias_history(migrated_engine, "champion")] == [base, a, base]
    assert [t.alias for t in list_aliases(migrated_engine)] == ["champion"]
    with migrated_engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT seq, reason, is_current, valid_to IS NULL FROM model_history "
                "WHERE alias = 'champion' ORDER BY seq"
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        (1, "first night: the base", 0, False),
        (2, "promoted: 0.8 vs 0.2", 0, False),
        (3, "monitor breach", 1, True),
    ]


def test_refusals_write_nothing(migrated_engine: Engine, store: LocalObjectStore) -> None:
    base = _checkpoint(migrated_engine, store)
    with pytest.raises(RegistryError, match="never set"):
        rollback_alias(migrated_engine, store, "champion", reason="r", actor="t")
    with pytest.raises(PromotionRefused, match="no checkpoint"):
        point_alias(migrated_engine, store, "champion", uuid.uuid4(), reason="r", actor="t")
    point_alias(migrated_engine, store, "champion", base, reason="r", actor="t")
    with pytest.raises(RegistryError, match="no earlier checkpoint"):
        rollback_alias(migrated_engine, store, "champion", reason="r", actor="t")
    other_tools = _checkpoint(migrated_engine, store, tools=["read_file"])
    with pytest.raises(PromotionRefused, match="tools"):
        point_alias(migrated_engine, store, "champion", other_tools, reason="r", actor="t")
    other_style = _checkpoint(migrated_engine, store, style=PromptStyle.FULL)
    with pytest.raises(PromotionRefused, match="prompt style"):
        point_alias(migrated_engine, store, "champion", other_style, reason="r", actor="t")
    assert [c.checkpoint_id for c in alias_history(migrated_engine, "champion")] == [base]


def test_two_promotions_racing_on_one_alias_one_wins(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    base = _checkpoint(migrated_engine, store)
    point_alias(migrated_engine, store, "champion", base, reason="r", actor="t")
    decided_against = alias_target(migrated_engine, "champion")
    challengers = [_checkpoint(migrated_engine, store) for _ in range(2)]
    outcomes: list[object] = []
    start = threading.Barrier(2)

    def promote(checkpoint: uuid.UUID) -> None:
        start.wait()
        try:
            outcomes.append(
                point_alias(
                    migrated_engine, store, "champion", checkpoint, reason="r",
                    actor=str(checkpoint), expected=decided_against,
                )
            )  # fmt: skip
        except AliasConflict as e:
            outcomes.append(e)

    threads = [threading.Thread(target=promote, args=(c,)) for c in challengers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conflicts = [o for o in outcomes if isinstance(o, AliasConflict)]
    assert len(outcomes) == 2 and len(conflicts) == 1, outcomes
    assert "changed meanwhile" in str(conflicts[0]) and "nothing written" in str(conflicts[0])
    history = alias_history(migrated_engine, "champion")
    assert len(history) == 2 and history[-1].checkpoint_id in challengers


@pytest.mark.slow
def test_a_collection_runs_the_model_an_alias_names(
    engine: Engine,
    store: LocalObjectStore,
    tiny_base_model: Path,
    tiny_settings: TrainingSettings,
    tmp_path: Path,
) -> None:
    """`--policy hf:alias/champion`: the collection fetches the checkpoint the alias names
    when it opens and labels its episodes with that checkpoint (the alias moves; the
    model that collected must stay known). An alias never set is the request's error,
    before anything is written. Real nsjail, the tiny local model, SQLite."""
    import asyncio
    import dataclasses
    import shutil

    from agent.settings import LoopSettings, PolicySettings
    from collection.errors import RequestError
    from collection.request import CollectRequest
    from collection.runner import collect_in_process
    from config.settings import load_settings
    from training.pretrained import register_pretrained

    model_dir = tmp_path / "base"
    shutil.copytree(tiny_base_model, model_dir)
    checkpoint_id = register_pretrained(engine, store, model_dir, settings=tiny_settings)
    settings = dataclasses.replace(
        load_settings(), policy=PolicySettings(max_tokens=4), loop=LoopSettings(max_steps=1)
    )

    def collect(key: str, policy: str) -> object:
        request = CollectRequest(run_key=key, policy=policy, templates=["dir_tree"])
        return asyncio.run(
            collect_in_process(request, engine=engine, store=store, settings=settings)
        )

    with pytest.raises(RequestError, match="alias 'champion' was never set"):
        collect("before", "hf:alias/champion")
    point_alias(engine, store, "champion", checkpoint_id, reason="the base", actor="t")
    collect("nightly", "hf:alias/champion")
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT run_key, policy_id FROM collection_run")).all()
        policies = conn.execute(text("SELECT DISTINCT policy_id FROM episode")).scalars().all()
    assert [tuple(r) for r in runs] == [("nightly", "hf:alias/champion")]
    assert policies == [f"hf:checkpoint/{checkpoint_id}"]
    assert not list(
        Path(tempfile.gettempdir()).glob("epiflow-policy-*")
    )  # the model's copy is gone
