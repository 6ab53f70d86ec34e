"""Realistic data for the SQL cookbook test, collected once and written to each database.

One real collection per run through the collection API (nsjail episodes, rewards, objects
then rows), a real gate (rule judge + Great Expectations), a real dataset snapshot, the
registry's training-run bookkeeping and real replays in fresh jails. Everything random in
those paths is computed once here (the gate reports, the replays), then written to every
database, so SQLite and PostgreSQL hold the same facts and must give the same answers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session

from agent.settings import LoopSettings
from agent.trajectory import INFRASTRUCTURE_STATUSES, Trajectory, utcnow
from collection.lifecycle import start_run
from collection.replay import ReplayReport, replay_trajectory
from collection.request import CollectRequest
from collection.runner import collect_in_process
from config.settings import load_qc_config
from expectations.gate import run_gate
from expectations.report import GateReport
from models import Checkpoint, GrpoRollout, ReplayResult, run_id_for
from sandbox.settings import SandboxSettings
from scoring.rubric import Judgement
from scoring.rule_judge import rule_judgement
from storage.episodes import persist_episodes
from storage.objects import ObjectStore
from storage.qc import write_qc_run
from storage.runs import close_run
from suites.settings import SuitesSettings
from tests.agent.chat_server import ChatServer, reply
from training.registry import checkpoint_prefix, finish_training_run, start_training_run
from training.snapshots import DatasetInfo, build_snapshot

TEMPLATES = ["csv_to_json", "log_errors", "config_update"]
NOISY = (
    "scripted:noisy?malformed=0.15&unknown_tool=0.1&missing_arg=0.1"
    "&premature_final=0.1&fabricated_claim=0.1&repeated_command=0.1"
)
# A light profile with short latencies: every kind of fault shows up in a few episodes
# without the test sleeping for the default 1-2 s per injected latency.
FAULTS = (
    '{"latency_p": 0.1, "latency_ms": [5, 20], "permission_denied_p": 0.08,'
    ' "network_failure_p": 0.05, "tool_timeout_p": 0.05}'
)
ENDPOINT_ANSWERS = [
    '<tool_call id="c1" name="run_command">\n<arg name="cmd">ls</arg>\n</tool_call>',
    '<tool_call id="c2" name="list_dir">\n<arg name="path">.</arg>\n</tool_call>',
    "<final>done</final>",
]
"""An `openai:` endpoint that calls an unknown tool, lists the workspace and claims success."""

NAMESPACE = uuid.UUID("5d0c8a55-1f0e-4f57-9a8e-1b7c6e2d9f30")


def fixed_id(name: str) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, name)


@dataclass(frozen=True)
class GatePass:
    """One gate run, computed once and written to every database."""

    name: str
    """Which collection it gated (`noisy`, `oracle`, `endpoint`)."""
    run_key: str
    qc_run_id: uuid.UUID
    started_at: datetime
    report: GateReport
    judgements: list[Judgement]


@dataclass
class Corpus:
    """Everything the databases hold, as Python objects (the test's independent truth)."""

    requests: dict[str, CollectRequest] = field(default_factory=dict)
    """Collections by name: `noisy`, `oracle` (a night earlier), `endpoint`."""
    trajectories: dict[str, list[Trajectory]] = field(default_factory=dict)
    """Their episodes, by the same names."""
    gates: list[GatePass] = field(default_factory=list)
    replays: list[ReplayReport] = field(default_factory=list)
    base_checkpoint_id: uuid.UUID = field(default_factory=lambda: fixed_id("base"))
    checkpoint_id: uuid.UUID = field(default_factory=lambda: fixed_id("trained"))
    child_checkpoint_id: uuid.UUID = field(default_factory=lambda: fixed_id("child"))
    """Fine-tuned from `checkpoint_id` on the oracle run's snapshot."""

    def all_trajectories(self) -> list[Trajectory]:
        return [t for ts in self.trajectories.values() for t in ts]

    def latest_verdicts(self) -> dict[str, str]:
        """Episode id → verdict of the last gate run that judged it."""
        out: dict[str, str] = {}
        for gate in sorted(self.gates, key=lambda g: g.started_at):
            for v in gate.report.episode_verdicts():
                out[v.episode_id] = str(v.verdict)
        return out

    def gate(self, name: str) -> GatePass:
        """The latest gate run of collection `name`."""
        return max((g for g in self.gates if g.name == name), key=lambda g: g.started_at)


def _night_before(t: Trajectory) -> None:
    """Move an episode one day back, as if last night's batch had collected it."""
    day = timedelta(days=1)
    assert t.started_at is not None  # collected: its times are known
    t.started_at -= day
    if t.ended_at is not None:
        t.ended_at -= day
    for s in t.steps:
        assert s.started_at is not None
        s.started_at -= day


def collect(
    engine: Engine,
    store: ObjectStore,
    request: CollectRequest,
    *,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """A real collection through the collection API; returns the stored trajectories.

    `on_episode` sees each finished trajectory before it is persisted, so an adjustment
    made there (the oracle run's night shift) is what the database and objects hold."""
    collected: list[Trajectory] = []

    def keep(t: Trajectory) -> None:
        if on_episode is not None:
            on_episode(t)
        collected.append(t)

    asyncio.run(collect_in_process(request, engine=engine, store=store, on_episode=keep))
    return sorted(collected, key=lambda t: str(t.episode_id))


def collect_corpus(engine: Engine, store: ObjectStore) -> Corpus:
    """Collect the three runs into `engine`, then gate and replay them in Python."""
    corpus = Corpus()
    noisy: dict[str, Any] = {
        "policy": NOISY,
        "tasks": 3,
        "faults": FAULTS,
        "templates": TEMPLATES,
    }
    requests = {
        "noisy": CollectRequest(run_key="nightly-noisy", **noisy),
        "oracle": CollectRequest(
            run_key="nightly-oracle", policy="scripted:oracle", tasks=2, templates=TEMPLATES
        ),
    }
    for name, request in requests.items():
        shift = _night_before if name == "oracle" else None
        corpus.requests[name] = request
        corpus.trajectories[name] = collect(engine, store, request, on_episode=shift)
    with ChatServer([reply(text) for text in ENDPOINT_ANSWERS]) as server:
        request = CollectRequest(
            run_key="endpoint-smoke",
            policy=f"openai:{server.base_url}#tiny-model",
            tasks=1,
            concurrency=1,
            templates=TEMPLATES[:1],
        )
        corpus.requests["endpoint"] = request
        corpus.trajectories["endpoint"] = collect(engine, store, request)

    config = load_qc_config()
    started = utcnow() - timedelta(minutes=10)
    episodes = corpus.trajectories["noisy"]
    # The noisy run is gated twice: early on part of it, then whole; the second is "latest".
    batches = [
        ("noisy", [t for t in episodes if t.template in TEMPLATES[:2]]),
        ("noisy", episodes),
        ("oracle", corpus.trajectories["oracle"]),
        ("endpoint", corpus.trajectories["endpoint"]),
    ]
    for i, (name, batch) in enumerate(batches):
        corpus.gates.append(
            GatePass(
                name=name,
                run_key=str(corpus.requests[name].run_key),
                qc_run_id=fixed_id(f"qc-{i}"),
                started_at=started + timedelta(minutes=i),
                report=run_gate(batch, config=config),
                judgements=[rule_judgement(t, config.judge) for t in batch],
            )
        )
    text_cap = LoopSettings().step_text_max_chars
    for name, t in [
        ("noisy", episodes[0]),
        ("noisy", episodes[1]),
        ("oracle", corpus.trajectories["oracle"][0]),
    ]:
        spec = corpus.requests[name].sandbox_spec
        replay = replay_trajectory(
            t, spec, text_cap=text_cap, sandbox=SandboxSettings(), suites=SuitesSettings()
        )
        corpus.replays.append(asyncio.run(replay))
    return corpus


def ingest_collections(engine: Engine, store: ObjectStore, corpus: Corpus) -> None:
    """The collected episodes into another database, through the collection's storage path."""
    for name, request in corpus.requests.items():
        run_id = start_run(engine, request)
        persist_episodes(engine, store, corpus.trajectories[name])
        close_run(engine, run_id, status="completed")


@dataclass(frozen=True)
class Downstream:
    """The snapshots `write_downstream` made."""

    dataset: DatasetInfo
    """SFT of the noisy run: trained into `checkpoint_id`."""
    child_dataset: DatasetInfo
    """SFT of the oracle run: trained from `checkpoint_id` into `child_checkpoint_id`."""
    untrained_dataset: DatasetInfo
    """CPT of the endpoint run: nobody trained on it."""
    grpo_training_run_id: uuid.UUID
    """An agentic GRPO run whose rollouts are the noisy run's episodes."""
    grpo_rollouts: list[GrpoRollout]
    """Its `grpo_rollout` rows."""


def grpo_rows(training_run_id: uuid.UUID, episodes: list[Trajectory]) -> list[GrpoRollout]:
    """The noisy run's episodes as two optimiser steps of GRPO rollouts: alternate
    episodes to each step, one group per template; an infrastructure outcome drops its
    group, and every third rollout of a trained group is discarded by the gate."""
    rows: list[GrpoRollout] = []
    for version in (0, 1):
        batch = episodes[version::2]
        templates = sorted({t.template for t in batch})
        for index, template in enumerate(templates):
            group = [t for t in batch if t.template == template]
            infra = any(t.status in INFRASTRUCTURE_STATUSES for t in group)
            for k, t in enumerate(group):
                reward = None if t.status in INFRASTRUCTURE_STATUSES else t.total_reward
                rows.append(
                    GrpoRollout(
                        episode_id=t.episode_id,
                        training_run_id=training_run_id,
                        policy_version=version,
                        group_index=index,
                        task_id=t.task_id,
                        group_fate="infrastructure" if infra else "trained",
                        reward=reward,
                        advantage=None if infra or k % 3 == 2 else float(k),
                    )
                )
    return rows


def write_downstream(engine: Engine, store: ObjectStore, corpus: Corpus) -> Downstream:
    """Gate rows, three snapshots, two training runs with their checkpoints (the second
    fine-tunes the first's), replay rows."""
    for gate in corpus.gates:
        write_qc_run(
            engine,
            run_id=run_id_for(gate.run_key),
            report=gate.report,
            judgements=gate.judgements,
            docs_key=None,
            started_at=gate.started_at,
            qc_run_id=gate.qc_run_id,
        )
    dataset = build_snapshot(engine, store, kind="sft", qc_run_id=corpus.gate("noisy").qc_run_id)
    training_run_id = start_training_run(
        engine,
        dataset_id=dataset.id,
        algo="sft",
        base_model=str(corpus.base_checkpoint_id),
        config={"learning_rate": 1e-4, "epochs": 1},
    )
    finish_training_run(engine, training_run_id, metrics={"loss": 1.25, "steps": 4})
    child_dataset = build_snapshot(
        engine, store, kind="sft", qc_run_id=corpus.gate("oracle").qc_run_id
    )
    child_run_id = start_training_run(
        engine,
        dataset_id=child_dataset.id,
        algo="sft",
        base_model=str(corpus.checkpoint_id),
        config={"learning_rate": 5e-5, "epochs": 1},
    )
    finish_training_run(engine, child_run_id, metrics={"loss": 0.9, "steps": 2})
    untrained = build_snapshot(
        engine,
        store,
        kind="cpt",
        run_ids=[run_id_for(str(corpus.requests["endpoint"].run_key))],
    )
    grpo_run_id = start_training_run(
        engine,
        dataset_id=dataset.id,
        algo="grpo",
        base_model=str(corpus.checkpoint_id),
        config={"rl_learning_rate": 2e-6, "rollouts_per_task": 4},
    )
    finish_training_run(engine, grpo_run_id, metrics={"steps": 2})
    rollouts = grpo_rows(grpo_run_id, corpus.trajectories["noisy"])
    with Session(engine) as session:
        session.add_all([GrpoRollout.model_validate(r.model_dump()) for r in rollouts])
        session.commit()
    # Checkpoint rows without weights: the registry would upload a model directory first;
    # the lineage the cookbook queries is in these rows only.
    with Session(engine) as session:
        session.add(
            Checkpoint(
                id=corpus.base_checkpoint_id,
                training_run_id=None,
                object_prefix=checkpoint_prefix(corpus.base_checkpoint_id),
                metrics={},
                evaluation={},
            )
        )
        session.flush()
        session.add(
            Checkpoint(
                id=corpus.checkpoint_id,
                training_run_id=training_run_id,
                parent_checkpoint_id=corpus.base_checkpoint_id,
                object_prefix=checkpoint_prefix(corpus.checkpoint_id),
                metrics={"loss": 1.25},
                evaluation={},
            )
        )
        session.flush()
        session.add(
            Checkpoint(
                id=corpus.child_checkpoint_id,
                training_run_id=child_run_id,
                parent_checkpoint_id=corpus.checkpoint_id,
                object_prefix=checkpoint_prefix(corpus.child_checkpoint_id),
                metrics={"loss": 0.9},
                evaluation={},
            )
        )
        for i, r in enumerate(corpus.replays):
            session.add(
                ReplayResult(
                    id=fixed_id(f"replay-{i}"),
                    episode_id=r.episode_id,
                    steps=r.steps,
                    identical_steps=r.identical_steps,
                    first_divergence=r.first_divergence,
                )
            )
        session.commit()
    return Downstream(
        dataset=dataset,
        child_dataset=child_dataset,
        untrained_dataset=untrained,
        grpo_training_run_id=grpo_run_id,
        grpo_rollouts=rollouts,
    )
