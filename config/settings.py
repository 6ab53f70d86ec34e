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

from storage.settings import DatabaseSettings, ObjectStoreSettings


class ConfigError(Exception):
    """A setting is invalid; the message names the environment variable to fix."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting

    def user_message(self) -> str:
        return str(self)


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


S = TypeVar("S", bound=BaseSettings)


def _build(cls: type[S], prefix: str) -> S:
    try:
        return cls()
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "?"
        variable = f"{prefix}{field.upper()}"
        raise ConfigError(f"{variable}: {first['msg']}", setting=variable) from e


def load_settings() -> Settings:
    """Read every subsystem's settings from the environment.

    Raises:
        ConfigError: a variable is invalid; the message names it.
    """
    return Settings(
        database=_build(DatabaseSettings, "EPIFLOW_DATABASE_"),
        objects=_build(ObjectStoreSettings, "EPIFLOW_OBJECTS_"),
        prefect=_build(PrefectSettings, "EPIFLOW_PREFECT_"),
    )
