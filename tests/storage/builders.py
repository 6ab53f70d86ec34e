"""Hand-built trajectories for storage tests."""

from __future__ import annotations

from datetime import timedelta

from agent.trajectory import (
    EpisodeStatus,
    FailureCategory,
    FileChange,
    InjectedFault,
    ParseKind,
    ResourceUsage,
    Step,
    Trajectory,
    episode_id_for,
    utcnow,
)


def make_trajectory(
    run_key: str = "run-1",
    task: str = "builtin/csv_to_json@1#0-abc",
    rollout: int = 0,
    *,
    stdout: bytes = b"a.csv\n",
    n_steps: int = 2,
) -> Trajectory:
    start = utcnow()
    steps = []
    for i in range(n_steps - 1):
        steps.append(
            Step(
                index=i,
                history_hash=f"{i:064x}",
                started_at=start + timedelta(seconds=i),
                raw_output=f'<tool_call id="c{i}" name="execute_shell">\n<arg name="command">ls</arg>\n</tool_call>',
                prompt_tokens=100 + i,
                completion_tokens=20,
                generation_latency_ms=12.5,
                parse_kind=ParseKind.TOOL_CALL,
                parse_tolerances=["stripped_markdown_fence"] if i == 0 else [],
                call_id=f"c{i}",
                tool="execute_shell",
                args={"command": "ls", "timeout": 5},
                observation="<tool_result …>",
                exit_code=0 if i % 2 == 0 else 2,
                stdout=stdout.decode("utf-8", "replace").replace("\x00", ""),
                stdout_bytes=stdout,
                stderr="",
                duration_ms=3.2,
                resources=ResourceUsage(cpu_ms=1.5, max_rss_kib=2048),
                files_changed=[
                    FileChange(path="out.json", change="created", size=10, sha256="0" * 64)
                ],
                injected_fault=InjectedFault(kind="latency", detail={"latency_ms": 1200})
                if i == 1
                else None,
                immediate_reward=0.01,
                **{"return": 0.5},
            )
        )
    steps.append(
        Step(
            index=n_steps - 1,
            history_hash="f" * 64,
            raw_output="<final>done</final>",
            parse_kind=ParseKind.FINAL,
            final_answer="done",
        )
    )
    return Trajectory(
        episode_id=episode_id_for(run_key, task, rollout),
        run_key=run_key,
        task_id=task,
        rollout_index=rollout,
        suite="builtin",
        suite_version="1",
        template="csv_to_json",
        task_version="1",
        instance_seed=7,
        difficulty=1,
        prompt="Convert data.csv to JSON.",
        policy="scripted:oracle",
        tool_versions={"execute_shell": "1"},
        sandbox_spec_hash="s" * 64,
        fault_profile={"latency_p": 0.1},
        fault_seed=3,
        started_at=start,
        ended_at=start + timedelta(seconds=5),
        status=EpisodeStatus.SUCCESS,
        failure_category=FailureCategory.SUCCESS,
        verifier_score=1.0,
        verifier_reason="ok",
        final_answer="done",
        final_reward=1.0,
        total_reward=1.02,
        steps=steps,
    )
