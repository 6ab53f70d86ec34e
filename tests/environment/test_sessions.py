"""Client-driven sessions through the one run path: real nsjail, real SQLite, the loop
unchanged. Each session is a stored episode of the hub's one collection run."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from config.settings import load_settings
from environment.actions import Action
from environment.errors import (
    CapacityReached,
    InfrastructureFailure,
    SessionClosed,
    SessionDone,
    UnknownTask,
)
from environment.hub import HubConfig, SessionHub, open_hub
from environment.selection import TaskSelection
from environment.sessions import Session
from storage import migrate
from storage.db import make_engine
from storage.episodes import load_trajectory
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from suites.registry import load_suite
from suites.suite import Suite
from tests.suites.test_harbor_tasks import IMAGES, INTEROP, builds_images, needs_builder

TEMPLATE = "csv_to_json"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{tmp_path / 'env.db'}"))
    migrate.upgrade(engine)
    yield engine
    engine.dispose()


def _hub(
    engine: Engine, tmp_path: Path, **config: Any
) -> contextlib.AbstractAsyncContextManager[SessionHub]:
    return open_hub(
        HubConfig(run_key=str(config.pop("run_key", "env-test")), **config),
        load_settings(),
        engine=engine,
        store=LocalObjectStore(tmp_path / "objects"),
    )


async def _oracle(hub: SessionHub, *, native: bool = True) -> tuple[uuid.UUID, dict]:  # type: ignore[type-arg]
    """Reset on TEMPLATE and send the reference solution's calls, then its final."""
    session, first = await hub.reset(TaskSelection(template=TEMPLATE))
    assert first["done"] is False and first["observation"]["tools"]
    task = session.planned.task
    for call in task.reference_solution:
        if native:
            result = await hub.step(session, Action(tool=call.tool, arguments=call.args))
        else:
            from agent.render import render_tool_call

            message = render_tool_call("c1", call.tool, call.args)
            result = await hub.step(session, Action(message=message))
        assert result["done"] is False, result
        assert result["observation"]["exit_code"] == 0, result
    final = await hub.step(session, Action(final=task.reference_final or "done"))
    return session.episode_id, final


def _status(engine: Engine, key: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT status FROM collection_run WHERE run_key = :k"), {"k": key}
            ).scalar_one()
        )


def test_an_oracle_session_is_a_stored_successful_episode(engine: Engine, tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")

    async def main() -> tuple[uuid.UUID, dict]:  # type: ignore[type-arg]
        async with _hub(engine, tmp_path, templates=[TEMPLATE]) as hub:
            return await _oracle(hub)

    episode, final = asyncio.run(main())
    assert final["done"] is True and final["observation"]["status"] == "success", final
    stored = load_trajectory(engine, store, episode)
    assert stored.final_reward == final["reward"] == final["observation"]["final_reward"]
    assert stored.verifier_score == 1.0 and stored.policy == "env:client"
    assert stored.steps[0].native_tool_calls  # the native call kept as sent
    assert _status(engine, "env-test") == "completed"


def test_each_steps_reward_is_the_stored_immediate_reward(engine: Engine, tmp_path: Path) -> None:
    """A session rewards each step as it comes (`StepRewards`, one step at a time); what
    the client is told equals what `apply_rewards` stores over the whole episode: new
    paths, a repeated call's penalty, a failed call that explores nothing, a parse error."""
    store = LocalObjectStore(tmp_path / "objects")
    actions = [
        Action(tool="execute_shell", arguments={"command": "ls"}),
        Action(tool="execute_shell", arguments={"command": "ls"}),  # repeated
        Action(tool="execute_shell", arguments={"command": "false"}),  # failed
        Action(tool="read_file", arguments={"path": "no/such/file"}),
        Action(message="no block at all"),  # format error
        Action(tool="execute_shell", arguments={"command": "ls  "}),  # same target
    ]

    async def main() -> tuple[uuid.UUID, list[float]]:
        async with _hub(engine, tmp_path, templates=[TEMPLATE]) as hub:
            session, _ = await hub.reset(TaskSelection(template=TEMPLATE))
            told = [(await hub.step(session, a))["reward"] for a in actions]
            await hub.step(session, Action(final="done"))
            return session.episode_id, told

    episode, told = asyncio.run(main())
    stored = load_trajectory(engine, store, episode)
    assert told == [s.immediate_reward for s in stored.steps[: len(actions)]]
    assert len(set(told)) > 2  # the rules above gave different rewards


def test_two_sessions_on_one_task_are_two_episodes_of_one_run(
    engine: Engine, tmp_path: Path
) -> None:
    async def main() -> list[tuple[uuid.UUID, dict]]:  # type: ignore[type-arg]
        async with _hub(engine, tmp_path, templates=[TEMPLATE]) as hub:
            return list(await asyncio.gather(_oracle(hub), _oracle(hub, native=False)))

    results = asyncio.run(main())
    assert results[0][0] != results[1][0]
    assert all(final["observation"]["success"] for _, final in results)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT rollout_index FROM episode ORDER BY 1")).all()
    assert [r[0] for r in rows] == [0, 1]
    # A restarted server on the same key adds episodes instead of clashing.
    episode, final = asyncio.run(_once(engine, tmp_path))
    assert final["observation"]["success"] and episode not in {r[0] for r in results}


async def _once(engine: Engine, tmp_path: Path) -> tuple[uuid.UUID, dict]:  # type: ignore[type-arg]
    async with _hub(engine, tmp_path, templates=[TEMPLATE]) as hub:
        return await _oracle(hub)


def test_tokens_sent_with_a_step_are_stored(engine: Engine, tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")

    async def main() -> uuid.UUID:
        async with _hub(engine, tmp_path, templates=[TEMPLATE]) as hub:
            session, _ = await hub.reset(TaskSelection(template=TEMPLATE))
            await hub.step(
                session,
                Action(
                    final="nothing",
                    prompt_token_ids=[1, 2, 3],
                    completion_token_ids=[7, 8],
                    logprobs=[-0.5, -0.25],
                ),
            )
            episode: uuid.UUID = session.episode_id
            return episode

    stored = load_trajectory(engine, store, asyncio.run(main()))
    assert stored.status.value == "failed"  # a wrong final answer is the agent's outcome
    step = stored.steps[0]
    assert (step.prompt_token_ids, step.completion_token_ids, step.logprobs) == (
        [1, 2, 3],
        [7, 8],
        [-0.5, -0.25],
    )


def test_bad_resets_steps_and_capacity_are_typed_errors(engine: Engine, tmp_path: Path) -> None:
    async def main() -> None:
        async with _hub(engine, tmp_path, templates=[TEMPLATE], max_sessions=1) as hub:
            with pytest.raises(UnknownTask):
                await hub.reset(TaskSelection(template="no_such_template"))
            with pytest.raises(UnknownTask):
                await hub.reset(TaskSelection(suite="no_such_suite"))
            session, _ = await hub.reset(TaskSelection(template=TEMPLATE))
            with pytest.raises(CapacityReached):
                await hub.reset(TaskSelection(template=TEMPLATE))
            await hub.step(session, Action(final="x"))
            with pytest.raises(SessionDone):
                await hub.step(session, Action(final="x"))
            # the slot is free again
            again, _ = await hub.reset(TaskSelection(template=TEMPLATE))
            await hub.close(again, "the client left")
            with pytest.raises(SessionClosed):
                await hub.step(again, Action(final="x"))

    asyncio.run(main())
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT status, failure_reason FROM episode ORDER BY rollout_index")
        ).all()
    assert [r[0] for r in rows] == ["failed", "policy_error"]
    assert "the client left" in rows[1][1]


def test_an_idle_session_is_closed_and_stored(engine: Engine, tmp_path: Path) -> None:
    async def main() -> None:
        async with _hub(engine, tmp_path, templates=[TEMPLATE], idle_timeout_s=0.5) as hub:
            session, _ = await hub.reset(TaskSelection(template=TEMPLATE))
            await session.ended()
            with pytest.raises(SessionClosed):
                await hub.step(session, Action(final="x"))

    asyncio.run(main())
    with engine.connect() as conn:
        status, reason = conn.execute(text("SELECT status, failure_reason FROM episode")).one()
    assert status == "policy_error" and "no message from the client" in reason


def test_an_infrastructure_failure_is_an_error_never_a_reward(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A jail that cannot start (its state dir is one nsjail cannot mount: pytest's 0700
    tmp) ends the episode env_error: the client gets `infrastructure`, no reward."""
    locked = tmp_path / "locked-state"
    locked.mkdir(mode=0o700)
    monkeypatch.setenv("EPIFLOW_SANDBOX_STATE_DIR", str(locked))

    async def main() -> None:
        async with _hub(engine, tmp_path, templates=[TEMPLATE]) as hub:
            with pytest.raises(InfrastructureFailure, match="env_error"):
                await hub.reset(TaskSelection(template=TEMPLATE))

    asyncio.run(main())
    with engine.connect() as conn:
        status, reward = conn.execute(text("SELECT status, final_reward FROM episode")).one()
    assert status == "env_error" and reward is None


def test_two_servers_share_one_database_as_two_runs(engine: Engine, tmp_path: Path) -> None:
    """The production shape in small: several servers on one database and object store,
    each its own run key (the lock is per key), each session stored once."""

    async def main() -> list[tuple[uuid.UUID, dict[str, Any]]]:
        async with (
            _hub(engine, tmp_path, run_key="machine-a", templates=[TEMPLATE]) as a,
            _hub(engine, tmp_path, run_key="machine-b", templates=[TEMPLATE]) as b,
        ):
            return list(await asyncio.gather(_oracle(a), _oracle(b)))

    results = asyncio.run(main())
    assert all(final["observation"]["success"] for _, final in results)
    with engine.connect() as conn:
        runs = conn.execute(
            text(
                "SELECT r.run_key, r.status, count(e.id) FROM collection_run r "
                "JOIN episode e ON e.run_id = r.id GROUP BY r.run_key, r.status ORDER BY 1"
            )
        ).all()
    assert [tuple(r) for r in runs] == [
        ("machine-a", "completed", 1),
        ("machine-b", "completed", 1),
    ]


@needs_builder
@builds_images
def test_two_resets_of_a_harbor_task_load_its_dataset_once(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub resolves every reset against the suite it loaded on the first: the registry's
    own loader, counted by a wrapper injected through `open_hub`, reads (and hashes) the
    Harbor dataset's task folders once for two sessions on one of its tasks."""
    IMAGES.mkdir(exist_ok=True)  # the Harbor tests' image cache: built once, reused
    IMAGES.chmod(0o755)
    monkeypatch.setenv("EPIFLOW_SUITES_PATH", str(INTEROP))
    monkeypatch.setenv("EPIFLOW_SUITES_HARBOR_IMAGE_DIR", str(IMAGES))
    settings = load_settings()
    loads: list[str] = []

    def counted(name: str) -> Suite:
        loads.append(name)
        return load_suite(name, settings=settings.suites, sandbox=settings.sandbox)

    async def two_resets() -> list[Session]:
        sessions = []
        async with open_hub(
            HubConfig(run_key="env-harbor", suite=INTEROP.name, max_sessions=2),
            settings,
            engine=engine,
            store=LocalObjectStore(tmp_path / "objects"),
            load_suite=counted,
        ) as hub:
            for _ in range(2):
                session, first = await hub.reset(TaskSelection(template="hello-world"))
                assert first["observation"]["task_id"] == session.planned.task.task_id
                sessions.append(session)
                await hub.close(session, "the test needs only its reset")
        return sessions

    sessions = asyncio.run(two_resets())
    assert loads == [INTEROP.name]
    assert [s.planned.task.task_id for s in sessions] == [sessions[0].planned.task.task_id] * 2
    assert [s.planned.rollout_index for s in sessions] == [0, 1]
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT template FROM episode")).scalars().all()
    assert stored == ["hello-world", "hello-world"]
