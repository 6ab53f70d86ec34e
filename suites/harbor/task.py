"""A Harbor task directory, parsed and checked: `task.toml`, `instruction.md`,
`environment/Dockerfile` (+ build context), `tests/test.sh`, `solution/solve.sh` (optional).

`task.toml` schema 1.0 (`version = "1.0"`) and 1.1 (`schema_version = "1.1"` with a
`[task]` table naming the task); `[[steps]]` (multi-step tasks) are refused. What is
honoured: `[agent] timeout_sec`, `[verifier] timeout_sec`, `[environment] cpus`,
`memory` ("2G", "512M") or `memory_mb`, `storage` or `storage_mb`, `build_timeout_sec`;
`[metadata]` difficulty, category and tags (kept as columns); a prebuilt `docker_image`
is recorded and ignored (the Dockerfile is built). Every problem is one line naming the
file and the field, with its `RefusalCategory`: a docker-compose environment is
`multi-container`; a task that declares the agent needs the network (`network.py`) is
`network-agent`; one whose verifier downloads is `network-verifier`; one whose reference
solution or verifier needs root (`privilege.py`) is `needs-root`;
the rest is `malformed`.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from suites.harbor.errors import HarborTaskError, RefusalCategory
from suites.harbor.network import agent_network, solution_fetch, verifier_fetch
from suites.harbor.privilege import solution_root

TASK_FILE = "task.toml"
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
"""An environment holding one of these is multi-container (refused: `multi-container`)."""
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_UNIT_MIB = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}
DIFFICULTY_LEVEL = {"trivial": 1, "easy": 2, "medium": 3, "hard": 4, "expert": 5, "very hard": 5}
"""Harbor's difficulty labels → epiflow's 1 … 5 (unknown labels: 3)."""


class HarborTask(BaseModel):
    """One parsed Harbor task directory."""

    model_config = ConfigDict(frozen=True)

    path: Path
    """The task directory."""
    name: str
    """`[task] name` (schema 1.1) or the directory name, lower-cased, `/` → `.`."""
    version: str
    """The task's version (`[task] version`, else the top-level `version`)."""
    schema_version: str
    content_hash: str
    """sha256 of every file of the directory (paths and bytes): part of the task identity."""
    instruction: str
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    build_timeout_s: float = 900.0
    cpus: int = 1
    memory_mib: int = 2048
    storage_mib: int = 10240
    difficulty_label: str = ""
    category: str = ""
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = Field(default_factory=dict)
    """The whole `[metadata]` table."""
    docker_image: str | None = None
    """A prebuilt image the task names (not pulled: the Dockerfile is built instead)."""

    @property
    def difficulty(self) -> int:
        return DIFFICULTY_LEVEL.get(self.difficulty_label.lower(), 3)

    @property
    def dockerfile(self) -> Path:
        return self.path / "environment" / "Dockerfile"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solve_script(self) -> Path | None:
        path = self.path / "solution" / "solve.sh"
        return path if path.is_file() else None


def is_task_dir(path: Path) -> bool:
    return (path / TASK_FILE).is_file()


def content_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _size_mib(value: object, file: Path, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise HarborTaskError(file, field, f'expected a size such as "2G" or "512M", got {value!r}')
    if isinstance(value, int | float):
        return int(value)
    match = _SIZE.match(value)
    if not match:
        raise HarborTaskError(file, field, f'expected a size such as "2G" or "512M", got {value!r}')
    return max(1, int(float(match.group(1)) * _UNIT_MIB[match.group(2).upper()]))


def _number(table: dict[str, Any], key: str, file: Path, field: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise HarborTaskError(file, field, f"expected a positive number, got {value!r}")
    return float(value)


def _table(data: dict[str, Any], key: str, file: Path) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise HarborTaskError(file, key, f"expected a table, got {type(value).__name__}")
    return value


def load_task(path: Path) -> HarborTask:
    """Parse and check the Harbor task directory `path`.

    Raises:
        HarborTaskError: a missing file, a malformed field, a docker-compose environment or
            a declared need of the network (one line: file, field and category).
    """
    toml_path = path / TASK_FILE
    try:
        data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise HarborTaskError(toml_path, "<file>", "missing") from e
    except (OSError, UnicodeDecodeError) as e:
        raise HarborTaskError(toml_path, "<file>", f"cannot be read: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise HarborTaskError(toml_path, "<file>", f"not valid TOML: {e}") from e
    if "steps" in data:
        raise HarborTaskError(toml_path, "steps", "multi-step tasks ([[steps]]) are not supported")
    schema = str(data.get("schema_version", data.get("version", "1.0")))
    if schema not in ("1.0", "1.1"):
        raise HarborTaskError(
            toml_path, "schema_version", f"unsupported schema {schema!r} (1.0 or 1.1)"
        )
    task_table = _table(data, "task", toml_path)
    raw_name = task_table.get("name", path.name)
    if not isinstance(raw_name, str) or not raw_name.strip():
        raise HarborTaskError(
            toml_path, "task.name", f"expected a non-empty string, got {raw_name!r}"
        )
    name = re.sub(r"[^a-z0-9_.-]+", "-", raw_name.strip().lower().replace("/", ".")).strip("-")
    version = str(task_table.get("version", data.get("version", "1.0")))
    agent = _table(data, "agent", toml_path)
    verifier = _table(data, "verifier", toml_path)
    env = _table(data, "environment", toml_path)
    meta = _table(data, "metadata", toml_path)
    cpus = env.get("cpus", 1)
    if isinstance(cpus, bool) or not isinstance(cpus, int | float) or cpus < 1:
        raise HarborTaskError(
            toml_path, "environment.cpus", f"expected a whole number ≥ 1, got {cpus!r}"
        )
    if "memory" in env and "memory_mb" in env:
        raise HarborTaskError(toml_path, "environment.memory", "give memory or memory_mb, not both")
    memory = (
        _size_mib(env["memory"], toml_path, "environment.memory") if "memory" in env
        else _size_mib(env.get("memory_mb", 2048), toml_path, "environment.memory_mb")
    )  # fmt: skip
    storage = (
        _size_mib(env["storage"], toml_path, "environment.storage") if "storage" in env
        else _size_mib(env.get("storage_mb", 10240), toml_path, "environment.storage_mb")
    )  # fmt: skip
    if memory < 512:
        raise HarborTaskError(
            toml_path, "environment.memory", f"at least 512 MiB, got {memory} MiB"
        )
    tags = meta.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise HarborTaskError(
            toml_path, "metadata.tags", f"expected a list of strings, got {tags!r}"
        )
    for key in ("difficulty", "category"):
        if not isinstance(meta.get(key, ""), str):
            raise HarborTaskError(
                toml_path, f"metadata.{key}", f"expected a string, got {meta[key]!r}"
            )
    instruction_path = path / "instruction.md"
    try:
        instruction = instruction_path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise HarborTaskError(instruction_path, "<file>", "missing (the task's instruction)") from e
    except (OSError, UnicodeDecodeError) as e:
        raise HarborTaskError(instruction_path, "<file>", f"cannot be read: {e}") from e
    if not instruction.strip():
        raise HarborTaskError(instruction_path, "<file>", "is empty")
    compose = next(
        (
            path / "environment" / name
            for name in COMPOSE_FILES
            if (path / "environment" / name).is_file()
        ),
        None,
    )
    if compose is not None:
        raise HarborTaskError(
            compose,
            "<file>",
            "docker-compose environments are not supported (several containers)",
            category=RefusalCategory.MULTI_CONTAINER,
        )
    for required, what in (
        ("environment/Dockerfile", "the environment"),
        ("tests/test.sh", "the verifier"),
    ):
        if not (path / required).is_file():
            raise HarborTaskError(path / required, "<file>", f"missing ({what})")
    declared = agent_network(env, agent)
    if declared is not None:
        field, what = declared
        raise HarborTaskError(
            toml_path,
            field,
            f"{what}: the agent needs the network, which epiflow's jails never have",
            category=RefusalCategory.NETWORK_AGENT,
        )
    fetch = solution_fetch(path)
    if fetch is not None:
        file, line, what = fetch
        raise HarborTaskError(
            file,
            f"line {line}",
            f"the reference solution runs {what}: solving needs the network, which "
            "epiflow's jails never have",
            category=RefusalCategory.NETWORK_AGENT,
            line=line,
        )
    fetched = verifier_fetch(path / "tests")
    if fetched is not None:
        file, line, host = fetched
        raise HarborTaskError(
            file,
            f"line {line}",
            f"the verifier downloads from {host} at verify time: it needs the network, which "
            "epiflow's verifier jails never have (the offline toolkit serves only the uv "
            "installer and the requirements test.sh pins)",
            category=RefusalCategory.NETWORK_VERIFIER,
            line=line,
        )
    root = solution_root(path)
    if root is not None:
        file, line, what = root
        raise HarborTaskError(
            file,
            f"line {line}",
            f"the reference solution runs {what}, which needs root: Harbor runs it as root in "
            "the task's container, epiflow's agent is an unprivileged user in a read-only image "
            "whose verifier sees only the workdir",
            category=RefusalCategory.NEEDS_ROOT,
            line=line,
        )
    docker_image = env.get("docker_image")
    return HarborTask(
        path=path,
        name=name,
        version=version,
        schema_version=schema,
        content_hash=content_hash(path),
        instruction=instruction,
        agent_timeout_s=_number(agent, "timeout_sec", toml_path, "agent.timeout_sec", 600.0),
        verifier_timeout_s=_number(
            verifier, "timeout_sec", toml_path, "verifier.timeout_sec", 600.0
        ),
        build_timeout_s=_number(
            env, "build_timeout_sec", toml_path, "environment.build_timeout_sec", 900.0
        ),
        cpus=int(cpus),
        memory_mib=memory,
        storage_mib=storage,
        difficulty_label=str(meta.get("difficulty", "")),
        category=str(meta.get("category", "")),
        tags=tuple(tags),
        metadata=meta,
        docker_image=docker_image if isinstance(docker_image, str) else None,
    )
