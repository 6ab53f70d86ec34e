"""Settings built once at the entry point (CLI, flow, worker) and passed down.

One class per subsystem, each with its own `EPIFLOW_<SUBSYSTEM>_` prefix; this module
only gathers them and turns validation errors into one readable line per variable
(never echoing a value: it may be a secret).

An `EPIFLOW_*` variable that no setting reads is refused, naming the nearest real one
(`EPIFLOW_DATABSE_URL` → "did you mean EPIFLOW_DATABASE_URL?"): a typo must not send a
run to the default database while the operator believes it went elsewhere. Refused, not
warned, because a warning scrolls past and the run writes to the wrong place anyway.
`EPIFLOW_HOME`, the test harness's variables (`NON_SETTING_VARIABLES`) and the
`EPIFLOW_TEST_` prefix are allowed.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.settings import LoopSettings, NoisyRates, PolicySettings, SuccessSettings
from core.errors import EpiflowError
from expectations.settings import GateSettings, QcConfig
from sandbox.settings import SandboxSettings
from scoring.settings import GrmSettings, QualitySettings, RewardSettings, RuleJudgeSettings
from storage.settings import DatabaseSettings, ObjectStoreSettings
from suites.settings import SuitesSettings
from training.settings import TrainingSettings


class ConfigError(EpiflowError):
    """A setting is invalid; the message names the environment variable to fix."""

    retryable = False


class PrefectSettings(BaseSettings):
    """How epiflow reaches Prefect."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_PREFECT_", extra="ignore")

    api_url: str | None = Field(
        default=None,
        description=(
            "Prefect API URL, e.g. http://prefect:4200/api (env EPIFLOW_PREFECT_API_URL). "
            "Unset: the shared local server (`orchestration/prefect_server.py`), started on demand "
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
    heartbeat_s: int = Field(
        default=60,
        ge=30,
        description=(
            "Seconds between the heartbeats of the flow runs epiflow commands start "
            "(`collect`, `serve`'s runs); sets PREFECT_FLOWS_HEARTBEAT_FREQUENCY unless it is "
            "set. Workers started with `prefect worker start` need that variable themselves "
            "(the worker image sets it) (env EPIFLOW_PREFECT_HEARTBEAT_S)."
        ),
    )
    zombie_after_s: float = Field(
        default=600.0,
        ge=60,
        description=(
            "A flow run silent this long after a heartbeat, or after it went Pending or "
            "Running (its process died: killed, out of memory, machine lost, or never "
            "started), is marked Crashed, and a cancellation nobody confirms in "
            "this time is marked Cancelled; at least twice the heartbeat period of every "
            "worker (env EPIFLOW_PREFECT_ZOMBIE_AFTER_S; applied by `epiflow prefect setup`)."
        ),
    )
    stop_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds `epiflow collect` waits, after Ctrl-C or SIGTERM, for the collection to "
            "stop cleanly (finished episodes saved, the run marked `interrupted`); past it "
            "the stop is abandoned as a second signal would: in-flight writes are dropped "
            "(re-running the key redoes them), the run is marked `interrupted` if the "
            "database answers within a few seconds, and the process exits "
            "(env EPIFLOW_PREFECT_STOP_TIMEOUT_S)."
        ),
    )
    late_after_s: float = Field(
        default=1800.0,
        ge=60,
        description=(
            "A nightly run (any flow run tagged epiflow-notify) still Scheduled this many "
            "seconds after Prefect marked it Late (15 s past its scheduled time) is announced "
            "to the notify webhook: nothing is serving its deployment (env "
            "EPIFLOW_PREFECT_LATE_AFTER_S; applied by `epiflow prefect setup`)."
        ),
    )
    notify_webhook_url: SecretStr | None = Field(
        default=None,
        description=(
            "Webhook that gets a JSON POST (`text`, `subject`, `body`) when a nightly run "
            "fails, crashes or is late, or a training or evaluation fails, e.g. a Slack incoming webhook; unset: no notification (env "
            "EPIFLOW_PREFECT_NOTIFY_WEBHOOK_URL; applied by `epiflow prefect setup`). A "
            "secret: such URLs carry tokens."
        ),
    )

    @field_validator("zombie_after_s")
    @classmethod
    def _zombie_after_heartbeats(cls, value: float, info: ValidationInfo) -> float:
        heartbeat = info.data.get("heartbeat_s")
        if heartbeat is not None and value < 2 * heartbeat:
            raise ValueError(
                f"must be at least twice EPIFLOW_PREFECT_HEARTBEAT_S ({heartbeat}): a live run "
                "would be marked Crashed between two heartbeats"
            )
        return value


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


SETTINGS_CLASSES: tuple[type[BaseSettings], ...] = (
    DatabaseSettings,
    ObjectStoreSettings,
    PrefectSettings,
    SandboxSettings,
    LoopSettings,
    SuccessSettings,
    NoisyRates,
    PolicySettings,
    RewardSettings,
    RuleJudgeSettings,
    GrmSettings,
    QualitySettings,
    SuitesSettings,
    GateSettings,
    TrainingSettings,
)
"""Every settings class of every subsystem, including those built later by their own
entry point (the gate's, training's): the variables they read are the known ones."""

NON_SETTING_VARIABLES = frozenset(
    {
        "EPIFLOW_HOME",  # the root of default local paths (core/home.py)
        "EPIFLOW_ENV_TOKEN",  # `epiflow env serve`'s bearer token (cli/env.py), a secret
        "EPIFLOW_PG_BIN",  # the tests' PostgreSQL binaries (tests/services/postgres.py)
        "EPIFLOW_REQUIRE_POSTGRES",  # the tests fail instead of skipping without PostgreSQL
        "EPIFLOW_SCREENSHOT_DIR",  # where the UI tests save their screenshots
    }
)
"""`EPIFLOW_*` variables read outside the settings classes."""

RESERVED_PREFIX = "EPIFLOW_TEST_"
"""Variables under this prefix are never settings: tests use them freely."""


def known_variables() -> frozenset[str]:
    """Every `EPIFLOW_*` variable some setting reads, and the non-setting ones."""
    names = set(NON_SETTING_VARIABLES)
    for cls in SETTINGS_CLASSES:
        prefix = str(cls.model_config.get("env_prefix", ""))
        names.update(f"{prefix}{name}".upper() for name in cls.model_fields)
    return frozenset(names)


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse `EPIFLOW_*` variables no setting reads, naming the nearest real one.

    Raises:
        ConfigError: one line listing every unknown variable (never their values).
    """
    known = known_variables()
    unknown = sorted(
        (
            name
            for name in environ
            if name.upper().startswith("EPIFLOW_")
            and name.upper() not in known
            and not name.upper().startswith(RESERVED_PREFIX)
        ),
        key=str.upper,
    )
    if not unknown:
        return
    # Compared without the shared `EPIFLOW_`, which would make every name look near.
    by_rest = {variable.removeprefix("EPIFLOW_"): variable for variable in known}
    described = []
    for name in unknown:
        rest = name.upper().removeprefix("EPIFLOW_")
        near = difflib.get_close_matches(rest, by_rest, n=1, cutoff=0.6)
        described.append(f"{name} (did you mean {by_rest[near[0]]}?)" if near else name)
    raise ConfigError(
        f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(described)}: "
        "no epiflow setting reads it; fix the name or unset it "
        "(README.md, 'Settings')",
        setting=unknown[0],
    )


def load_settings() -> Settings:
    """Read every subsystem's settings from the environment (a few milliseconds).

    Raises:
        ConfigError: a variable is invalid, or an `EPIFLOW_*` variable is not a setting
            (a typo); the message names every such variable.
    """
    check_environment(os.environ)
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


def load_qc_config() -> QcConfig:
    """Read the quality gate's settings from the environment (the gate's entry points:
    the qc-gate flow, benchmarks).

    Raises:
        ConfigError: a variable is invalid; the message names every such variable.
    """
    return QcConfig(
        gate=_build(GateSettings),
        rewards=_build(RewardSettings),
        judge=_build(RuleJudgeSettings),
        quality=_build(QualitySettings),
    )
