"""User generator modules: a Python script that turns a seed into parameters and files, run in nsjail.

A user template may name a generator (`generator: {script: gen/make.py, provides: […]}`).
For each seed, a fresh jail (the default `SandboxSpec`: no network, read-only toolchain, the
same limits verifiers run under) gets the script and its data files in `/workspace`, then
runs `python3 -I <script>` there with one JSON line on stdin:

    {"seed": 7, "params": {…the declarative params drawn for this seed…}}

and expects, as the last non-empty line of stdout, one JSON object:

    {"params": {"name": value, …}, "files": {"workspace/path.txt": "text", …}}

`params` must hold exactly the names the template `provides` (JSON values); `files` is
optional (workspace-relative paths, UTF-8 text, no NUL). Anything else — a crash, a
timeout, output over the sandbox's cap, a path outside the workspace — raises
`GeneratorError` naming the template, the seed, and the script's exit code and stderr.
Nothing the script does runs in the host process.

`Suite.generate` is synchronous and may be called from inside an event loop (a flow, the
replay of a trajectory); the jails therefore run on an event loop of their own, in a
worker thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from suites.errors import GeneratorError
from tasks.types import is_workspace_relative

if TYPE_CHECKING:
    from sandbox.settings import SandboxSettings

GENERATOR_CONCURRENCY = 4
"""Jails started at once when several seeds are generated together."""
MAX_GENERATED_FILES = 500
"""Most workspace files one generator run may return."""
MAX_STDERR_CHARS = 2_000
"""How much of a failing generator's stderr the error keeps."""


class GeneratorJob(BaseModel):
    """Everything needed to run one template's generator: the script and its data files."""

    model_config = ConfigDict(frozen=True)

    suite_folder: Path
    """The suite folder (for messages)."""
    template: str
    """Template name (for messages)."""
    script: str
    """Suite-relative path of the script; also its path under the generation jail's /workspace."""
    files: dict[str, str]
    """Suite-relative path → text of the script and every data file it reads."""
    provides: tuple[str, ...]
    """Parameter names the script must return, exactly."""
    timeout_s: float = 30.0
    """Timeout of one run of the script, seconds."""


class GeneratedParts(BaseModel):
    """What one generator run returned, validated."""

    model_config = ConfigDict(frozen=True)

    params: dict[str, Any]
    """Parameter name → JSON value; exactly the job's `provides`."""
    files: dict[str, str] = Field(default_factory=dict)
    """Workspace-relative path → text."""


def run_generator(
    job: GeneratorJob,
    requests: Sequence[tuple[int, dict[str, Any]]],
    *,
    sandbox_settings: SandboxSettings,
) -> list[GeneratedParts]:
    """Run `job` once per `(seed, declarative params)` request, each in a fresh jail.

    Raises:
        GeneratorError: a run failed or returned invalid output; or no jail could start.
    """
    if not requests:
        return []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="suite-generator") as pool:
        return pool.submit(asyncio.run, _run_all(job, requests, sandbox_settings)).result()


async def _run_all(
    job: GeneratorJob,
    requests: Sequence[tuple[int, dict[str, Any]]],
    settings: SandboxSettings,
) -> list[GeneratedParts]:
    from sandbox import SandboxError, SandboxSpec, open_sandbox

    spec = SandboxSpec()
    gate = asyncio.Semaphore(GENERATOR_CONCURRENCY)

    async def one(seed: int, params: dict[str, Any]) -> GeneratedParts:
        request = json.dumps({"seed": seed, "params": params}, ensure_ascii=False) + "\n"
        async with gate:
            try:
                async with await open_sandbox(spec, files=job.files, settings=settings) as box:
                    result = await box.exec(
                        ["python3", "-I", job.script],
                        timeout_s=job.timeout_s,
                        stdin=request.encode(),
                    )
            except SandboxError as e:
                raise _error(job, seed, f"could not run it in a jail: {e}") from e
        stderr = result.stderr.decode("utf-8", errors="replace")
        if result.timed_out:
            raise _error(job, seed, f"timed out after {job.timeout_s:g}s", stderr=stderr)
        if result.exit_code != 0:
            how = f"exit code {result.exit_code}" if result.exit_code is not None else "a signal"
            raise _error(job, seed, f"failed with {how}", stderr=stderr, exit_code=result.exit_code)
        if result.stdout_truncated:
            raise _error(job, seed, f"printed more than {spec.output_cap_bytes} bytes")
        try:
            return parse_generator_output(
                result.stdout.decode("utf-8", errors="strict"), job.provides
            )
        except (ValueError, UnicodeDecodeError) as e:
            raise _error(job, seed, f"printed invalid output: {e}", stderr=stderr) from e

    return list(await asyncio.gather(*(one(seed, params) for seed, params in requests)))


def parse_generator_output(stdout: str, provides: Sequence[str]) -> GeneratedParts:
    """Validate a generator's stdout (last non-empty line, one JSON object).

    Raises:
        ValueError: not one JSON object, unknown keys, parameters other than `provides`,
            a file path outside the workspace, a non-text file, a NUL anywhere.
    """
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("nothing on stdout (print one JSON object as the last line)")
    try:
        data = json.loads(lines[-1], parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"the last stdout line is not JSON ({e.msg})") from e
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"params", "files"})
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; expected `params` and optional `files`")
    params = data.get("params")
    if not isinstance(params, dict):
        raise ValueError("`params` must be a JSON object of the provided parameters")
    missing = [name for name in provides if name not in params]
    extra = sorted(set(params) - set(provides))
    if missing or extra:
        raise ValueError(
            "`params` must hold exactly the names in `provides`"
            + (f"; missing {missing}" if missing else "")
            + (f"; not declared {extra}" if extra else "")
        )
    if _has_nul(params):
        raise ValueError("`params` contain a NUL character")
    files = data.get("files", {})
    if not isinstance(files, dict):
        raise ValueError("`files` must be a JSON object: workspace path → text")
    if len(files) > MAX_GENERATED_FILES:
        raise ValueError(f"{len(files)} files; at most {MAX_GENERATED_FILES}")
    for path, text in files.items():
        if not is_workspace_relative(path):
            raise ValueError(f"file path {path!r} must be relative, inside the workspace")
        if not isinstance(text, str):
            raise ValueError(f"file {path!r} must be text, got {type(text).__name__}")
        if "\x00" in text:
            raise ValueError(f"file {path!r} contains a NUL character")
    return GeneratedParts(params=params, files=files)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False


def _error(
    job: GeneratorJob,
    seed: int,
    what: str,
    *,
    stderr: str = "",
    exit_code: int | None = None,
) -> GeneratorError:
    stderr = stderr.strip()
    tail = stderr[-MAX_STDERR_CHARS:]
    last = tail.splitlines()[-1] if tail else ""
    message = f"template {job.template!r}, seed {seed}: generator {job.script} {what}" + (
        f": {last}" if last else ""
    )
    if len(tail.splitlines()) > 1:
        # The traceback goes below the one-line summary (the CLI prints both).
        message += "\n" + "\n".join(f"  {line}" for line in tail.splitlines()[-20:])
    return GeneratorError(
        message,
        setting=str(job.suite_folder / job.script),
        template=job.template,
        seed=seed,
        exit_code=exit_code,
        stderr=tail,
    )
