"""GRPO over whole episodes: TRL training on rollouts in real jails (the rollout function's
unit tests: `test_episode_rollouts`)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from agent.errors import EndpointError
from agent.policies.base import PolicyRequest
from agent.policies.hf_replica import GenerationDtype
from agent.prompt import PromptStyle
from agent.render import render_final, render_tool_call
from agent.settings import LoopSettings, PolicySettings
from agent.trajectory import EpisodeStatus, Step
from collection.grpo_rollouts import (
    CollectionRolloutSource,
    rollout_run_key,
    run_grpo_rollouts,
)
from config.settings import load_qc_config, load_settings
from models import run_id_for
from storage.grpo_rollouts import grpo_rollouts_of_run
from storage.objects import LocalObjectStore
from storage.run_reads import run_counts, run_status, run_trajectories
from suites.builtin import builtin_suite
from tasks.types import TaskInstance
from tests.training.factory import episode
from tests.training.grpo_setup import rollout_settings, tiny_grpo_training
from tests.training.trainer_policy import TrainerModelPolicy
from training.groups import GroupFate
from training.rollout_tokens import token_rollout
from training.trainers.common import TrainJob
from training.trainers.episode_grpo import (
    JudgedBatch,
    RolloutBatch,
    run_episode_grpo,
)

# ------------------------------------------------------------------ end to end


class _ScriptedTrainerPolicy(TrainerModelPolicy):
    """The trainer's model, with some rollouts' answers fixed so that the groups' rewards
    are known: the real model's prompts, ids and logprobs are recorded for every turn.

    - `dir_tree`: by seed mod 3, the reference solution call by call then the final
      answer (forced ids; the model's logprobs of them are recorded); the first reference
      call then a wrong answer (a failure the gate keeps); unparsable text until the loop
      ends the episode (the gate discards it: its group is trained on the other two);
    - `checksums`: the same wrong answer on every rollout (zero variance);
    - `largest_files`, seeds 1 mod 3: the endpoint fails (an infrastructure outcome);
    - everything else: sampled from the model.
    """

    def __init__(self, *args: Any, tasks: dict[str, TaskInstance], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tasks = tasks

    def forced(self, request: PolicyRequest) -> str | None:
        role, kind = request.task.template, request.seed % 3
        reference, k = request.task.reference_solution, request.step_index
        if role == "dir_tree" and kind == 0:
            if k < len(reference):
                return render_tool_call(f"c{k + 1}", reference[k].tool, reference[k].args)
            return render_final(request.task.reference_final)
        if role == "dir_tree" and kind == 1:
            if k == 0:
                return render_tool_call("c1", reference[0].tool, reference[0].args)
            return render_final("not the answer")
        if role == "dir_tree":
            return "I will not use the protocol."
        if role == "checksums":
            return render_final("not the answer")
        if role == "largest_files" and kind == 1:
            raise EndpointError("the test's endpoint is down", endpoint="test://down")
        return None

    def sample(
        self, prompt_ids: list[int], request: PolicyRequest
    ) -> tuple[list[int], list[float]]:
        import torch

        text = self.forced(request)
        if text is None:
            return super().sample(prompt_ids, request)
        ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        ids.append(self.tokenizer.eos_token_id)
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([prompt_ids + ids])).logits[0]
        logps = torch.log_softmax(logits[len(prompt_ids) - 1 : -1].float(), dim=-1)
        return ids, [float(logps[i, t]) for i, t in enumerate(ids)]


def _verdicts(engine: Engine, gates: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    from sqlmodel import Session, col, select

    from models import QcResult

    with Session(engine) as session:
        found = session.exec(select(QcResult).where(col(QcResult.qc_run_id).in_(gates))).all()
        return {r.episode_id: r.verdict for r in found}


class _Capture:
    """Every generation batch TRL trained on, as `_generate_and_score_completions` gave it."""

    def __init__(self) -> None:
        self.outputs: list[dict[str, Any]] = []

    def wrap(self, original: Any) -> Any:
        def generate_and_score(trainer: Any, inputs: Any) -> Any:
            output = original(trainer, inputs)
            self.outputs.append({k: v for k, v in output.items() if hasattr(v, "tolist")})
            return output

        return generate_and_score


def _judged_training(
    tasks: list[TaskInstance],
    job: TrainJob,
    judged: list[JudgedBatch],
    monkeypatch: pytest.MonkeyPatch,
    *,
    sources: list[CollectionRolloutSource] | None = None,
) -> Callable[[CollectionRolloutSource], Any]:
    """The `train` of `run_grpo_rollouts`: GRPO over `tasks`, every judged batch kept in
    `judged` before the source records it (and the source in `sources`)."""

    def train(source: CollectionRolloutSource) -> Any:
        if sources is not None:
            sources.append(source)
        record = source.record

        def keep(batch: JudgedBatch) -> None:
            judged.append(batch)
            record(batch)

        monkeypatch.setattr(source, "record", keep)
        return run_episode_grpo([t.task_id for t in tasks], job, source)

    return train


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_grpo_over_episodes_in_real_jails(
    tiny_base_model: Path,
    engine: Engine,
    store: LocalObjectStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trl.trainer.grpo_trainer import GRPOTrainer

    capture = _Capture()
    monkeypatch.setattr(
        GRPOTrainer,
        "_generate_and_score_completions",
        capture.wrap(GRPOTrainer._generate_and_score_completions),
    )
    tasks = builtin_suite().instances(1, templates=["dir_tree", "checksums", "largest_files"])
    settings = rollout_settings(max_steps=3, max_consecutive_parse_failures=2)
    training = tiny_grpo_training(
        max_steps=2, batch_size=9, rollouts_per_task=3, rl_learning_rate=5e-6, beta=0.05
    )
    by_id = {t.task_id: t for t in tasks}
    training_key = f"test-{uuid.uuid4().hex[:8]}"

    def policy(batch: RolloutBatch) -> _ScriptedTrainerPolicy:
        return _ScriptedTrainerPolicy(
            batch.model,
            batch.tokenizer,
            spec=f"hf:grpo/test@{batch.policy_version}",
            prompt_style=PromptStyle.COMPACT,
            max_new_tokens=16,
            tasks=by_id,
        )

    judged: list[JudgedBatch] = []
    job = TrainJob(base_model_dir=tiny_base_model, output_dir=tmp_path / "rl", settings=training)
    sources: list[CollectionRolloutSource] = []

    train = _judged_training(tasks, job, judged, monkeypatch, sources=sources)

    result, rollouts = run_grpo_rollouts(
        training_key,
        tasks,
        settings,
        train,
        base_model_dir=tiny_base_model,
        engine=engine,
        store=store,
        qc_config=load_qc_config(),
        concurrency=3,
        make_policy=policy,
    )
    (source,) = sources

    run_id = run_id_for(rollout_run_key(training_key))
    assert result.steps == 2 and len(capture.outputs) == 2 and len(judged) == 2
    assert run_status(engine, run_id) == "completed"

    # Every rollout is a stored episode with its grpo_rollout row: stored = generated.
    stored = {t.episode_id: t for t in run_trajectories(engine, store, run_id)}
    rows = {r.episode_id: r for r in grpo_rollouts_of_run(engine, run_id)}
    assert len(stored) == len(rows) == source.generated == rollouts.counts.rollouts == 18
    assert sum(run_counts(engine, run_id).values()) == 18
    # Each batch was gated before its optimiser step: one qc_run per batch on the rollout
    # run, a verdict per episode.
    verdicts = _verdicts(engine, source.gates)
    assert len(source.gates) == 2 and len(verdicts) == 18

    for batch, output in zip(judged, capture.outputs, strict=True):
        completion = output["completion_ids"].tolist()
        loss_mask = (output["completion_mask"] * output["tool_mask"]).tolist()
        advantages = output["advantages"].tolist()
        slot = 0
        for group in batch.groups:
            for i, t in enumerate(group.trajectories):
                row, kept = rows[t.episode_id], stored[t.episode_id]
                assert row.policy_version == batch.batch.policy_version
                assert row.group_fate == group.fate.value
                trained = [c for c, m in zip(completion[slot], loss_mask[slot], strict=True) if m]
                assert (verdicts[t.episode_id] == "discard") == (not group.admitted(i))
                if group.trained and not group.admitted(i):
                    # Discarded by the gate: nothing of it trained, out of the baseline.
                    assert trained == [] and advantages[slot] == 0.0
                    assert row.advantage is None and row.reward == kept.total_reward
                elif group.trained:
                    # The ids the trainer optimised are the stored ids the model sampled,
                    # and nothing else: every observation token is out of the loss.
                    exact = token_rollout(kept)
                    assert trained == [i for s in kept.steps for i in s.completion_token_ids or []]
                    assert sum(loss_mask[slot]) == sum(exact.env_mask)
                    n = len(exact.completion_ids)
                    assert completion[slot][:n] == exact.completion_ids
                    assert [m for m in loss_mask[slot][:n]] == exact.env_mask
                    assert exact.env_mask.count(0) == row.observation_tokens
                    assert row.observation_tokens and row.observation_tokens > 0  # multi-turn
                    assert row.advantage == pytest.approx(advantages[slot], abs=1e-4)
                    assert row.reward == kept.total_reward
                else:
                    assert trained == [] and advantages[slot] == 0.0
                    assert row.advantage is None
                slot += 1

    fates = [g.fate for b in judged for g in b.groups]
    assert fates.count(GroupFate.TRAINED) == 2  # dir_tree, twice
    assert fates.count(GroupFate.ZERO_VARIANCE) == 2  # checksums, twice
    assert fates.count(GroupFate.INFRASTRUCTURE) == 2  # largest_files, twice
    infra = [t for t in stored.values() if t.status == EpisodeStatus.ENDPOINT_ERROR]
    assert len(infra) == 2 and all(rows[t.episode_id].reward is None for t in infra)
    counts = rollouts.counts.as_dict()
    assert counts["groups_dropped_zero_variance"] == 2
    assert counts["groups_dropped_infrastructure"] == 2
    assert counts["infrastructure_rollouts"] == 2
    assert counts["qc_discarded_rollouts"] == 2  # dir_tree's unparsable rollout, twice
    assert result.metrics["grpo_run/groups_dropped_zero_variance"] == 2.0  # the run's
    assert result.metrics["grpo_run/qc_discarded_rollouts"] == 2.0
    assert result.metrics["grpo/groups_dropped_zero_variance"] == 1.0  # the last step's
    assert result.metrics["grpo/groups_used"] == 1.0
    assert any("dropped 2 of 4 groups" in w for w in result.warnings) is False  # 50 % is not above
    solved = [t for t in stored.values() if t.template == "dir_tree" and t.policy_seed % 3 == 0]
    assert solved and all(t.status == EpisodeStatus.SUCCESS and t.n_steps == 3 for t in solved)
    assert all(isinstance(s, Step) for t in solved for s in t.steps)


class _LengthsPolicy(_ScriptedTrainerPolicy):
    """`dir_tree` by seed mod 3: the reference solution (3 turns); the reference with its
    last call repeated (4 turns, also a success); its last (read-only) call then a wrong
    answer (2 turns, a failure: nothing was created)."""

    def forced(self, request: PolicyRequest) -> str | None:
        kind, k = request.seed % 3, request.step_index
        reference = request.task.reference_solution
        calls = {0: reference, 1: [*reference, reference[-1]], 2: reference[-1:]}[kind]
        if k < len(calls):
            return render_tool_call(f"c{k + 1}", calls[k].tool, calls[k].args)
        return render_final(request.task.reference_final if kind < 2 else "not the answer")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_grpo_with_per_turn_returns_in_real_jails(
    tiny_base_model: Path,
    engine: Engine,
    store: LocalObjectStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With `returns_gamma`, the advantages TRL's loss receives are (B, T): each sampled
    token of turn t carries its rollout's A_{i,t}, as judged and stored with the episode
    (`grpo_rollout.advantage` = A_{i,0}, `turn_advantages` every turn's)."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    from training.returns import token_advantages
    from training.trainers.step_returns import StepReturnsMixin

    trained_on: list[dict[str, Any]] = []
    trainers: list[type] = []
    compute_loss = GRPOTrainer._compute_loss

    def keep_inputs(trainer: Any, model: Any, inputs: dict[str, Any]) -> Any:
        trainers.append(type(trainer))
        trained_on.append({k: v.tolist() for k, v in inputs.items() if hasattr(v, "tolist")})
        return compute_loss(trainer, model, inputs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", keep_inputs)
    tasks = builtin_suite().instances(1, templates=["dir_tree"])
    settings = rollout_settings(max_steps=4, max_consecutive_parse_failures=2)
    training = tiny_grpo_training(max_steps=1, batch_size=3, rollouts_per_task=3, returns_gamma=0.9)
    by_id = {t.task_id: t for t in tasks}

    def policy(batch: RolloutBatch) -> _LengthsPolicy:
        return _LengthsPolicy(
            batch.model,
            batch.tokenizer,
            spec=f"hf:grpo/returns@{batch.policy_version}",
            prompt_style=PromptStyle.COMPACT,
            max_new_tokens=16,
            tasks=by_id,
        )

    judged: list[JudgedBatch] = []
    job = TrainJob(base_model_dir=tiny_base_model, output_dir=tmp_path / "rl", settings=training)

    train = _judged_training(tasks, job, judged, monkeypatch)

    key = f"returns-{uuid.uuid4().hex[:8]}"
    result, _ = run_grpo_rollouts(
        key,
        tasks,
        settings,
        train,
        base_model_dir=tiny_base_model,
        engine=engine,
        store=store,
        qc_config=load_qc_config(),
        concurrency=3,
        make_policy=policy,
    )
    run_id = run_id_for(rollout_run_key(key))
    assert result.steps == 1 and len(judged) == 1 and len(trained_on) == 1
    assert all(issubclass(cls, StepReturnsMixin) for cls in trainers)
    stored = {t.episode_id: t for t in run_trajectories(engine, store, run_id)}
    rows = {r.episode_id: r for r in grpo_rollouts_of_run(engine, run_id)}
    (group,) = judged[0].groups
    assert group.fate is GroupFate.TRAINED and group.turn_advantages is not None
    lengths = sorted(t.n_steps for t in stored.values())
    assert lengths == [2, 3, 4]
    assert [t.status for t in stored.values()].count(EpisodeStatus.SUCCESS) == 2
    short, long = sorted(
        (t for t in group.trajectories if t.status is EpisodeStatus.SUCCESS),
        key=lambda t: t.n_steps,
    )
    index = {t.episode_id: i for i, t in enumerate(group.trajectories)}
    a_short, a_long = (group.turn_advantages[index[t.episode_id]] for t in (short, long))
    assert a_short is not None and a_long is not None
    assert a_short[0] > a_long[0]  # the shorter success is reinforced more

    # What TRL trained with: one row per rollout (shuffled), advantages (B, T).
    inputs = trained_on[0]
    mask = [
        [c * m for c, m in zip(cr, mr, strict=True)]
        for cr, mr in zip(inputs["completion_mask"], inputs["tool_mask"], strict=True)
    ]
    found = 0
    for t in group.trajectories:
        turns = group.turn_advantages[index[t.episode_id]]
        assert turns is not None and len(turns) == t.n_steps
        row = rows[t.episode_id]
        assert row.turn_advantages == pytest.approx(list(turns))  # stored, every turn
        assert row.advantage == pytest.approx(turns[0])  # the stored one is A_{i,0}
        tokens = token_rollout(stored[t.episode_id])
        n = len(tokens.completion_ids)
        (b,) = [
            b for b, ids in enumerate(inputs["completion_ids"]) if ids[:n] == tokens.completion_ids
        ]
        expected = token_advantages(tokens, turns)
        assert inputs["advantages"][b][:n] == pytest.approx(expected, abs=1e-6)
        trained = [a for a, m in zip(inputs["advantages"][b], mask[b], strict=True) if m]
        assert trained == pytest.approx(
            [expected[k] for k in range(n) if tokens.env_mask[k]], abs=1e-6
        )
        assert sum(mask[b]) == sum(tokens.env_mask)
        found += 1
    assert found == len(inputs["advantages"]) == 3


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("generation_dtype", [None, "bfloat16"])
def test_the_default_rollout_policy_is_the_token_exact_hf_policy(
    tiny_base_model: Path,
    engine: Engine,
    store: LocalObjectStore,
    tmp_path: Path,
    generation_dtype: GenerationDtype | None,
) -> None:
    """Without a policy of the caller's, a batch's episodes are generated by
    `HFPolicy.from_loaded` over the trainer's model, or over its bf16 replica
    (`agent.policies.hf_replica`, a bf16 run's rollouts), sampled, the group's turns
    batched: every stored step carries its prompt ids, sampled ids and one logprob per
    sampled id, and each turn's prompt extends the previous turn's (the stream TRL trains
    on)."""
    tasks = builtin_suite().instances(1, templates=["dir_tree"])
    settings = rollout_settings(max_steps=2, max_consecutive_parse_failures=2)
    training = tiny_grpo_training(
        max_steps=1, batch_size=2, rollouts_per_task=2, max_completion_length=8
    )
    job = TrainJob(base_model_dir=tiny_base_model, output_dir=tmp_path / "rl", settings=training)
    key = f"default-{uuid.uuid4().hex[:8]}"
    result, rollouts = run_grpo_rollouts(
        key,
        tasks,
        settings,
        lambda source: run_episode_grpo([t.task_id for t in tasks], job, source),
        base_model_dir=tiny_base_model,
        engine=engine,
        store=store,
        qc_config=load_qc_config(),
        concurrency=2,
        prompt_style=PromptStyle.COMPACT,
        max_new_tokens=8,
        generation_dtype=generation_dtype,
    )
    run_id = run_id_for(rollout_run_key(key))
    stored = run_trajectories(engine, store, run_id)
    assert result.steps == 1 and rollouts.counts.rollouts == len(stored) == 2
    assert run_status(engine, run_id) == "completed"
    for t in stored:
        assert t.policy == f"hf:grpo/{rollout_run_key(key)}@0"
        for step in t.steps:
            assert step.prompt_token_ids and step.completion_token_ids
            assert len(step.logprobs or []) == len(step.completion_token_ids)
        token_rollout(t)  # raises unless every turn's prompt extends the previous one


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_train_grpo_registers_the_checkpoint_and_keys_the_rollout_run(
    tiny_base_model: Path, engine: Engine, store: LocalObjectStore, tmp_path: Path
) -> None:
    """What `epiflow train --algo grpo` runs (the train flow's `train` and
    `register-checkpoint` stages): a grpo snapshot's tasks (the templates asked for) from a
    registered checkpoint; the training run, its checkpoint (parent: the base), the
    rollout run keyed by the training run, every rollout gated and recorded. The batch is
    a token budget of two groups' worth of the source episodes' measured length: one
    optimiser step of both groups, one group per micro-batch, recorded in the run's config."""
    from sqlmodel import Session

    from agent.trajectory import episode_id_for
    from collection.grpo_training import train_grpo_model
    from models import TrainingRun
    from sandbox.tool_specs import BUILTIN_TOOLS
    from storage.episodes import persist_episodes
    from training.pipeline import register_checkpoint
    from training.registry import get_checkpoint, register_base_model
    from training.snapshots import build_snapshot
    from training.token_budget import rollout_token_counts
    from training.trainers.common import load_tokenizer
    from training.training_config import build_training_config

    training = tiny_grpo_training(
        max_steps=1, batch_size=2, rollouts_per_task=2, max_completion_length=8
    )
    real = builtin_suite().instances(1, templates=["dir_tree", "checksums", "csv_to_json"])
    collected = []
    for i, task in enumerate(real):
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
    snapshot = build_snapshot(
        engine, store, kind="grpo", run_ids=[run_id_for("train-run")], prompt_style="compact"
    )
    config = build_training_config(
        tiny_base_model, tools=list(BUILTIN_TOOLS.values()), settings=training
    )
    base = register_base_model(engine, store, tiny_base_model, config=config)
    trained_on = [t for t in collected if t.template in ("dir_tree", "checksums")]
    lengths = rollout_token_counts(trained_on, load_tokenizer(tiny_base_model), "compact")
    training = training.model_copy(
        update={"rl_tokens_per_step": round(2 * 2 * sum(lengths) / len(lengths))}
    )  # two groups of two rollouts at the measured mean
    settings = dataclasses.replace(
        load_settings(),
        loop=LoopSettings(max_steps=2, max_consecutive_parse_failures=2),
        policy=PolicySettings(outage_episodes=0),
    )

    trained = train_grpo_model(
        engine,
        store,
        dataset_id=snapshot.id,
        work_dir=tmp_path / "work",
        training=training,
        settings=settings,
        qc_config=load_qc_config(),
        base_checkpoint_id=base,
        templates=["dir_tree", "checksums"],
        concurrency=2,
    )
    outcome = register_checkpoint(engine, store, trained, settings=training)

    checkpoint = get_checkpoint(engine, outcome.checkpoint_id)
    assert checkpoint.parent_checkpoint_id == base
    assert checkpoint.training_run_id == trained.training_run_id
    with Session(engine) as session:
        row = session.get(TrainingRun, trained.training_run_id)
        assert row is not None and row.status == "completed" and row.algo == "grpo"
        assert row.dataset_id == snapshot.id and row.config["rollouts"] == "episodes"
        planned = row.config["token_budget"]
        assert (planned["rollout_tokens_source"], planned["measured_episodes"]) == ("measured", 2)
        assert (planned["groups_per_step"], planned["rollouts_per_step"]) == (2, 4)
        assert (row.config["batch_size"], row.config["gradient_accumulation_steps"]) == (2, 2)
        assert row.config["activation_checkpointing"] is True
    assert trained.token_budget is not None and trained.settings is not None
    assert trained.settings.gradient_accumulation_steps == 2
    run_id = run_id_for(rollout_run_key(str(trained.training_run_id)))
    assert run_status(engine, run_id) == "completed"
    stored = run_trajectories(engine, store, run_id)
    assert len(stored) == 4 and {t.template for t in stored} == {"dir_tree", "checksums"}
    rows = grpo_rollouts_of_run(engine, run_id)
    assert [r.training_run_id for r in rows] == [trained.training_run_id] * 4
    assert {r.policy_version for r in rows} == {0}  # both groups in the step's one batch
    assert trained.result.steps == 1
    assert trained.result.metrics["grpo_run/rollouts_generated"] == 4.0
