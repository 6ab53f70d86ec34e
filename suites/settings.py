"""Settings of the suites subsystem (env prefix `EPIFLOW_SUITES_`). Built at the entry point."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
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
    harbor_strict: bool = False
    """All or nothing (`EPIFLOW_SUITES_HARBOR_STRICT=1`): a Harbor dataset with any task
    that cannot run here is refused as a whole, every such task listed. Off (the default):
    the dataset runs the tasks that can run and lists each other one as refused, with its
    category (docs/harbor.md)."""
    harbor_skip_invalid: bool | None = None
    """Deprecated (`EPIFLOW_SUITES_HARBOR_SKIP_INVALID`): `1` is the default now, `0` means
    `EPIFLOW_SUITES_HARBOR_STRICT=1`; set together with a contradicting
    `EPIFLOW_SUITES_HARBOR_STRICT` it is refused."""

    @model_validator(mode="after")
    def _fold_skip_invalid(self) -> SuitesSettings:
        if self.harbor_skip_invalid is None:
            return self
        strict = not self.harbor_skip_invalid
        if "harbor_strict" in self.model_fields_set and self.harbor_strict != strict:
            raise ValueError(
                "EPIFLOW_SUITES_HARBOR_SKIP_INVALID (deprecated) contradicts "
                "EPIFLOW_SUITES_HARBOR_STRICT: unset EPIFLOW_SUITES_HARBOR_SKIP_INVALID"
            )
        self.harbor_strict = strict
        return self

    @field_validator("path", mode="before")
    @classmethod
    def _split_colon_list(cls, value: Any) -> Any:
        # The env var is a PATH-style list, not JSON; empty entries are ignored like in $PATH.
        if isinstance(value, str):
            return [Path(part) for part in value.split(":") if part.strip()]
        return value
