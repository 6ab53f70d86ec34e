"""Settings of the suites subsystem (env prefix `EPIFLOW_SUITES_`). Built at the entry point."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class SuitesSettings(BaseSettings):
    """Where user suites are looked up, besides the built-in suite and `suites/examples/`."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_SUITES_", extra="forbid")

    path: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    """Folders searched for user suites, colon-separated in `EPIFLOW_SUITES_PATH`. Each entry is
    either a suite folder (holds `suite.yaml`) or a folder whose subfolders are suite folders."""
    include_examples: bool = True
    """Also offer the example suites shipped in `suites/examples/`."""
    harbor_image_dir: Path | None = None
    """Where Harbor task images and the offline verifier toolkit are built and cached
    (`EPIFLOW_SUITES_HARBOR_IMAGE_DIR`); None: `$EPIFLOW_HOME/images`. Every folder above it
    must be searchable by others (jails mount from an unprivileged user namespace)."""
    harbor_skip_invalid: bool = False
    """Load a Harbor dataset whose folder holds malformed or unsupported tasks with the
    valid ones only (`EPIFLOW_SUITES_HARBOR_SKIP_INVALID=1`); off: such a dataset is refused
    and every bad task listed."""

    @field_validator("path", mode="before")
    @classmethod
    def _split_colon_list(cls, value: Any) -> Any:
        # The env var is a PATH-style list, not JSON; empty entries are ignored like in $PATH.
        if isinstance(value, str):
            return [Path(part) for part in value.split(":") if part.strip()]
        return value
