"""`EpiflowEnv`: epiflow's sessions in-process, for TRL's `GRPOTrainer(environment_factory=…)`.

    EpiflowEnv.configure(HubConfig(run_key="grpo-1", templates=["csv_to_json"]))
    trainer = GRPOTrainer(model=…, train_dataset=rows, environment_factory=EpiflowEnv, …)
    trainer.train()
    EpiflowEnv.shutdown()   # every rollout stored, the run ended, no jail left
    # then gate the run like any collection run: epiflow qc --run grpo-1

Each instance is one rollout slot. `reset(**row)` starts a session (one episode in its
own jail) on the task the row's task columns name (`suite`, `template`,
`instance_seed`, `task_id`; other columns such as `prompt` are TRL's) and returns the
task's instruction, which TRL appends to the row's last user message. The sandbox tools
are the documented methods TRL offers the model (`execute_shell`, `read_file`,
`write_file`, `list_dir`), plus `final_answer`, which ends the episode; each returns the
observation the episode loop rendered (protocol v1's `<tool_result>`). `get_reward()`
ends the episode if the model did not (an empty final answer: the verifier judges the
workspace), and returns the stored episode's final reward — None for an infrastructure
outcome, which TRL treats as unscorable (no advantage), never as 0.

`EpiflowEnv` does not gate its run: TRL has used every reward when the run ends, and the
gate is the `qc-gate` flow, run on the run key like any collection run's (docs/trainers.md).

Every instance of the process shares one hub (`environment.hub`: one collection run, the
warm pool, the outbox), served on an event loop of its own in a background thread, since
TRL calls `reset`, the tools and `get_reward` synchronously.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

from sqlalchemy import Engine

from config.settings import Settings
from environment.actions import Action
from environment.errors import InfrastructureFailure, SessionError, UnknownTask
from environment.hub import HubConfig, SessionHub, open_hub
from environment.selection import TaskSelection
from environment.sessions import Session
from sandbox.settings import SandboxSettings
from storage.objects import ObjectStore
from suites.errors import SuiteError
from suites.registry import load_suite
from suites.settings import SuitesSettings

__all__ = ["EpiflowEnv", "dataset_rows"]

T = TypeVar("T")

TASK_COLUMNS = frozenset(TaskSelection.model_fields)
"""The dataset columns `reset` reads; TRL's own (`prompt`, …) are left to TRL."""


class _HubThread:
    """A hub served on its own event loop in a daemon thread."""

    def __init__(
        self,
        config: HubConfig,
        settings: Settings,
        engine: Engine | None,
        store: ObjectStore | None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="epiflow-env-hub", daemon=True
        )
        self.thread.start()
        self._context = open_hub(config, settings, engine=engine, store=store)
        self.hub: SessionHub = self.call(self._context.__aenter__())

    def call(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def close(self) -> None:
        try:
            self.call(self._context.__aexit__(None, None, None))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()


class EpiflowEnv:
    """One rollout slot of an epiflow environment (see the module docstring)."""

    _shared: ClassVar[_HubThread | None] = None
    _setup: ClassVar[
        tuple[HubConfig, Settings | None, Engine | None, ObjectStore | None] | None
    ] = None
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._session: Session | None = None
        self._final: dict[str, Any] | None = None

    # ------------------------------------------------------------- the process

    @classmethod
    def configure(
        cls,
        config: HubConfig,
        *,
        settings: Settings | None = None,
        engine: Engine | None = None,
        store: ObjectStore | None = None,
    ) -> None:
        """What the process's instances serve: `config` (run key, suite, templates,
        sessions), with `settings`, `engine` and `store` (default: the settings'). Takes
        effect at the first `reset`.

        This is the class's entry point for settings: `settings` not given are read from
        the environment (`load_settings()`) once, when the first `reset` opens the hub,
        which passes them down (suites, the sandbox of user generators, the loop)."""
        cls.shutdown()
        cls._setup = (config, settings, engine, store)

    @classmethod
    def shutdown(cls) -> None:
        """Close the process's hub: open sessions closed and stored, the run ended, every
        jail gone. Safe to call twice; also runs at exit."""
        with cls._guard:
            shared, cls._shared = cls._shared, None
        if shared is not None:
            shared.close()

    @classmethod
    def _hub(cls) -> _HubThread:
        with cls._guard:
            if cls._shared is None:
                if cls._setup is None:
                    raise SessionError("EpiflowEnv.configure(...) first: no run key is set")
                config, settings, engine, store = cls._setup
                if settings is None:
                    from config.settings import load_settings

                    settings = load_settings()
                cls._shared = _HubThread(config, settings, engine, store)
                atexit.register(cls.shutdown)
            return cls._shared

    # ---------------------------------------------------------------- a rollout

    def reset(self, **row: Any) -> str:
        """Start a new episode on the task the row's task columns name; returns its
        instruction. An episode still open is closed and stored first."""
        shared = self._hub()
        if self._session is not None and not self._session.done:
            shared.call(shared.hub.close(self._session, "reset before the episode ended"))
        self._final = None
        selection = TaskSelection.model_validate(
            {k: v for k, v in row.items() if k in TASK_COLUMNS}
        )
        self._session, first = shared.call(shared.hub.reset(selection))
        return str(first["observation"]["instruction"])

    def _step(self, action: Action) -> str:
        session = self._session
        if session is None:
            return "error: no episode: reset first"
        if self._final is not None or session.done:
            return "error: the episode has ended"
        shared = self._hub()
        try:
            result = shared.call(shared.hub.step(session, action))
        except SessionError as e:
            return f"error: {e}"
        if result["done"]:
            self._final = result
        return str(result["observation"].get("text") or "")

    def get_reward(self) -> float | None:
        """The episode's stored final reward (the episode ends now if it has not); None
        for an infrastructure outcome (TRL leaves an unscorable rollout out)."""
        session = self._session
        if session is None:
            return None
        if self._final is None and not session.done:
            shared = self._hub()
            try:
                self._final = shared.call(shared.hub.step(session, Action(final="")))
            except InfrastructureFailure:
                return None
        trajectory = session.trajectory
        if trajectory is None or trajectory.final_reward is None:
            return None
        return float(trajectory.final_reward)

    # -------------------------------------------------------- the sandbox tools

    def execute_shell(self, command: str) -> str:
        """Run a shell command (/bin/sh -c) in the sandbox, in /workspace.

        Args:
            command: The shell command to run.

        Returns:
            The command's exit code, stdout and stderr.
        """
        return self._step(Action(tool="execute_shell", arguments={"command": command}))

    def read_file(self, path: str) -> str:
        """Read a text file inside /workspace.

        Args:
            path: Path, absolute or relative to /workspace.

        Returns:
            The file's content.
        """
        return self._step(Action(tool="read_file", arguments={"path": path}))

    def write_file(self, path: str, content: str) -> str:
        """Write a file inside /workspace, creating parent directories and replacing it.

        Args:
            path: Path, absolute or relative to /workspace.
            content: The full new content of the file.

        Returns:
            What was written.
        """
        return self._step(Action(tool="write_file", arguments={"path": path, "content": content}))

    def list_dir(self, path: str) -> str:
        """List a directory inside /workspace: one entry per line, directories end in '/'.

        Args:
            path: Path, absolute or relative to /workspace.

        Returns:
            The directory's entries.
        """
        return self._step(Action(tool="list_dir", arguments={"path": path}))

    def final_answer(self, answer: str) -> str:
        """Give the final answer: the episode ends and the verifier checks the work.

        Args:
            answer: The final answer.

        Returns:
            The outcome and the final reward.
        """
        self._step(Action(final=answer))
        final = self._final
        if final is None:
            return "error: the episode did not end"
        observation = final["observation"]
        return f"episode ended: {observation['status']}, reward {observation.get('final_reward')}"


ROW_PROMPT = "Solve the task below with the tools; call final_answer when you are done."
"""The user message of a written row; `reset` appends the task's instruction to it."""


def dataset_rows(
    suite: str,
    *,
    templates: list[str] | None,
    tasks: int,
    seed: int,
    settings: SuitesSettings,
    sandbox: SandboxSettings,
) -> list[dict[str, Any]]:
    """One row per task instance for `EpiflowEnv`: TRL's conversational `prompt` and the
    task columns `reset` reads. The suite is found with the entry point's `settings`; a
    user generator runs in jails of its `sandbox` settings.

    Raises:
        UnknownTask: the suite or a template does not exist.
    """
    try:
        instances = load_suite(suite, settings=settings, sandbox=sandbox).instances(
            tasks, seed=seed, templates=templates
        )
    except SuiteError as e:
        raise UnknownTask(f"{suite}: {e}") from e
    return [
        {
            "prompt": [{"role": "user", "content": ROW_PROMPT}],
            "suite": task.suite,
            "template": task.template,
            "instance_seed": task.seed,
            "task_id": task.task_id,
        }
        for task in instances
    ]
