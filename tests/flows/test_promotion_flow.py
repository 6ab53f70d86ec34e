"""Promotion decided by evaluation (issue 45 item 2), through the real `evaluate` flow on
Prefect's test harness: a challenger that clearly beats the base is promoted onto the
unset alias `champion` (a `model_alias_change` row with the figures); a weaker one is
compared with the champion — not with its own base — and kept, the reason stored with its
evaluation; the decision is logged, returned and shown as the `promotion-champion`
artifact.

"Clearly better" is forced, because the tiny local model solves nothing in a few steps:
each checkpoint's held-out evaluation run is stored beforehand by a scripted stand-in
(`tests.flows.forced_evaluation`): `scripted:oracle` for the strong checkpoint,
`scripted:idle` for the weak ones. The flow then resumes those runs and decides on them.
Everything else is real: the checkpoints (the tiny model, registered), SQL, the object
store, the flow, its tasks and artifacts.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from storage.objects import LocalObjectStore
from tests.flows.forced_evaluation import forced_evaluation
from training.settings import TrainingSettings

TEMPLATES = ["csv_to_json", "dir_tree"]
INSTANCES = 2  # × 2 templates = 4 task pairs: 4 wins of 4 give p = 1/16 ≤ alpha 0.1
MAX_STEPS = 2


def _tiny_checkpoints(
    engine: Engine, store: LocalObjectStore, work: Path
) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """A base checkpoint (the tiny model, built locally) and two challengers trained from
    it (the same weights: their evaluations are forced, see the module docstring)."""
    from suites.builtin import builtin_suite
    from tests.training.factory import episode
    from training.base_model import build_base_model, protocol_corpus
    from training.pretrained import register_pretrained
    from training.registry import load_training_config, save_checkpoint

    settings = TrainingSettings(
        vocab_size=4096, max_length=1024, max_position_embeddings=1024, max_steps=2
    )
    corpus = protocol_corpus(builtin_suite().instances(1), [episode(task=i) for i in range(3)])
    model_dir = build_base_model(work / "model", corpus, settings=settings)
    base = register_pretrained(engine, store, model_dir, settings=settings)
    config = load_training_config(engine, store, base)
    challengers = [
        save_checkpoint(
            engine,
            store,
            training_run_id=None,
            model_dir=model_dir,
            config=config,
            parent_checkpoint_id=base,
        )
        for _ in range(2)
    ]
    return base, challengers[0], challengers[1]


def _forced_evaluation(checkpoint_id: uuid.UUID, policy: str) -> None:
    """Store checkpoint `checkpoint_id`'s held-out evaluation run as `policy` plays it."""
    stored = forced_evaluation(checkpoint_id, policy, instances=INSTANCES, templates=TEMPLATES)
    assert stored == len(TEMPLATES) * INSTANCES


def _evaluate(checkpoint_id: uuid.UUID) -> object:
    from flows.evaluate import evaluate
    from training.promotion import PromotionRule

    return asyncio.run(
        evaluate(
            checkpoint=str(checkpoint_id),
            instances=INSTANCES,
            templates=TEMPLATES,
            max_steps=MAX_STEPS,
            max_new_tokens=4,
            promote_alias="champion",
            promotion=PromotionRule(min_pairs=len(TEMPLATES) * INSTANCES),
        )
    )


async def _artifact(key: str) -> str:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        found = await client.read_latest_artifacts()
    return next(str(a.data) for a in found if a.key == key)


@pytest.mark.slow
def test_evaluation_promotes_a_better_challenger_and_keeps_the_champion_against_a_weaker(
    prefect_harness: None,
    gated_env: tuple[Engine, LocalObjectStore],
    tmp_path: Path,
) -> None:
    from flows.evaluate import EvaluationResult
    from training.aliases import alias_history, alias_target
    from training.registry import get_checkpoint

    engine, store = gated_env
    base, strong, weak = _tiny_checkpoints(engine, store, tmp_path)
    _forced_evaluation(base, "scripted:idle")
    _forced_evaluation(strong, "scripted:oracle")
    _forced_evaluation(weak, "scripted:idle")

    # Night 1: the alias is unset, so the challenger must beat the base it was trained from.
    first = _evaluate(strong)
    assert isinstance(first, EvaluationResult) and first.promotion is not None
    assert first.previous_checkpoint_id == base
    outcome = first.promotion
    assert (outcome.promoted, outcome.role, outcome.compared_with, outcome.seq) == (
        True, "base", base, 1,
    )  # fmt: skip
    assert outcome.reason.startswith("promoted: completion 1.000 vs 0.000 on 4 tasks")
    champion = alias_target(engine, "champion")
    assert champion is not None and champion.checkpoint_id == strong
    assert (champion.action, champion.reason) == ("promote", outcome.reason)
    assert champion.evidence["p_value"] == 0.0625 and champion.evidence["discordant_wins"] == 4
    assert champion.evidence["compared_with"] == str(base)
    assert champion.actor == f"evaluate flow run {first.flow_run_id}"
    stored = get_checkpoint(engine, strong).evaluation["promotion"]
    assert stored["promoted"] is True and stored["seq"] == 1
    assert "promoted" in asyncio.run(_artifact("promotion-champion"))

    # Night 2: a weaker challenger is compared with the champion (not its own base, which
    # it would tie) and kept; the reason is stored with its evaluation, the alias unchanged.
    second = _evaluate(weak)
    assert isinstance(second, EvaluationResult) and second.promotion is not None
    assert second.previous_checkpoint_id == strong
    kept = second.promotion
    assert (kept.promoted, kept.role, kept.compared_with, kept.seq) == (
        False, "champion", strong, None,
    )  # fmt: skip
    assert kept.reason.startswith("kept the champion: gain -1.000 below the margin 0.05")
    assert "p=1 above alpha" in kept.reason
    stored = get_checkpoint(engine, weak).evaluation["promotion"]
    assert (stored["promoted"], stored["reason"]) == (False, kept.reason)
    assert stored["evidence"]["champion_completion"] == 1.0
    assert [c.checkpoint_id for c in alias_history(engine, "champion")] == [strong]
    shown = asyncio.run(_artifact("promotion-champion"))
    assert "not promoted" in shown and "kept the champion" in shown

    with engine.connect() as conn:
        runs = conn.execute(
            text("SELECT run_key, status FROM collection_run ORDER BY run_key")
        ).all()
        history = conn.execute(
            text("SELECT seq, reason FROM model_history WHERE alias = 'champion'")
        ).all()
    # One evaluation run per checkpoint (the champion's is resumed on night 2), each ended.
    assert sorted(tuple(r) for r in runs) == sorted(
        (f"eval-{c}", "completed") for c in (base, strong, weak)
    )
    assert [tuple(r) for r in history] == [(1, outcome.reason)]
