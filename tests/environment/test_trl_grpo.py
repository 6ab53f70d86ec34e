"""`trl.GRPOTrainer(environment_factory=EpiflowEnv)` trains two steps on the locally
built tiny model (nothing downloaded, real nsjail, real SQLite): every rollout is a
stored episode of the run, the reward TRL got for each is the stored one, and the QC
gate, run on the run as `epiflow qc` runs it (the `qc-gate` flow, on Prefect's test
harness), stores a verdict for every rollout."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from config.settings import load_settings
from environment.hub import HubConfig
from environment.trainer_env import EpiflowEnv, dataset_rows
from storage import migrate
from storage.db import make_engine
from storage.objects import LocalObjectStore
from suites.builtin import builtin_suite
from tests.training.factory import episode
from training.base_model import build_base_model, protocol_corpus
from training.settings import TrainingSettings

pytestmark = [
    pytest.mark.slow,
    # TRL 1.16 still calls transformers 5's renamed gradient-checkpointing API.
    pytest.mark.filterwarnings("ignore:`(is_)?gradient_checkpointing:FutureWarning"),
]

SEEN: list[tuple[uuid.UUID, float | None]] = []


class RecordedEnv(EpiflowEnv):
    """`EpiflowEnv` noting the reward it hands TRL for each rollout."""

    def get_reward(self) -> float | None:
        reward = super().get_reward()
        assert self._session is not None
        SEEN.append((self._session.episode_id, reward))
        return reward


def test_grpo_trains_with_epiflow_as_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_harness: None
) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[attr-defined]

    from flows.qc import qc_gate

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    small = TrainingSettings(
        vocab_size=4096,
        max_length=1024,
        max_position_embeddings=1024,
        max_steps=2,
        batch_size=2,
        rollouts_per_task=2,
        max_completion_length=12,
    )
    corpus = protocol_corpus(builtin_suite().instances(1), [episode(task=i) for i in range(3)])
    model = build_base_model(tmp_path / "model", corpus, settings=small)
    settings = load_settings()
    engine = make_engine(settings.database)
    migrate.upgrade(engine)
    rows = dataset_rows(
        "builtin",
        templates=["csv_to_json"],
        tasks=2,
        seed=0,
        settings=settings.suites,
        sandbox=settings.sandbox,
    )
    RecordedEnv.configure(
        HubConfig(run_key="grpo-env", templates=["csv_to_json"], max_sessions=4),
        settings=settings,
        engine=engine,
        store=LocalObjectStore(tmp_path / "objects"),
    )
    SEEN.clear()
    try:
        trainer = GRPOTrainer(
            model=str(model),
            args=GRPOConfig(
                output_dir=str(tmp_path / "out"),
                max_steps=2,
                per_device_train_batch_size=2,
                num_generations=2,
                max_completion_length=16,
                report_to=[],
                use_cpu=True,
                logging_steps=1,
                save_strategy="no",
            ),
            train_dataset=Dataset.from_list(rows),
            environment_factory=RecordedEnv,
        )
        trainer.train()
    finally:
        RecordedEnv.shutdown()
    # The run is gated like any collection run: what `epiflow qc --run grpo-env` runs.
    gate = asyncio.run(qc_gate(run="grpo-env", trigger="none"))
    try:
        with engine.connect() as conn:
            stored = {
                uuid.UUID(str(r[0])): (r[1], r[2])
                for r in conn.execute(text("SELECT id, final_reward, status FROM episode"))
            }
            verdicts = {
                uuid.UUID(str(r[0])): r[1]
                for r in conn.execute(text("SELECT episode_id, verdict, qc_run_id FROM qc_result"))
                if uuid.UUID(str(r[2])) == gate.qc_run_id
            }
    finally:
        engine.dispose()
    assert len(SEEN) == 4 and len(stored) == 4  # 2 steps x 2 generations
    assert gate.episodes == 4 and set(verdicts) == set(stored)
    assert set(verdicts.values()) <= {"keep", "downweight", "discard"}
    assert {episode: reward for episode, reward in SEEN} == {k: v[0] for k, v in stored.items()}
    logged = [h["rewards/RecordedEnv/mean"] for h in trainer.state.log_history if "reward" in h]
    rewards = [r for _, r in SEEN if r is not None]
    assert logged == pytest.approx([sum(rewards[:2]) / 2, sum(rewards[2:]) / 2])
