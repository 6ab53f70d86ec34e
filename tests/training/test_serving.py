"""A checkpoint served by a real `transformers serve`, collected through `openai:` (issue 22
item 2): the tiny locally built base model, a real server process on a loopback port, real
sandboxes and SQLite. The episodes are the model's (it is untrained, so they fail as the
agent's, never as infrastructure), every step carries the server's usage and model name,
and the server is gone once the block exits."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

from sqlalchemy import Engine, text

from agent.serving import serve_checkpoint, serve_command
from agent.settings import LoopSettings, PolicySettings
from agent.trajectory import Trajectory
from collection.request import CollectRequest
from collection.runner import collect_in_process
from config.settings import load_settings
from storage.objects import LocalObjectStore


def test_collect_through_transformers_serve(
    tiny_base_model: Path, engine: Engine, store: LocalObjectStore, tmp_path: Path
) -> None:
    # Few tokens, two turns per episode: the server and the path are under test, not the
    # untrained model's answers.
    settings = dataclasses.replace(
        load_settings(),
        policy=PolicySettings(max_tokens=8, request_timeout_s=300),
        loop=LoopSettings(max_steps=2),
    )
    with serve_checkpoint(
        tiny_base_model, log_path=tmp_path / "serve.log", policy=settings.policy
    ) as served:
        request = CollectRequest(
            run_key="served",
            policy=served.policy_spec,
            tasks=1,
            concurrency=2,
            templates=["csv_to_json", "dir_tree"],
        )
        result = asyncio.run(
            collect_in_process(request, engine=engine, store=store, settings=settings)
        )
        pid = served.pid
        rss_kib = _rss_kib(pid)
    assert result.episodes == 2
    assert not {"endpoint_error", "policy_error", "env_error"} & set(result.by_status)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT completion_tokens, prompt_tokens, response_model FROM step")
        ).all()
    assert rows
    assert all(c and p and m == str(tiny_base_model.resolve()) for c, p, m in rows)
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, "transformers serve outlived serve_checkpoint"
    assert "Uvicorn running" in (tmp_path / "serve.log").read_text()
    # The KV cache is sized for the job, not at 60% of the machine's RAM (transformers'
    # CPU default: 14 GB for SmolLM2 on a 23 GB machine).
    assert 0 < rss_kib < 3 * 1024 * 1024, f"transformers serve held {rss_kib // 1024} MiB"


def _rss_kib(pid: int) -> int:
    """Resident memory of the server process and its children, KiB (from /proc)."""
    total = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":", 1) for line in status.read_text().splitlines() if ":" in line
            )
        except OSError:
            continue
        if int(status.parent.name) == pid or fields.get("PPid", "").strip() == str(pid):
            total += int(fields.get("VmRSS", "0 kB").split()[0])
    return total


def test_the_server_command_sizes_continuous_batching_for_the_job(tmp_path: Path) -> None:
    def flag(command: list[str], name: str) -> str:
        return command[command.index(name) + 1]

    command = serve_command(tmp_path, port=8123, cache_tokens=32_768, max_batch_tokens=2048)
    assert command[1:3] == ["serve", str(tmp_path)] and "--continuous-batching" in command
    assert flag(command, "--cb-num-blocks") == "128"  # 256-token blocks
    assert flag(command, "--cb-max-batch-tokens") == "2048"
    assert flag(serve_command(tmp_path, port=8123, cache_tokens=300), "--cb-num-blocks") == "2"
    assert "--cb-max-batch-tokens" not in serve_command(tmp_path, port=8123)  # its default
    plain = serve_command(tmp_path, port=8123, continuous_batching=False)
    assert not any(arg.startswith(("--continuous", "--cb-")) for arg in plain)


def test_an_evaluation_through_the_served_checkpoint_in_its_prompt_style(
    tiny_base_model: Path, engine: Engine, store: LocalObjectStore, tmp_path: Path
) -> None:
    """`bench/loop.py --recipe smollm2`'s evaluation path on one held-out episode: the
    checkpoint served with one torch thread, `openai:` with the compact prompt it was
    trained on, `run_evaluation` in a real sandbox, the rates of `evaluation_metrics`."""
    from agent.policies import make_policy
    from agent.prompt import PromptStyle, render_system_prompt
    from collection.evaluation import evaluation_settings, run_evaluation
    from sandbox.tool_specs import BUILTIN_TOOLS
    from suites.builtin import builtin_suite
    from training.evaluation import evaluation_metrics
    from training.trainers.common import load_tokenizer

    tasks = builtin_suite().heldout_instances(1, templates=["dir_tree"])
    policy_settings = PolicySettings(request_timeout_s=300)
    with serve_checkpoint(
        tiny_base_model, log_path=tmp_path / "serve.log", policy=policy_settings, torch_threads=1
    ) as served:
        policy = make_policy(
            f"{served.policy_spec}?max_tokens=8&prompt_style=compact", settings=policy_settings
        )
        settings = evaluation_settings(load_settings(), max_steps=2, max_parse_failures=1)

        async def episodes() -> list[Trajectory]:
            try:
                return await run_evaluation(
                    policy,
                    tasks,
                    run_key="served-eval",
                    suite="builtin",
                    settings=settings,
                    engine=engine,
                    store=store,
                )
            finally:
                await policy.aclose()

        trajectories = asyncio.run(episodes())
    metrics = evaluation_metrics(trajectories, tasks)
    assert (metrics.n_episodes, metrics.n_infrastructure) == (1, 0)
    assert metrics.completion_rate == 0.0  # untrained: the agent's failure, not the server's
    (first, *_) = trajectories[0].steps
    # The server was shown the compact prompt: its prompt token count is that chat's.
    chat = [
        {
            "role": "system",
            "content": render_system_prompt(BUILTIN_TOOLS.values(), PromptStyle.COMPACT),
        },
        {"role": "user", "content": tasks[0].prompt},
    ]
    prompt_ids = load_tokenizer(tiny_base_model).apply_chat_template(
        chat, add_generation_prompt=True, return_dict=True
    )["input_ids"]
    assert first.prompt_tokens == len(prompt_ids)


def test_an_abort_stops_a_server_still_loading(tiny_base_model: Path, tmp_path: Path) -> None:
    """`abort` (how `epiflow models serve` stops a checkpoint it is still starting) ends
    the readiness wait with an `EndpointError` and leaves no server behind."""
    import threading

    import pytest

    from agent.errors import EndpointError

    abort = threading.Event()
    abort.set()
    with (
        pytest.raises(EndpointError, match="stopped before it answered"),
        serve_checkpoint(
            tiny_base_model,
            log_path=tmp_path / "serve.log",
            policy=PolicySettings(),
            abort=abort,
        ),
    ):
        pass
    model = str(tiny_base_model.resolve())
    servers = [
        p
        for p in Path("/proc").glob("[0-9]*/cmdline")
        if _cmdline(p).count(model) and "serve" in _cmdline(p)
    ]
    assert not servers, "the aborted transformers serve is still running"


def _cmdline(path: Path) -> str:
    try:
        return path.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
