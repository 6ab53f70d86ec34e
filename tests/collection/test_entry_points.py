"""One collection lifecycle for every entry point (issue 21 item 1).

Run for real (nsjail, SQLite, Prefect), each entry point holds the run key's lock while
its episodes run: `epiflow collect` (a subprocess; its flow runs on the collection the
command opened), the `collect-episodes` and `collect-shard` flows (Prefect's test
harness), `collect_in_process`, an evaluation (`collection.evaluation`), environment
sessions (`environment.hub`) and GRPO's rollouts (`collection.grpo_rollouts`). The policy is
the `openai:` policy talking to a real
loopback chat server (`tests.agent.chat_server`), which tries to take the lock itself
each time an episode asks it for a completion, before it answers; once the entry point
has returned, the lock is free. The demo runs the `collect-episodes` flow and the
benchmarks run `collect_in_process`, the flow or `open_collection`: the source check
below holds them (and everything else) to the one lifecycle: one plan, one open, one
lock acquisition, one writer of a run's status, each in `collection/lifecycle.py`.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from agent.settings import PolicySettings
from collection.request import CollectRequest
from config.settings import load_qc_config
from storage import migrate
from storage.db import make_engine
from storage.errors import RunKeyBusy
from storage.objects import LocalObjectStore
from storage.run_lock import acquire_run_key, shard_lock_name
from storage.settings import DatabaseSettings
from tests.agent.chat_server import ChatServer, reply
from tests.cli.local import cli_env, epiflow, local_prefect_home, sandbox_state_dir
from tests.test_layout import _imports

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ["csv_to_json", "dir_tree"]


class LockProbe(ChatServer):
    """A chat server that, for every completion asked of it, first records whether the
    lock `name` in `database` is held by someone else (it cannot take it)."""

    def __init__(self, database: DatabaseSettings, name: str) -> None:
        super().__init__([reply("<final>done</final>")])
        self.database = database
        self.name = name
        self.held: list[bool] = []

    def __enter__(self) -> LockProbe:
        super().__enter__()
        return self

    def _serve(self, handler: Any, action: dict[str, Any], body: dict[str, Any]) -> None:
        self.held.append(self.lock_is_held())
        super()._serve(handler, action, body)

    def lock_is_held(self) -> bool:
        try:
            acquire_run_key(self.database, self.name).release()
        except RunKeyBusy:
            return True
        return False

    def assert_held_while_episodes_ran(self, episodes: int) -> None:
        # Every completion an episode asked for saw the lock held (a check before the
        # episodes, like a preflight endpoint probe, may come before the lock is taken:
        # only the last `episodes` requests are the episodes').
        assert len(self.held) >= episodes, self.held
        assert all(self.held[-episodes:]), self.held
        assert not self.lock_is_held()  # released once the entry point returned


@pytest.fixture
def database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DatabaseSettings:
    """A migrated SQLite database, the one the settings of this test point at."""
    url = f"sqlite:///{tmp_path / 'entry.db'}"
    monkeypatch.setenv("EPIFLOW_DATABASE_URL", url)
    settings = DatabaseSettings(url=url)
    engine = make_engine(settings)
    migrate.upgrade(engine)
    engine.dispose()
    return settings


def request_for(probe: ChatServer, key: str) -> CollectRequest:
    return CollectRequest(
        policy=f"openai:{probe.base_url}#lock-probe", run_key=key, templates=TEMPLATES
    )


def test_collect_in_process_holds_the_lock(database: DatabaseSettings, tmp_path: Path) -> None:
    from collection.runner import collect_in_process

    with LockProbe(database, "in-process") as probe:
        engine = make_engine(database)
        try:
            result = asyncio.run(
                collect_in_process(
                    request_for(probe, "in-process"),
                    engine=engine,
                    store=LocalObjectStore(tmp_path / "objects"),
                )
            )
        finally:
            engine.dispose()
        assert result.executed == 2
        probe.assert_held_while_episodes_ran(2)


def test_collect_episodes_flow_holds_the_lock(
    prefect_harness: None, database: DatabaseSettings
) -> None:
    from flows.collect import collect_episodes

    with LockProbe(database, "flow") as probe:
        result = asyncio.run(collect_episodes(request=request_for(probe, "flow")))
        assert result.executed == 2
        probe.assert_held_while_episodes_ran(2)


def test_collect_shard_flow_holds_its_shard_lock(
    prefect_harness: None, database: DatabaseSettings
) -> None:
    from flows.shard import collect_shard

    with LockProbe(database, shard_lock_name("sharded", 0, 2)) as probe:
        result = asyncio.run(
            collect_shard(request=request_for(probe, "sharded"), shard_index=0, shard_count=2)
        )
        assert result.executed == 1  # shard 1 of 2: one of the two planned episodes
        probe.assert_held_while_episodes_ran(1)


def test_an_evaluation_holds_the_lock_and_ends_its_run(
    database: DatabaseSettings, tmp_path: Path
) -> None:
    """An evaluation is a collection run: the caller's policy on the caller's tasks, the
    run key's lock held while its episodes run, its run row ended by the collection."""
    from agent.policies import make_policy
    from collection.evaluation import evaluation_settings, run_evaluation
    from config.settings import load_settings
    from suites.builtin import builtin_suite

    settings = evaluation_settings(load_settings(), max_steps=2)
    tasks = builtin_suite().heldout_instances(1, templates=TEMPLATES)
    with LockProbe(database, "eval-probe") as probe:
        engine = make_engine(database)
        policy = make_policy(f"openai:{probe.base_url}#lock-probe", settings=PolicySettings())

        async def evaluate() -> list[Any]:
            try:
                return await run_evaluation(
                    policy,
                    tasks,
                    run_key="eval-probe",
                    suite="builtin",
                    settings=settings,
                    engine=engine,
                    store=LocalObjectStore(tmp_path / "objects"),
                )
            finally:
                await policy.aclose()

        try:
            episodes = asyncio.run(evaluate())
            with engine.connect() as conn:
                status = conn.execute(
                    text("SELECT status FROM collection_run WHERE run_key = 'eval-probe'")
                ).scalar_one()
        finally:
            engine.dispose()
        assert [e.task_id for e in episodes] == [t.task_id for t in tasks]
        assert status == "completed"
        probe.assert_held_while_episodes_ran(2)


def _lock_is_held(database: DatabaseSettings, name: str) -> bool:
    try:
        acquire_run_key(database, name).release()
    except RunKeyBusy:
        return True
    return False


def test_environment_sessions_hold_the_lock(database: DatabaseSettings, tmp_path: Path) -> None:
    """A server's sessions are episodes of one collection run: its key's lock is held while
    a session runs, free once the hub closed, and the run ended by the collection."""
    from agent.render import render_final
    from config.settings import load_settings
    from environment.actions import Action
    from environment.hub import HubConfig, open_hub
    from environment.selection import TaskSelection

    engine = make_engine(database)

    async def serve() -> list[bool]:
        held = []
        async with open_hub(
            HubConfig(run_key="env-lock", templates=["dir_tree"]),
            load_settings(),
            engine=engine,
            store=LocalObjectStore(tmp_path / "objects"),
        ) as hub:
            session, _ = await hub.reset(TaskSelection(template="dir_tree"))
            held.append(await asyncio.to_thread(_lock_is_held, database, "env-lock"))
            await hub.step(session, Action(message=render_final("done")))
        held.append(await asyncio.to_thread(_lock_is_held, database, "env-lock"))
        return held

    try:
        assert asyncio.run(serve()) == [True, False]
        with engine.connect() as conn:
            status = conn.execute(
                text("SELECT status FROM collection_run WHERE run_key = 'env-lock'")
            ).scalar_one()
    finally:
        engine.dispose()
    assert status == "completed"


def test_rl_rollouts_hold_the_lock(database: DatabaseSettings, tmp_path: Path) -> None:
    """GRPO's rollouts are one collection run per training run, and the training runs as
    its work: the rollout run key's lock is held for the whole training, then freed."""
    from collection.grpo_rollouts import rollout_run_key, run_grpo_rollouts
    from config.settings import load_settings
    from suites.builtin import builtin_suite

    engine = make_engine(database)
    key = rollout_run_key("lock")
    try:
        held = run_grpo_rollouts(
            "lock",
            builtin_suite().instances(1, templates=["dir_tree"]),
            load_settings(),
            lambda source: _lock_is_held(database, key),
            base_model_dir=tmp_path / "unused-model",
            engine=engine,
            store=LocalObjectStore(tmp_path / "objects"),
            qc_config=load_qc_config(),
        )
    finally:
        engine.dispose()
    assert held and not _lock_is_held(database, key)


@pytest.fixture
def cli_homes() -> Iterator[tuple[Path, Path]]:
    with local_prefect_home() as prefect_home, sandbox_state_dir() as state_dir:
        yield prefect_home, state_dir


def test_epiflow_collect_holds_the_lock(tmp_path: Path, cli_homes: tuple[Path, Path]) -> None:
    prefect_home, state_dir = cli_homes
    env = cli_env(tmp_path, prefect_home, state_dir)
    assert epiflow(env, "db", "upgrade", cwd=tmp_path).returncode == 0
    database = DatabaseSettings(url=env["EPIFLOW_DATABASE_URL"])
    with LockProbe(database, "cli") as probe:
        spec = f"openai:{probe.base_url}#lock-probe"
        done = epiflow(
            env,
            "collect", "--policy", spec, "--templates", ",".join(TEMPLATES),
            "--run-key", "cli", "--json",
            cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout)["executed"] == 2
        probe.assert_held_while_episodes_ran(2)


# ------------------------------------------------------------------ the source

COLLECTION_PATH = [
    *sorted((ROOT / "collection").glob("*.py")),
    ROOT / "flows" / "collect.py",
    ROOT / "flows" / "shard.py",
    ROOT / "flows" / "evaluate.py",
    ROOT / "cli" / "collect.py",
    ROOT / "cli" / "demo.py",
    *sorted((ROOT / "bench").glob("*.py")),
]
LIFECYCLE = "collection/lifecycle.py"
ONE_PLACE = {
    "plan_collection": "the plan",
    "make_run_policy": "the policy",
    "preflight_checks": "the checks",
    "acquire_run_key": "the run key's lock",
    "open_run": "the run row",
    "close_run": "the run's status",
}
"""What the collection path does in one place, `collection/lifecycle.py`."""


def _called(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }


def test_the_collection_path_plans_opens_locks_and_ends_in_one_place() -> None:
    callers: dict[str, list[str]] = {name: [] for name in ONE_PLACE}
    for path in COLLECTION_PATH:
        for name in _called(path) & set(ONE_PLACE):
            callers[name].append(str(path.relative_to(ROOT)))
    for name, where in callers.items():
        assert where == [LIFECYCLE], f"{ONE_PLACE[name]} ({name}) is called in {where}"
    assert not any("run_key_lock" in _called(path) for path in COLLECTION_PATH)
    # ... and each exactly once there: one plan, one open, one lock, one status writer.
    tree = ast.parse((ROOT / LIFECYCLE).read_text())
    counts = {name: 0 for name in ONE_PLACE}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            called = called or getattr(node.func, "id", "")
            if called in counts:
                counts[called] += 1
    assert counts == {
        "plan_collection": 1,
        "make_run_policy": 1,
        "preflight_checks": 1,
        "acquire_run_key": 1,
        "open_run": 1,
        "close_run": 1,
    }, counts


PACKAGES = sorted(
    path
    for path in ROOT.glob("*/**/*.py")
    if path.relative_to(ROOT).parts[0] not in {"tests", "storage", "migrations", ".venv"}
)
"""Every module of the project but storage's own (and the tests)."""


def test_run_rows_are_written_by_storage_and_the_lifecycle_alone() -> None:
    """A run's row is opened and closed (its status written) only by `storage` and
    `collection/lifecycle.py`; `Collection._end`, the one status writer, is called only
    there (by `Collection.run` and `Collection.abandon`)."""
    writers = {"open_run", "close_run", "_end"}
    where = {
        str(path.relative_to(ROOT)): sorted(_called(path) & writers)
        for path in PACKAGES
        if _called(path) & writers
    }
    assert where == {LIFECYCLE: ["_end", "close_run", "open_run"]}, where
    # run (its finish stage) and abandon:
    assert len(re.findall(r"self\._end\b", (ROOT / LIFECYCLE).read_text())) == 2


def test_the_collect_command_reads_no_storage_of_its_own() -> None:
    """`epiflow collect` is handed what it prints by its collection (`outcome`, and
    `stored_episodes` for the progress bar): neither the command (with its helpers) nor
    the progress bar imports anything from `storage`."""
    module = ast.parse((ROOT / "cli" / "collect.py").read_text())
    command = [
        node
        for node in module.body
        if isinstance(node, ast.FunctionDef)
        and (
            node.name == "collect" or node.name in {"_print_result", "_rerun_line", "_interrupted"}
        )
    ]
    assert len(command) == 4
    progress = ast.parse((ROOT / "cli" / "progress.py").read_text())
    for tree in (*command, progress):
        imported = _imports(tree)
        assert not [m for m in imported if m.split(".")[0] == "storage"], imported
