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
            "Unset: Prefect's ephemeral mode (a temporary local server per process)."
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
