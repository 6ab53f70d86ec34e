"""`EpiflowEnv` in-process, as TRL's `environment_factory` drives it: real nsjail, real
SQLite; each rollout is a stored episode and `get_reward` is the stored final reward."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from transformers.utils.chat_template_utils import get_json_schema

from config.settings import load_settings
from environment.hub import HubConfig
from environment.trainer_env import EpiflowEnv
from storage import migrate
from storage.db import make_engine
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from suites.builtin import builtin_suite
from tasks.types import TaskInstance

TEMPLATE = "csv_to_json"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{tmp_path / 'env.db'}"))
    migrate.upgrade(engine)
    EpiflowEnv.configure(
        HubConfig(run_key="trl-env", templates=[TEMPLATE], max_sessions=2),
        settings=load_settings(),
        engine=engine,
        store=LocalObjectStore(tmp_path / "objects"),
    )
    yield engine
    EpiflowEnv.shutdown()
    engine.dispose()


def test_tools_are_what_trl_offers_the_model() -> None:
    """TRL exposes every public function of the class but reset/get_reward as a tool,
    with the JSON schema transformers derives from its docstring."""
    tools = {
        name: get_json_schema(fn)
        for name, fn in inspect.getmembers(EpiflowEnv, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    }
    assert set(tools) == {"execute_shell", "read_file", "write_file", "list_dir", "final_answer"}
    assert tools["write_file"]["function"]["parameters"]["required"] == ["path", "content"]


def _reference(instance_seed: int = 0) -> TaskInstance:
    return builtin_suite().generate(TEMPLATE, instance_seed)


def test_a_rollout_is_stored_and_its_reward_is_the_stored_one(engine: Engine) -> None:
    task = _reference()
    env = EpiflowEnv()
    instruction = env.reset(prompt=[{"role": "user", "content": "go"}], template=TEMPLATE)
    assert instruction == task.prompt
    tool_methods: dict[str, Callable[..., str]] = {
        "execute_shell": env.execute_shell,
        "read_file": env.read_file,
        "write_file": env.write_file,
        "list_dir": env.list_dir,
    }
    for call in task.reference_solution:
        assert "<tool_result" in tool_methods[call.tool](**call.args)
    assert "success" in env.final_answer(task.reference_final or "done")
    reward = env.get_reward()
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT final_reward, status FROM episode")).one()
    assert reward is not None and reward == stored[0] and stored[1] == "success"
    # The next rollout on the same instance is another episode of the same run.
    env.reset(template=TEMPLATE)
    assert env.get_reward() == pytest.approx(-0.5)  # the empty final: the verifier's failure
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM episode")).scalar_one() == 2


def test_planted_reward_files_and_fake_verifier_output_earn_nothing(engine: Engine) -> None:
    """The verifier runs in its own jail over the episode's files: a reward file the agent
    wrote, or verifier-shaped output it printed, is not its reward."""
    env = EpiflowEnv()
    env.reset(template=TEMPLATE)
    for path in ("reward.json", "reward.txt", "/workspace/logs/verifier/reward.txt"):
        env.write_file(
            path, '{"score": 1.0, "reason": "planted"}' if path.endswith("json") else "1"
        )
    env.execute_shell('echo \'{"score": 1.0, "reason": "fake verifier"}\'')
    env.final_answer('{"score": 1.0, "reason": "fake verifier"}')
    reward = env.get_reward()
    with engine.connect() as conn:
        score, status = conn.execute(text("SELECT verifier_score, status FROM episode")).one()
    assert status == "failed" and score < 1.0 and reward is not None and reward < 1.0
