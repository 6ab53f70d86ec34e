"""What an operator sees in the Prefect UI, checked through a real `prefect server` and
`epiflow serve` (real nsjail, SQLite, the tiny local model, TRL):

The nightly-collect deployment runs a small noisy collection with the gate; the gate
triggers the train deployment, whose run is followed by an evaluation against the base
checkpoint. Then the qc-gate and evaluate deployments run on their own. Asserted through
Prefect's API: every stage's task runs, the progress artifacts, the loss table, the links,
the evaluation's comparison, no `running` row in SQL, and logs within a line budget with
no bytecode disassembly. Headless Chromium (when installed) renders the collect run form
(dropdowns, help text) and the train flow run page (its task runs), and keeps screenshots
under EPIFLOW_SCREENSHOT_DIR.

Robust under load: generous deadlines, every wait polls with a deadline, no fixed sleeps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.services.chromium import live_page_dom, require_chromium, run_chromium
from tests.services.prefect_server import PrefectServer

pytestmark = pytest.mark.slow

DEPLOYMENTS = {
    "nightly-collect",
    "nightly-champion",
    "qc-gate",
    "train",
    "evaluate",
    "shard",
    "monitor",
}
TEMPLATES = ["csv_to_json", "dir_tree"]
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
DISASSEMBLY = re.compile(
    r"\b(LOAD_(FAST|CONST|GLOBAL|ATTR|NAME|DEREF)|STORE_FAST|RETURN_VALUE|CALL_FUNCTION"
    r"|BINARY_OP|Disassembly of)\b"
)
LOG_BUDGET = 80
"""Most log lines a flow run of this size may write (the issue counted 538 for training)."""

STAGES = {
    "collect-episodes": {
        "plan-collection",
        "open-run",
        "run-episodes",
        "finish-run",
        "publish-summary",
    },
    "qc-gate": {
        "load-episodes",
        "rule-judge",
        "features",
        "gx-suites",
        "publish-data-docs",
        "write-verdicts",
        "trigger-training",
    },
    "train": {"dataset-snapshot", "base-model", "train", "register-checkpoint"},
    "evaluate": {"evaluation-episodes", "evaluation-metrics", "compare-checkpoints"},
}


@dataclass
class Api:
    url: str
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One API call; a loaded server's 5xx (its database busy) or a dropped connection
        is asked again until a deadline."""
        deadline = time.monotonic() + 180
        while True:
            try:
                response = self.client.request(method, self.url + path, json=body)
                if response.status_code < 500:
                    response.raise_for_status()
                    return response.json()
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.TransportError as e:
                problem = repr(e)
            assert time.monotonic() < deadline, f"{method} {path}: {problem}"
            # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
            time.sleep(1)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("POST", path, body)

    def get(self, path: str) -> Any:
        return self._call("GET", path)

    def wait_for(self, flow_run_id: str, deadline: float) -> dict[str, Any]:
        """Poll a flow run until it reaches a terminal state (or the deadline)."""
        while True:
            run = self.get(f"/flow_runs/{flow_run_id}")
            if run["state_type"] in TERMINAL:
                return dict(run)
            assert time.monotonic() < deadline, f"flow run {flow_run_id} still {run['state_type']}"
            # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
            time.sleep(1)

    def flow_runs(self, flow_name: str) -> list[dict[str, Any]]:
        return list(
            self.post(
                "/flow_runs/filter",
                {
                    "flows": {"name": {"any_": [flow_name]}},
                    # not the nightly schedule's future runs
                    "flow_runs": {"state": {"type": {"not_any_": ["SCHEDULED"]}}},
                    "sort": "EXPECTED_START_TIME_ASC",
                },
            )
        )

    def task_names(self, flow_run_id: str) -> list[str]:
        runs = self.post(
            "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200}
        )
        return [r["name"] for r in runs]

    def artifacts(self, flow_run_id: str) -> list[dict[str, Any]]:
        return list(
            self.post("/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
        )

    def logs(self, flow_run_id: str) -> list[str]:
        lines: list[str] = []
        while True:
            page = self.post(
                "/logs/filter",
                {
                    "logs": {"flow_run_id": {"any_": [flow_run_id]}},
                    "limit": 200,
                    "offset": len(lines),
                    "sort": "TIMESTAMP_ASC",
                },
            )
            lines += [str(entry["message"]) for entry in page]
            if len(page) < 200:
                return lines


@dataclass
class Story:
    server: PrefectServer
    api: Api
    db: Path
    deployments: dict[str, dict[str, Any]]
    runs: dict[str, dict[str, Any]]
    """The flow run of each flow name, as it ended."""


def _env(server: PrefectServer, tmp: Path) -> dict[str, str]:
    return server.env(
        EPIFLOW_PREFECT_API_URL=server.api_url,
        EPIFLOW_DATABASE_URL=f"sqlite:///{tmp / 'ui.db'}",
        EPIFLOW_OBJECTS_URL=str(tmp / "objects"),
        TQDM_DISABLE="1",
    )


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    from storage import migrate
    from storage.db import make_engine
    from storage.settings import DatabaseSettings

    tmp = tmp_path_factory.mktemp("ui")
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{tmp / 'ui.db'}"))
    migrate.upgrade(engine)
    engine.dispose()
    server = PrefectServer()
    server.start(timeout=240)
    log = (tmp / "serve.log").open("wb")
    serving = subprocess.Popen(
        [str(Path(sys.executable).parent / "epiflow"), "serve"],
        env=_env(server, tmp),
        cwd=tmp,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    api = Api(server.api_url)
    try:
        deadline = time.monotonic() + 240
        found: dict[str, dict[str, Any]] = {}
        while not set(found) >= DEPLOYMENTS:  # every one served (there may be more)
            assert serving.poll() is None, "epiflow serve exited"
            assert time.monotonic() < deadline, f"deployments missing: {DEPLOYMENTS - set(found)}"
            found = {d["name"]: d for d in api.post("/deployments/filter", {})}
            # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
            time.sleep(1)
        runs = _drive(api, found)
        yield Story(server, api, tmp / "ui.db", found, runs)
    finally:
        os.killpg(serving.pid, signal.SIGTERM)
        try:
            serving.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(serving.pid, signal.SIGKILL)
            serving.wait()
        log.close()
        api.client.close()
        server.stop()


def _drive(api: Api, deployments: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """nightly-collect (+ gate → train deployment → evaluate), then qc-gate and evaluate
    on their own; returns the last run of each flow."""
    evaluation = {"instances": 1, "templates": TEMPLATES[:1], "max_steps": 2, "max_new_tokens": 16}
    collect = api.post(
        f"/deployments/{deployments['nightly-collect']['id']}/create_flow_run",
        {
            "parameters": {
                "request": {
                    "suite": "builtin",
                    "policy": "scripted:noisy",
                    "tasks": 1,
                    "rollouts": 2,
                    "concurrency": 4,
                    "batch_size": 2,
                    "templates": TEMPLATES,
                    "run_key": "ui-run",
                },
                "gate": True,
                "gate_options": {
                    "trigger": "deployment",
                    "training_threshold": 0.5,
                    "train_max_steps": 3,
                    "evaluation": evaluation,
                },
            }
        },
    )
    deadline = time.monotonic() + 1500
    ended = api.wait_for(collect["id"], deadline)
    assert ended["state_type"] == "COMPLETED", (ended["state"], api.logs(collect["id"])[-30:])
    while not api.flow_runs("train"):
        assert time.monotonic() < deadline, "the gate started no train run"
        # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
        time.sleep(1)
    [train] = api.flow_runs("train")
    train = api.wait_for(train["id"], deadline)
    assert train["state_type"] == "COMPLETED", (train["state"], api.logs(train["id"])[-30:])
    # The other two deployments on their own: the gate again (it does not train twice)
    # and the evaluation of the new checkpoint.
    qc = api.post(
        f"/deployments/{deployments['qc-gate']['id']}/create_flow_run",
        {"parameters": {"run": "ui-run", "trigger": "none"}},
    )
    assert api.wait_for(qc["id"], deadline)["state_type"] == "COMPLETED", api.logs(qc["id"])[-30:]
    checkpoint = _checkpoint_of(api, train["id"])
    ev = api.post(
        f"/deployments/{deployments['evaluate']['id']}/create_flow_run",
        {
            "parameters": {
                "checkpoint": checkpoint,
                "instances": 1,
                "templates": TEMPLATES[:1],
                "max_steps": 2,
                "max_new_tokens": 16,
                "compare_previous": False,
            }
        },
    )
    assert api.wait_for(ev["id"], deadline)["state_type"] == "COMPLETED", api.logs(ev["id"])[-30:]
    return {name: api.flow_runs(name)[0] for name in STAGES} | {
        "train": train,
        "collect-episodes": ended,
    }


def _checkpoint_of(api: Api, train_run_id: str) -> str:
    [artifact] = [
        a
        for a in api.artifacts(train_run_id)
        if (a.get("key") or "").startswith("train-") and a["type"] == "markdown"
    ]
    found = re.search(r"\*\*checkpoint_id\*\*: ([0-9a-f-]{36})", artifact["data"])
    assert found, artifact["data"]
    return found.group(1)


def test_every_stage_is_a_task_run(story: Story) -> None:
    for flow_name, stages in STAGES.items():
        for run in story.api.flow_runs(flow_name):
            names = set(story.api.task_names(run["id"]))
            # a task run is named after its task plus a short suffix ("train-3fa")
            missing = stages - {re.sub(r"-[0-9a-f]{3}$|-\d+$", "", n) for n in names}
            assert not missing, (flow_name, sorted(names))


def test_progress_artifacts_end_at_100_percent(story: Story) -> None:
    collect = story.api.artifacts(story.runs["collect-episodes"]["id"])
    [progress] = [a for a in collect if a["type"] == "progress"]
    assert progress["data"] == pytest.approx(100.0)
    assert "4 / 4 episodes" in progress["description"]
    train = story.api.artifacts(story.runs["train"]["id"])
    [progress] = [a for a in train if a["type"] == "progress"]
    assert progress["data"] == pytest.approx(100.0)
    assert progress["description"] == "step 3 / 3"


def test_loss_table_has_every_step(story: Story) -> None:
    train = story.api.artifacts(story.runs["train"]["id"])
    tables = [a for a in train if a["type"] == "table" and (a.get("key") or "").endswith("-loss")]
    assert tables
    # Keyed by the training's dataset snapshot, like its progress and summary: not one
    # key shared by every training.
    [key] = {a["key"] for a in tables}
    dataset = key.removeprefix("train-").removesuffix("-loss")
    assert {a.get("key") for a in train} >= {f"train-{dataset}", f"train-{dataset}-progress"}
    rows = max(tables, key=lambda a: a["created"])["data"]  # the newest version
    rows = rows if isinstance(rows, list) else json.loads(rows)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["loss"] > 0 and r["learning_rate"] is not None for r in rows)


def test_links_and_comparison(story: Story) -> None:
    api = story.api
    gates = api.flow_runs("qc-gate")
    first_gate = gates[0]

    # The gate report (`qc-<run key>`); the data docs' link artifact (`qc-docs-…`) is
    # markdown too (Prefect stores a link as a markdown link).
    def reports(run_id: str, prefix: str) -> list[dict[str, Any]]:
        return [
            a
            for a in api.artifacts(run_id)
            if a["type"] == "markdown"
            and (a.get("key") or "").startswith(prefix)
            and not (a.get("key") or "").startswith(("qc-docs-", "checkpoint-"))
        ]

    [qc_artifact] = reports(first_gate["id"], "qc-")
    [docs_link] = [
        a for a in api.artifacts(first_gate["id"]) if a.get("key", "").startswith("qc-docs-")
    ]
    assert docs_link["data"].startswith("[Great Expectations data docs](")
    train_id = story.runs["train"]["id"]
    assert f"/runs/flow-run/{train_id}" in qc_artifact["data"]
    assert "training triggered: **yes" in qc_artifact["data"]
    # the gate run on its own found the run already trained on
    [again] = reports(gates[-1]["id"], "qc-")
    assert "training triggered: **no**" in again["data"]
    # the triggered training was evaluated against its base, and links that evaluation
    evaluations = api.flow_runs("evaluate")
    followed = [e for e in evaluations if e.get("parent_task_run_id")]
    assert len(followed) == 1
    [train_artifact] = reports(train_id, "train-")
    [checkpoint_link] = [
        a for a in api.artifacts(train_id) if (a.get("key") or "").startswith("checkpoint-")
    ]
    assert checkpoint_link["data"].startswith("[Checkpoint (the HF model directory)](")
    assert f"/runs/flow-run/{followed[0]['id']}" in train_artifact["data"]
    [comparison] = [a for a in api.artifacts(followed[0]["id"]) if a["type"] == "markdown"]
    assert "| completion_rate |" in comparison["data"]
    assert "compared with `" in comparison["data"]  # the base checkpoint


def test_no_row_is_left_running(story: Story) -> None:
    with sqlite3.connect(story.db) as conn:
        runs = conn.execute("SELECT run_key, status FROM collection_run").fetchall()
        trainings = conn.execute("SELECT status FROM training_run").fetchall()
    assert runs and all(status == "completed" for _, status in runs), runs
    assert {key for key, _ in runs} >= {"ui-run"} and sum(
        k.startswith("eval-") for k, _ in runs
    ) == 2
    assert trainings == [("completed",)]


def test_logs_are_readable(story: Story) -> None:
    for flow_name in STAGES:
        for run in story.api.flow_runs(flow_name):
            lines = story.api.logs(run["id"])
            print(
                f"{flow_name} {run['name']}: {len(lines)} log lines"
            )  # the closing note's figures
            assert lines, flow_name
            assert len(lines) <= LOG_BUDGET, (flow_name, len(lines), lines[:40])
            noisy = [line for line in lines if DISASSEMBLY.search(line)]
            assert not noisy, (flow_name, noisy[:5])
            assert not [line for line in lines if line.lstrip().startswith("{'loss'")]
    train_lines = story.api.logs(story.runs["train"]["id"])
    # one INFO line per stage, with its figures
    for stage in (
        "dataset-snapshot:",
        "base-model:",
        "train: sft, 3 steps",
        "register-checkpoint:",
    ):
        assert any(stage in line for line in train_lines), (stage, train_lines)
    collect_lines = story.api.logs(story.runs["collect-episodes"]["id"])
    assert any(line.startswith("run-episodes: 4 episodes run") for line in collect_lines)


def _screenshot_dir(tmp_path: Path) -> Path:
    return Path(os.environ.get("EPIFLOW_SCREENSHOT_DIR", tmp_path))


def test_collect_run_form_shows_dropdowns_and_help(story: Story, tmp_path: Path) -> None:
    chromium = require_chromium("the collect run form")
    deployment = story.deployments["nightly-collect"]["id"]
    page = f"http://127.0.0.1:{story.server.port}/deployments/deployment/{deployment}/run"
    dom = live_page_dom(chromium, page, showing=["<select"])
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
    for phrase in (
        "Task instances per template.",  # CollectRequest field descriptions
        "Fault injection: a preset",
        "CPUs the jail may use",  # SandboxSpec field descriptions
        "Run the qc-gate flow on the result",  # flow parameter descriptions (docstring)
        "How the gate judges and when it trains",
        "Quality-weighted volume since the last training that triggers the next",
    ):
        assert phrase in text, phrase
    # dropdowns: the policy and fault presets, the trigger mode
    selects = re.findall(r"<select.*?</select>", dom, re.DOTALL)
    options = [set(re.findall(r"<option[^>]*>\s*([^<]*?)\s*</option>", s)) for s in selects]
    for choices in (
        {"scripted:oracle", "scripted:noisy", "scripted:idle"},
        {"none", "light", "heavy"},
        {"deployment", "inline", "none"},
    ):
        assert any(choices <= found for found in options), (choices, options)
    target = _screenshot_dir(tmp_path) / "prefect-collect-run-form.png"
    run_chromium(chromium, "--window-size=1400,2400", f"--screenshot={target}", page)
    assert target.exists() and target.stat().st_size > 10_000


def test_train_flow_run_page_shows_its_task_runs(story: Story, tmp_path: Path) -> None:
    chromium = require_chromium("the train flow run page")
    run_id = story.runs["train"]["id"]
    page = f"http://127.0.0.1:{story.server.port}/runs/flow-run/{run_id}?tab=Task+Runs"
    dom = live_page_dom(chromium, page, showing=list(STAGES["train"]))
    assert "did not generate any task" not in dom
    for name in STAGES["train"]:
        assert name in dom, name
    target = _screenshot_dir(tmp_path) / "prefect-train-flow-run.png"
    run_chromium(chromium, f"--screenshot={target}", page)
    assert target.exists() and target.stat().st_size > 10_000
