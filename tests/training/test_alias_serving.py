"""`epiflow models serve ALIAS` (issue 45 item 1), as a user runs it: the command in a
subprocess, the tiny local model registered twice (two checkpoints, same weights), SQLite
and a local object store, real `transformers serve` backends, the `openai` client.

The alias is served at one URL under the model name `champion`; a promotion, then a
rollback, each switch the answers to the other checkpoint (every answer names the
checkpoint that wrote it: the `model` field is the served directory, named by the id,
and the `X-Epiflow-Backend` header), each with one line giving the change's reason; the
old server stops once switched away from; SIGTERM leaves no server and no model copy
behind. The waits are on the command's own lines (events), each bounded by a deadline
only so that a broken command fails instead of hanging."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import Engine
from sqlmodel import Session

from core.owner import process_start_ticks
from models import ModelAliasChange
from storage import migrate
from storage.db import make_engine
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from tests.cli.local import EPIFLOW, bare_env, epiflow, one_error_line
from training.aliases import point_alias, rollback_alias
from training.settings import TrainingSettings

DEADLINE_S = 600.0
"""Bounds each wait for a line (a CPU server's first answer can take minutes on a busy
machine); nothing is timed by it."""


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[tuple[Engine, LocalObjectStore, dict[str, str]]]:
    """A migrated SQLite database and an object store, and the environment a command
    needs to use them."""
    url = f"sqlite:///{tmp_path / 'serve.db'}"
    engine = make_engine(DatabaseSettings(url=SecretStr(url)))
    migrate.upgrade(engine)
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    env = bare_env(
        EPIFLOW_DATABASE_URL=url,
        EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
        EPIFLOW_HOME=str(tmp_path / "home"),
    )
    yield engine, store, env
    engine.dispose()


class _Lines:
    """The command's stdout, line by line, read by a thread."""

    def __init__(self, stream: object) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, needle: str) -> str:
        """The next line containing `needle` (the lines before it are kept in `seen`)."""
        while True:
            try:
                line = self._queue.get(timeout=DEADLINE_S)
            except queue.Empty:
                raise AssertionError(f"no line with {needle!r}; lines: {self.seen}") from None
            if line is None:
                raise AssertionError(f"the command ended before {needle!r}; lines: {self.seen}")
            self.seen.append(line)
            if needle in line:
                return line


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (the command's `transformers serve` servers)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        if re.search(rf"^PPid:\s+{pid}$", text, flags=re.MULTILINE):
            found.append(int(status.parent.name))
    return found


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if process_start_ticks(p) is not None]


def _ask(url: str) -> tuple[str, str]:
    """One chat completion through the `openai` client: (the `model` it names, the backend
    header)."""
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="unused", timeout=DEADLINE_S, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="champion", messages=[{"role": "user", "content": "hello"}], max_tokens=2
    )
    return raw.parse().model, raw.headers["x-epiflow-backend"]


def test_serve_follows_a_promotion_and_a_rollback_at_one_url(
    registry: tuple[Engine, LocalObjectStore, dict[str, str]],
    tiny_base_model: Path,
    tiny_settings: TrainingSettings,
    tmp_path: Path,
) -> None:
    from training.pretrained import register_pretrained
    from training.registry import load_training_config, save_checkpoint

    engine, store, env = registry
    a = register_pretrained(engine, store, tiny_base_model, settings=tiny_settings)
    b = save_checkpoint(
        engine,
        store,
        training_run_id=None,
        model_dir=tiny_base_model,
        config=load_training_config(engine, store, a),
        parent_checkpoint_id=a,
    )
    point_alias(engine, store, "champion", a, reason="first champion", actor="test")
    command = [EPIFLOW, "models", "serve", "champion", "--port", "0", "--poll-s", "0.2"]
    with (tmp_path / "stderr.log").open("w") as stderr:
        proc = subprocess.Popen(
            [*command, "--torch-threads", "1"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        lines = _Lines(proc.stdout)
        first = lines.wait_for("serving alias 'champion'")
        assert f"checkpoint {a}" in first, first
        match = re.search(r" at (http://\S+/v1) as model 'champion'", first)
        assert match, first
        url = match.group(1)
        model, backend = _ask(url)
        assert (Path(model).name, backend) == (str(a), str(a))
        a_dir, a_servers = Path(model), _children(proc.pid)
        assert _alive(a_servers)

        point_alias(engine, store, "champion", b, reason="b beats a by 0.3", actor="test")
        reload = lines.wait_for("reloaded")
        assert f"checkpoint {a} -> {b}" in reload and "b beats a by 0.3" in reload, reload
        model, backend = _ask(url)
        assert (Path(model).name, backend) == (str(b), str(b))
        lines.wait_for(f"checkpoint {a} stopped")
        assert not _alive(a_servers), "the old checkpoint's server outlived the switch"
        assert not a_dir.exists()

        rollback_alias(engine, store, "champion", reason="b regressed", actor="test")
        reload = lines.wait_for("reloaded")
        assert f"checkpoint {b} -> {a}" in reload and "rollback" in reload, reload
        assert "b regressed" in reload
        model, backend = _ask(url)
        assert (Path(model).name, backend) == (str(a), str(a))
        servers = _children(proc.pid)
        assert _alive(servers)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=DEADLINE_S)
        if code != 128 + signal.SIGTERM and proc.stdout is not None:
            proc.stdout.close()
    assert code == 128 + signal.SIGTERM, (tmp_path / "stderr.log").read_text()[-3000:]
    assert not _alive(servers), "a transformers serve outlived the command"
    assert not Path(model).exists(), "the served copy of the checkpoint was left behind"
    assert "its servers are stopped" in lines.wait_for("alias 'champion': stopped")
    assert proc.stdout is not None
    proc.stdout.close()


def test_an_unset_alias_is_refused_in_one_line(
    registry: tuple[Engine, LocalObjectStore, dict[str, str]], tmp_path: Path
) -> None:
    _engine, _store, env = registry
    line = one_error_line(epiflow(env, "models", "serve", "nobody", "--port", "0", cwd=tmp_path))
    assert "alias 'nobody' was never set" in line


def test_an_alias_on_an_external_endpoint_is_refused_in_one_line(
    registry: tuple[Engine, LocalObjectStore, dict[str, str]], tmp_path: Path
) -> None:
    engine, _store, env = registry
    endpoint = "openai:http://models.example:8000/v1#big"
    with Session(engine) as session:
        session.add(
            ModelAliasChange(
                alias="champion",
                seq=1,
                action="set",
                checkpoint_id=None,
                policy_spec=endpoint,
                previous_checkpoint_id=None,
                reason="served elsewhere",
                evidence={},
                actor="test",
            )
        )
        session.commit()
    line = one_error_line(epiflow(env, "models", "serve", "champion", "--port", "0", cwd=tmp_path))
    assert f"external endpoint {endpoint}" in line, line
