"""Seeded epiflow task instances → Harbor task directories whose tests run offline.

For each instance, `<out>/<suite>.<template>.<seed>/` holds:

- `task.toml` (schema 1.0): the instance's identity and difficulty under `[metadata]`,
  the verifier's timeout, the jail's default limits;
- `instruction.md`: the prompt;
- `environment/Dockerfile`: `FROM python:3.13-slim` (python3, sh and coreutils: what the
  built-in reference solutions and verifiers use), `WORKDIR /workspace`, and
  `COPY workspace/ /workspace/` of the instance's files (in `environment/workspace/`);
- `tests/test.sh`: installs the verifier's files at their absolute paths (from
  `tests/files/`), runs the verifier (`python3 -I -S` for `python3 -I -` scripts, as
  `Sandbox.run_python` does; else its argv) in `/workspace`, and writes the score of its
  last stdout line to `/logs/verifier/reward.txt`: nothing needs the network;
- `solution/solve.sh`: the reference solution as shell (`execute_shell` commands in
  `/workspace`, `write_file` as base64 heredocs; `read_file`/`list_dir` change nothing).
"""

from __future__ import annotations

import base64
import json
import posixpath
import shlex
from pathlib import Path

from tasks.types import TaskInstance

_COLLECT_SCORE = (
    "import json, sys\n"
    "lines = [l for l in sys.stdin.read().splitlines() if l.strip()]\n"
    "data = json.loads(lines[-1]) if lines else {}\n"
    "score = data.get('score') if isinstance(data, dict) else None\n"
    "print(float(score) if isinstance(score, (int, float)) else 0.0)\n"
)


def task_dir_name(task: TaskInstance) -> str:
    return f"{task.suite}.{task.template}.{task.seed}"


def _toml_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def solve_script(task: TaskInstance) -> str:
    lines = [
        "#!/bin/bash",
        f"# reference solution of {task.task_id} (epiflow export)",
        "set -e",
        "cd /workspace",
    ]
    for step in task.reference_solution:
        if step.tool == "execute_shell":
            lines.append(
                f"( cd /workspace && sh -c {shlex.quote(str(step.args['command']))} ) || true"
            )
        elif step.tool == "write_file":
            path = str(step.args["path"])
            target = path if path.startswith("/") else posixpath.join("/workspace", path)
            encoded = base64.b64encode(str(step.args.get("content", "")).encode()).decode()
            lines.append(f"mkdir -p {shlex.quote(posixpath.dirname(target))}")
            lines.append(
                f"base64 -d > {shlex.quote(target)} <<'EPIFLOW_EOF'\n{encoded}\nEPIFLOW_EOF"
            )
    return "\n".join(lines) + "\n"


def test_script(task: TaskInstance) -> str:
    spec = task.verifier
    lines = [
        "#!/bin/bash",
        f"# verifier of {task.task_id} (epiflow export): runs offline",
        "mkdir -p /logs/verifier",
    ]
    for path in sorted(spec.files):
        rel = path.lstrip("/")
        lines.append(
            f"mkdir -p {shlex.quote(posixpath.dirname(path))} && cp /tests/files/{shlex.quote(rel)} {shlex.quote(path)}"
        )
    inline = spec.inline_python
    if inline is not None:
        command = "python3 -I -S /tests/verifier.py " + " ".join(shlex.quote(a) for a in inline[1])
    else:
        command = " ".join(shlex.quote(a) for a in spec.argv)
        if spec.stdin is not None:
            command += " < /tests/verifier.stdin"
    lines += [
        f"cd /workspace && {command} > /tmp/epiflow-verifier.out",
        "status=$?",
        "cat /tmp/epiflow-verifier.out",
        'if [ "$status" -ne 0 ]; then echo 0 > /logs/verifier/reward.txt; exit 0; fi',
        f"python3 -I -S -c {shlex.quote(_COLLECT_SCORE)} < /tmp/epiflow-verifier.out > /logs/verifier/reward.txt",
    ]
    return "\n".join(lines) + "\n"


def export_task(task: TaskInstance, out: Path) -> Path:
    """Write `task` as a Harbor task directory under `out`; returns the directory."""
    if task.environment is not None:
        raise ValueError(f"{task.task_id} is already a Harbor task; export its directory instead")
    folder = out / task_dir_name(task)
    env = folder / "environment"
    (env / "workspace").mkdir(parents=True, exist_ok=True)
    (folder / "tests" / "files").mkdir(parents=True, exist_ok=True)
    (folder / "solution").mkdir(exist_ok=True)
    for rel, content in task.files.items():
        file = env / "workspace" / rel
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(content, encoding="utf-8")
    (env / "Dockerfile").write_text(
        "FROM python:3.13-slim\nWORKDIR /workspace\n"
        + ("COPY workspace/ /workspace/\n" if task.files else "")
    )
    (folder / "instruction.md").write_text(task.prompt, encoding="utf-8")
    (folder / "task.toml").write_text(
        'version = "1.0"\n\n[metadata]\n'
        f"difficulty = {_toml_str(['trivial', 'easy', 'medium', 'hard', 'expert'][task.difficulty - 1])}\n"
        f"category = {_toml_str('epiflow-' + task.suite)}\n"
        f"tags = [{_toml_str(task.template)}, {_toml_str('seed-' + str(task.seed))}]\n"
        f"epiflow_task_id = {_toml_str(task.task_id)}\n\n"
        f"[verifier]\ntimeout_sec = {max(task.verifier.timeout_s, 60.0)}\n\n"
        "[agent]\ntimeout_sec = 600.0\n\n"
        '[environment]\ncpus = 1\nmemory = "2G"\nstorage = "1G"\n'
    )
    for jail_path, text in task.verifier.files.items():
        target = folder / "tests" / "files" / jail_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    inline = task.verifier.inline_python
    if inline is not None:
        (folder / "tests" / "verifier.py").write_text(inline[0], encoding="utf-8")
    elif task.verifier.stdin is not None:
        (folder / "tests" / "verifier.stdin").write_text(task.verifier.stdin, encoding="utf-8")
    (folder / "tests" / "test.sh").write_text(test_script(task))
    (folder / "solution" / "solve.sh").write_text(solve_script(task))
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or path.suffix == ".sh" else 0o644)
    return folder
