"""Settings built once at the entry point (CLI, flow, worker) and passed down.

One class per subsystem, each with its own `EPIFLOW_<SUBSYSTEM>_` prefix; this module
only gathers them and turns validation errors into one readable line per variable
(never echoing a value: it may be a secret).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.settings import LoopSettings, PolicySettings
from core.errors import EpiflowError
from sandbox.settings import SandboxSettings
from scoring.settings import RewardSettings
from storage.settings import DatabaseSettings, ObjectStoreSettings
from suites.settings import SuitesSettings


class ConfigError(EpiflowError):
    """A setting is invalid; the message names the environment variable to fix."""


class PrefectSettings(BaseSettings):
    """How epiflow reaches Prefect."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_PREFECT_", extra="ignore")

    api_url: str | None = Field(
        default=None,
        description=(
            "Prefect API URL, e.g. http://prefect:4200/api (env EPIFLOW_PREFECT_API_URL). "
            "Unset: the shared local server (`config/prefect_server.py`), started on demand "
            "and reused by every epiflow command of this Prefect home."
        ),
    )
    local_port: int = Field(
        default=4300,
        ge=1,
        le=65535,
        description=(
            "Preferred loopback port of the shared local server; a free port when it is "
            "taken (env EPIFLOW_PREFECT_LOCAL_PORT)."
        ),
    )
    local_idle_s: float = Field(
        default=300.0,
        gt=0,
        description=(
            "The shared local server stops this many seconds after its last command "
            "exited (env EPIFLOW_PREFECT_LOCAL_IDLE_S)."
        ),
    )
    start_timeout_s: float = Field(
        default=180.0,
        gt=0,
        description=(
            "How long a command waits for Prefect's API to answer: the shared local server "
            "to start, or the remote API's health check (env EPIFLOW_PREFECT_START_TIMEOUT_S)."
        ),
    )


@dataclass(frozen=True)
class Settings:
    """Every subsystem's settings, built at the entry point."""

    database: DatabaseSettings
    objects: ObjectStoreSettings
    prefect: PrefectSettings
    sandbox: SandboxSettings
    loop: LoopSettings
    policy: PolicySettings
    rewards: RewardSettings
    suites: SuitesSettings


S = TypeVar("S", bound=BaseSettings)


def _build(cls: type[S]) -> S:
    prefix = str(cls.model_config.get("env_prefix", ""))
    try:
        return cls()
    except ValidationError as e:
        problems = []
        for error in e.errors():
            field = "_".join(str(p) for p in error["loc"]) or "?"
            problems.append((f"{prefix}{field.upper()}", error["msg"]))
        first = problems[0][0]
        detail = "; ".join(f"{variable}: {message}" for variable, message in problems)
        raise ConfigError(detail, setting=first) from e


def load_settings() -> Settings:
    """Read every subsystem's settings from the environment (a few milliseconds).

    Raises:
        ConfigError: a variable is invalid; the message names every invalid one.
    """
    return Settings(
        database=_build(DatabaseSettings),
        objects=_build(ObjectStoreSettings),
        prefect=_build(PrefectSettings),
        sandbox=_build(SandboxSettings),
        loop=_build(LoopSettings),
        policy=_build(PolicySettings),
        rewards=_build(RewardSettings),
        suites=_build(SuitesSettings),
    )
