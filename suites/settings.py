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

    harbor_reward_rule: str = "mean"
    """How a Harbor verifier's named rewards (`reward.json` without a `reward` or `score`
    key, e.g. `{"correctness": 1, "performance": 0.5}`) combine into the episode's score:
    `mean`, `min`, `max`, `product` or `key:NAME` (`EPIFLOW_SUITES_HARBOR_REWARD_RULE`)."""
    harbor_reward_rules: dict[str, str] = Field(default_factory=dict)
    """Per-dataset rules, suite name → rule, overriding `harbor_reward_rule`
    (`EPIFLOW_SUITES_HARBOR_REWARD_RULES='{"terminal-bench": "min"}'`)."""

    @field_validator("harbor_reward_rule")
    @classmethod
    def _known_rule(cls, value: str) -> str:
        from tasks.harbor_reward import check_rule

        return check_rule(value)

    @field_validator("harbor_reward_rules")
    @classmethod
    def _known_rules(cls, value: dict[str, str]) -> dict[str, str]:
        from tasks.harbor_reward import check_rule

        return {suite: check_rule(rule) for suite, rule in value.items()}

    def reward_rule_for(self, suite: str) -> str:
        """The reward rule of the Harbor dataset named `suite`."""
        return self.harbor_reward_rules.get(suite, self.harbor_reward_rule)

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
