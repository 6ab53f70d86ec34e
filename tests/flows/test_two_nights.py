"""Two nights of the chain on a real Prefect server (issue 45, first "Done when" item):
the model that wins one night's evaluation collects the next night, and a weaker
challenger stays out.

The flows run in this process against a real `prefect server` (its API: flow runs, task
runs, logs, artifacts, what an operator sees in the UI), with the nightly champion
deployment's request (`hf:alias/champion`, `alias_fallback`) and PostgreSQL, nsjail, the
tiny local model and TRL for real:

- **Night 1.** The champion's night, the alias unset and no model registered yet, collects
  with its fallback (`scripted:oracle`); the gate triggers training (the first base model
  built locally, challenger A trained from it, 2 steps); the `evaluate` flow compares A
  with that base on the held-out tasks and the rule (`training.promotion`, never
  overridden) promotes A: `champion` → A, one history row with the figures.
- **Night 2.** The champion's night collects with A (`hf:alias/champion` resolved when
  the collection opens: its episodes carry `hf:checkpoint/<A>`), gated without training;
  the exploration night (`scripted:oracle`) is gated with the inline trigger, trains
  challenger B on the window of both gates and evaluates it against the champion A
  (`evaluation.promote_alias`, the chain's own stage): B is kept out, the reason stored with
  its evaluation, the alias unchanged.

What is forced, and why: the tiny model solves nothing in two training steps, so A's
held-out evaluation run (`eval-<A>`) is played beforehand by `scripted:oracle` standing in
for a model that learned the tasks (`tests.flows.forced_evaluation`, as
tests/flows/test_promotion_flow.py does); A's id exists only once night 1 has trained,
so night 1's evaluation runs as its own `evaluate` flow run (the `evaluate` deployment's
flow) after the stand-in, instead of inside the train flow run. Every other evaluation is
the model's own play: the base's and B's (4 new tokens per turn: B is deliberately
weakened by its token budget and completes nothing). Budgets are steps and tokens, never
seconds.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from collection.request import CollectRequest
from storage.objects import LocalObjectStore
from tests.flows.forced_evaluation import forced_evaluation
from tests.services.chromium import live_page_dom, require_chromium, run_chromium
from tests.services.prefect_server import PrefectServer

pytestmark = pytest.mark.slow

TEMPLATES = ["csv_to_json", "dir_tree"]
INSTANCES = 2
"""Held-out instances per template: 4 task pairs, so 4 wins of 4 give p = 1/16 ≤ alpha."""
TRAIN_STEPS = 2


@pytest.fixture(scope="module")
def prefect_server() -> Iterator[PrefectServer]:
    server = PrefectServer()
    server.start(timeout=240)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def on_server(prefect_server: PrefectServer) -> Iterator[str]:
    """Flows of this test report to the real server (not Prefect's ephemeral API)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_server.api_url}):
        yield prefect_server.api_url
        # The runs' last logs and events reach the server before it stops.
        APILogWorker.drain_all(timeout=60)
        EventsWorker.drain_all(timeout=60)


def _evaluation(**overrides: Any) -> Any:
    from flows.deployments import CHAMPION_ALIAS
    from flows.evaluate import EvaluationOptions
    from training.promotion import PromotionRule

    options: dict[str, Any] = {
        "instances": INSTANCES,
        "templates": TEMPLATES,
        "max_steps": 2,
        "max_new_tokens": 4,
        "promote_alias": CHAMPION_ALIAS,
        # The rule's defaults but for the fewest pairs (the nightly's 13 would take minutes).
        "promotion": PromotionRule(min_pairs=len(TEMPLATES) * INSTANCES),
    }
    return EvaluationOptions.model_validate(options | overrides)


def _night(run_key: str, policy: str, *, trains: bool, evaluation: Any = None) -> Any:
    """One collection of the nightly chain: collect (the champion's alias resolved, with the
    champion deployment's fallback), gate, and with `trains` the inline training trigger."""
    from flows.collect import collect_episodes
    from flows.qc import GateOptions

    request = CollectRequest(
        run_key=run_key, policy=policy, tasks=2, rollouts=1, concurrency=4, templates=TEMPLATES
    )
    gate = (
        GateOptions(
            trigger="inline",
            training_threshold=1.0,
            train_max_steps=TRAIN_STEPS,
            evaluation=evaluation,
        )
        if trains
        else GateOptions(trigger="none")
    )
    return asyncio.run(
        collect_episodes(
            request=request, gate=True, gate_options=gate, alias_fallback="scripted:oracle"
        )
    )


async def _server_view(api_url: str) -> tuple[dict[str, list[str]], list[str], str]:
    """Per flow, the states of its runs; the `promotion-champion` artifact's versions,
    oldest first: what the UI lists; and the latest version's id (its page in the UI)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    async with get_client() as client:
        assert str(client.api_url).rstrip("/") == api_url  # the real server, not a harness
        flows = {f.id: f.name for f in await client.read_flows()}
        states: dict[str, list[str]] = {}
        for run in await client.read_flow_runs():
            states.setdefault(flows[run.flow_id], []).append(str(run.state_name))
        versions = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["promotion-champion"])),
            sort=ArtifactSort.CREATED_DESC,
        )
    return states, [str(a.data) for a in reversed(versions)], str(versions[0].id)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_two_nights_promote_the_winner_who_collects_the_next_night_and_keep_out_a_weaker(
    on_server: str,
    gated_env: tuple[Engine, LocalObjectStore],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from flows.deployments import CHAMPION_ALIAS, NIGHTLY_CHAMPION_REQUEST
    from flows.evaluate import EvaluationResult, evaluate
    from training.aliases import alias_history, alias_target
    from training.registry import get_checkpoint

    engine, _ = gated_env
    # The champion's collection turns: 4 new tokens each, too few for a whole tool call,
    # so its episodes stay a few turns long (the scripted policies ignore the setting).
    monkeypatch.setenv("EPIFLOW_AGENT_POLICY_MAX_TOKENS", "4")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    champion_spec = NIGHTLY_CHAMPION_REQUEST["policy"]
    assert champion_spec == f"hf:alias/{CHAMPION_ALIAS}"

    # Night 1: the champion's night before any promotion, then gate → train (A).
    first = _night("night-1", champion_spec, trains=True, evaluation=_evaluation(instances=0))
    assert first.qc is not None and first.qc.training is not None
    trained = first.qc.training.result
    assert trained is not None and trained.steps == TRAIN_STEPS and trained.evaluation is None
    a, base = trained.checkpoint_id, trained.base_checkpoint_id
    # → evaluate: A (its stand-in, see the module docstring) against the base (its own play).
    assert forced_evaluation(a, "scripted:oracle", instances=INSTANCES, templates=TEMPLATES) == 4
    options = _evaluation()
    judged = asyncio.run(
        evaluate(
            checkpoint=str(a),
            instances=options.instances,
            templates=options.templates,
            max_steps=options.max_steps,
            max_new_tokens=options.max_new_tokens,
            promote_alias=options.promote_alias,
            promotion=options.promotion,
        )
    )
    assert isinstance(judged, EvaluationResult) and judged.promotion is not None
    promoted = judged.promotion
    assert (promoted.promoted, promoted.role, promoted.compared_with, promoted.seq) == (
        True, "base", base, 1,
    )  # fmt: skip
    assert promoted.reason.startswith("promoted: completion 1.000 vs 0.000 on 4 tasks")
    champion = alias_target(engine, CHAMPION_ALIAS)
    assert champion is not None and champion.checkpoint_id == a
    assert champion.evidence["discordant_wins"] == 4 and champion.evidence["p_value"] == 0.0625
    assert champion.evidence["compared_with"] == str(base)

    # Night 2: the champion (A) collects; the exploration night trains B, which is
    # evaluated against A inside the train flow run and kept out.
    on_policy = _night("night-2-champion", champion_spec, trains=False)
    assert on_policy.episodes == len(TEMPLATES) * 2
    exploring = _night("night-2-explore", "scripted:oracle", trains=True, evaluation=_evaluation())
    assert exploring.qc is not None and exploring.qc.training is not None
    second = exploring.qc.training.result
    assert second is not None
    b = second.checkpoint_id
    assert b not in (a, base) and second.base_checkpoint_id == base
    assert on_policy.qc is not None and on_policy.qc.triggered_training is False
    # B is trained on the window of both of the night's gates.
    assert set(exploring.qc.training_qc_runs) == {on_policy.qc.qc_run_id, exploring.qc.qc_run_id}
    assert second.evaluation is not None and second.evaluation.promotion is not None
    kept = second.evaluation.promotion
    assert (kept.promoted, kept.role, kept.compared_with, kept.seq) == (
        False, "champion", a, None,
    )  # fmt: skip
    assert kept.reason.startswith("kept the champion: gain -1.000 below the margin 0.05")
    after = alias_target(engine, CHAMPION_ALIAS)
    assert after is not None and after.checkpoint_id == a and after.seq == 1
    assert [c.checkpoint_id for c in alias_history(engine, CHAMPION_ALIAS)] == [a]
    assert get_checkpoint(engine, b).evaluation["promotion"]["reason"] == kept.reason

    with engine.connect() as conn:
        collected = conn.execute(
            text(
                "SELECT r.run_key, r.policy_id, e.policy_id, COUNT(*) FROM episode e"
                " JOIN collection_run r ON r.id = e.run_id"
                " WHERE r.run_key LIKE 'night-%'"
                " GROUP BY r.run_key, r.policy_id, e.policy_id ORDER BY r.run_key"
            )
        ).all()
        history = conn.execute(
            text(
                "SELECT seq, checkpoint_id, reason FROM model_history"
                " WHERE alias = :alias ORDER BY seq"
            ),
            {"alias": CHAMPION_ALIAS},
        ).all()
        running = conn.execute(
            text(
                "SELECT (SELECT COUNT(*) FROM collection_run WHERE status = 'running')"
                " + (SELECT COUNT(*) FROM training_run WHERE status = 'running')"
            )
        ).scalar_one()
    # Night 1 by the fallback, night 2 by the champion A (the run row keeps the alias, each
    # episode the checkpoint that played it), the exploration night by the oracle.
    assert [tuple(r) for r in collected] == [
        ("night-1", "scripted:oracle", "scripted:oracle", 4),
        ("night-2-champion", champion_spec, f"hf:checkpoint/{a}", 4),
        ("night-2-explore", "scripted:oracle", "scripted:oracle", 4),
    ]
    assert [(r[0], uuid.UUID(str(r[1])), r[2]) for r in history] == [(1, a, promoted.reason)]
    assert running == 0

    # What the UI shows: every flow run of both nights completed, and the promotion
    # artifact's two versions (A promoted, B not).
    states, shown, latest = asyncio.run(_server_view(on_server))
    assert {name: sorted(s) for name, s in states.items()} == {
        "collect-episodes": ["Completed"] * 3,
        "qc-gate": ["Completed"] * 3,
        "train": ["Completed"] * 2,
        "evaluate": ["Completed"] * 2,
    }
    assert len(shown) == 2 and "not promoted" not in shown[0] and "promoted" in shown[0]
    assert "not promoted" in shown[1] and "kept the champion" in shown[1]

    # The same in the browser (when Chromium is installed): the promotion artifact's page
    # shows the latest decision, the flow runs page the chain; screenshots are kept under
    # EPIFLOW_SCREENSHOT_DIR (docs/img/ has the ones docs/models.md shows).
    _ui_pages(on_server.removesuffix("/api"), latest, tmp_path)


def _ui_pages(ui: str, latest: str, tmp_path: Path) -> None:
    chromium = require_chromium("the promotion artifact's page")
    shots = Path(os.environ.get("EPIFLOW_SCREENSHOT_DIR", tmp_path))
    artifact = f"{ui}/artifacts/artifact/{latest}"
    dom = live_page_dom(chromium, artifact, showing=["kept the champion"])
    assert "kept the champion" in dom, dom[-2000:]
    run_chromium(
        chromium,
        "--window-size=1400,1400",
        f"--screenshot={shots / 'prefect-promotion-artifact.png'}",
        artifact,
        budget_ms=30000,
    )
    runs = f"{ui}/runs"
    names = ("night-1", "qc-night-1", "night-2-champion", "qc-night-2-explore")
    dom = live_page_dom(chromium, runs, showing=[f">{name}<" for name in names])
    for name in names:
        assert f">{name}<" in dom, (name, dom[-2000:])
    run_chromium(
        chromium,
        "--window-size=1400,1600",
        f"--screenshot={shots / 'prefect-two-nights-runs.png'}",
        runs,
        budget_ms=30000,
    )
