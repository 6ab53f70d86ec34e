"""The `qc-gate` flow on real collections: rows, docs, artifact, broken-sandbox batches."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from collection.request import CollectRequest
from collection.runner import collect_in_process
from storage.objects import LocalObjectStore

TEMPLATES = ["csv_to_json", "dir_tree", "log_errors", "config_update"]


def collect(
    engine: Engine, store: LocalObjectStore, run_key: str, policy: str, tasks: int = 2
) -> None:
    request = CollectRequest(
        run_key=run_key, policy=policy, tasks=tasks, concurrency=4, templates=TEMPLATES
    )
    asyncio.run(collect_in_process(request, engine=engine, store=store))


def test_gate_writes_verdicts_docs_and_triggers_once(prefect_harness: None, gated_env) -> None:
    from flows.qc import qc_gate

    engine, store = gated_env
    collect(
        engine,
        store,
        "qc-noisy",
        "scripted:noisy?malformed=0.3&fabricated_claim=0.2&repeated_command=0.2",
        tasks=3,
    )
    first = asyncio.run(qc_gate(run="qc-noisy", trigger="none", training_threshold=1.0))
    assert first.episodes == 12 and first.batch_passed
    assert first.keep + first.downweight + first.discard == 12
    assert first.downweight > 0  # the noisy policy's perturbations cost weight
    assert first.mean_quality is not None and 0.0 < first.mean_quality <= 1.0
    assert first.docs_key and store.exists(first.docs_key)
    # The data docs as a link artifact and the report, keyed by the run key (stable).
    from prefect.client.orchestration import get_client

    async def artifacts() -> dict[str, tuple[str, Any]]:
        async with get_client() as client:
            latest = await client.read_latest_artifacts()  # the newest version of each key
            return {a.key or "": (a.type or "", a.data) for a in latest}

    found = asyncio.run(artifacts())
    # (Prefect stores a link artifact as a markdown link.)
    url = (store.root / first.docs_key).resolve().as_uri()
    assert found["qc-docs-qc-noisy"] == ("markdown", f"[Great Expectations data docs]({url})")
    assert found["qc-qc-noisy"][0] == "markdown"
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT verdict, quality_score FROM qc_result")).all()
        judged = conn.execute(
            text("SELECT COUNT(*) FROM judgement WHERE judge = 'rule'")
        ).scalar_one()
        by_suite = conn.execute(
            text("SELECT episodes, keep, downweight, discard FROM quality_by_suite")
        ).one()
        summary = conn.execute(
            text("SELECT COUNT(*) FROM episode_summary WHERE qc_verdict IS NOT NULL")
        ).scalar_one()
    assert len(rows) == 12 and judged == 12 and summary == 12
    assert tuple(by_suite) == (12, first.keep, first.downweight, first.discard)
    # trigger="none" records the decision without launching anything
    assert first.triggered_training is False


def test_broken_sandbox_fails_the_batch(
    prefect_harness: None, gated_env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flows.qc import qc_gate

    engine, store = gated_env
    monkeypatch.setenv("EPIFLOW_SANDBOX_NSJAIL_PATH", str(tmp_path / "no-nsjail-here"))
    collect(engine, store, "qc-broken", "scripted:oracle", tasks=1)
    result = asyncio.run(qc_gate(run="qc-broken", trigger="none", training_threshold=0.1))
    assert result.batch_passed is False
    assert result.discard == result.episodes == 4
    assert result.triggered_training is False


def test_an_unusable_llm_judge_never_sinks_the_gate(
    prefect_harness: None, gated_env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GRM endpoint (a real loopback HTTP server) answers 500 until one episode runs
    out of retries, 429 and garbage before valid answers for others: the gate records the
    first unscored and goes on; the others are scored by the LLM judge."""
    import json

    from flows.qc import qc_gate
    from tests.scoring.test_grm import ChatServer

    engine, store = gated_env
    collect(engine, store, "qc-grm", "scripted:oracle", tasks=1)
    server = ChatServer()
    try:
        monkeypatch.setenv("EPIFLOW_GRM_BASE_URL", server.base_url)
        monkeypatch.setenv("EPIFLOW_GRM_CONCURRENCY", "1")  # the reply queue's order
        monkeypatch.setenv("EPIFLOW_GRM_RETRIES", "1")
        monkeypatch.setenv("EPIFLOW_GRM_BACKOFF_S", "0.01")
        clean = json.dumps(
            {
                "scores": dict.fromkeys(
                    ("completion", "tool_correctness", "reliability", "cost", "safety"), 4
                ),
                "deductions": [],
                "suggestion": "Fine.",
            }
        )
        server.replies += [(500, {"error": "boom"}), (503, "overloaded")]  # episode 1
        server.replies += [(429, {"error": "slow down"})]  # episode 2, then valid
        server.answer(clean)
        server.replies += [(200, "<html>garbage</html>")]  # episode 3, then valid
        server.answer(clean)
        server.answer(clean)  # episode 4
        result = asyncio.run(qc_gate(run="qc-grm", grm=True, trigger="none"))
    finally:
        server.close()
    assert result.episodes == 4 and result.grm_unscored == 1
    assert result.keep + result.downweight + result.discard == 4
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT parsed, parse_error FROM judgement WHERE judge LIKE 'grm:%'")
        ).all()
    assert sorted(bool(p) for p, _ in rows) == [False, True, True, True]
    [(_, reason)] = [r for r in rows if not r[0]]
    assert reason.startswith("unscored: ") and "503" in reason
