"""Versioned suite files: `suites/<name>_v<version>.json`, loaded and checked before use.

A suite is the JSON form of a GX `ExpectationSuite` (`name`, `meta`, `expectations`
with `type`, `kwargs`, `meta`). Every expectation's `meta` carries `id`, `category`,
`action` and `reason`; that is how a failing row becomes a verdict and a reason. The
episode suite may only use row-level (column map) expectations, so every failure names
episodes; the batch suite only aggregate ones, whose action is `fail_batch`; the monitor
suite (production watch, `expectations.monitor`) only aggregate ones, whose action is
`breach` (the model regressed) or `alert` (the environment did: never the model's).
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from expectations.errors import SuiteError

__all__ = [
    "AGGREGATE_TYPES",
    "ROW_TYPES",
    "ExpectationSpec",
    "QcAction",
    "QcCategory",
    "SuiteSpec",
    "load_suite",
]


class QcCategory(StrEnum):
    """Seed 000 §3.3 check families, plus safety (rubric) and integrity (batch)."""

    FORMAT = "format"
    LOGIC = "logic"
    RESULT = "result"
    EFFICIENCY = "efficiency"
    ENVIRONMENT = "environment"
    SAFETY = "safety"
    INTEGRITY = "integrity"


class QcAction(StrEnum):
    """What a failing expectation does."""

    DISCARD = "discard"
    DOWNWEIGHT = "downweight"
    REWARD_SIGN = "reward_sign"
    FAIL_BATCH = "fail_batch"
    BREACH = "breach"
    """Monitor: the model regressed against its baseline (stored, notified, may roll back)."""
    ALERT = "alert"
    """Monitor: the environment failed (reported, never the model's regression)."""


ROW_TYPES = frozenset(
    {
        "expect_column_values_to_be_between",
        "expect_column_values_to_be_in_set",
        "expect_column_values_to_not_be_in_set",
        "expect_column_values_to_not_be_null",
    }
)
"""Expectation types allowed in the episode suite (each failing row is an episode)."""

AGGREGATE_TYPES = frozenset(
    {
        "expect_table_row_count_to_be_between",
        "expect_column_values_to_be_unique",
        "expect_column_mean_to_be_between",
        "expect_column_max_to_be_between",
        "expect_column_min_to_be_between",
        "expect_column_sum_to_be_between",
    }
)
"""Expectation types allowed in the batch suite."""


class ExpectationMeta(BaseModel):
    """The gate's part of an expectation: how a failure is named and what it does."""

    model_config = ConfigDict(frozen=True, extra="allow")

    id: str
    """Stable id, `<category>.<what>`, used in reasons and reports."""
    category: QcCategory
    """Check family."""
    action: QcAction
    """What a failure does."""
    reason: str
    """Human reason shown in qc_result.reasons and the report."""


class ExpectationSpec(BaseModel):
    """One expectation as written in the suite file."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    type: str
    """GX expectation type, e.g. `expect_column_values_to_be_between`."""
    args: dict[str, Any] = Field(alias="kwargs")
    """GX kwargs (`kwargs` in the file); the thresholds live here."""
    meta: ExpectationMeta
    """Id, category, action and reason."""

    def gx_dict(self) -> dict[str, Any]:
        """The expectation in the shape `gx.ExpectationSuite(expectations=[...])` accepts."""
        return {
            "type": self.type,
            "kwargs": dict(self.args),
            "meta": self.meta.model_dump(mode="json"),
        }


class SuiteSpec(BaseModel):
    """A suite file, checked."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Suite name (`episode` or `batch`)."""
    meta: dict[str, Any]
    """Suite metadata; `version` and `level` are required."""
    expectations: list[ExpectationSpec]
    """The expectations, in order."""

    @property
    def version(self) -> str:
        """The suite's version string."""
        return str(self.meta["version"])

    @property
    def level(self) -> str:
        """`episode` or `batch`."""
        return str(self.meta["level"])

    def by_id(self) -> dict[str, ExpectationSpec]:
        """Expectations by meta id."""
        return {e.meta.id: e for e in self.expectations}


def _check(spec: SuiteSpec, path: Path) -> None:
    ids = [e.meta.id for e in spec.expectations]
    if len(set(ids)) != len(ids):
        raise SuiteError(f"{path}: expectation ids must be unique, got {ids}")
    if spec.level == "episode":
        for e in spec.expectations:
            if e.type not in ROW_TYPES:
                raise SuiteError(
                    f"{path}: {e.meta.id}: episode suites allow only {sorted(ROW_TYPES)}, got {e.type}"
                )
            if e.meta.action is QcAction.FAIL_BATCH:
                raise SuiteError(f"{path}: {e.meta.id}: fail_batch is for the batch suite")
            if e.meta.action in (QcAction.BREACH, QcAction.ALERT):
                raise SuiteError(
                    f"{path}: {e.meta.id}: {e.meta.action.value} is for the monitor suite"
                )
    elif spec.level == "batch":
        for e in spec.expectations:
            if e.type not in AGGREGATE_TYPES:
                raise SuiteError(
                    f"{path}: {e.meta.id}: batch suites allow only {sorted(AGGREGATE_TYPES)}, got {e.type}"
                )
            if e.meta.action is not QcAction.FAIL_BATCH:
                raise SuiteError(
                    f"{path}: {e.meta.id}: batch expectations must have action fail_batch"
                )
    elif spec.level == "monitor":
        for e in spec.expectations:
            if e.type not in AGGREGATE_TYPES:
                raise SuiteError(
                    f"{path}: {e.meta.id}: monitor suites allow only {sorted(AGGREGATE_TYPES)}, got {e.type}"
                )
            if e.meta.action not in (QcAction.BREACH, QcAction.ALERT):
                raise SuiteError(
                    f"{path}: {e.meta.id}: monitor expectations must have action breach or alert"
                )
    else:
        raise SuiteError(
            f"{path}: meta.level must be 'episode', 'batch' or 'monitor', got {spec.level!r}"
        )


def load_suite(suites_dir: Path, name: str, version: str) -> SuiteSpec:
    """Load and check `<suites_dir>/<name>_v<version>.json`.

    Raises:
        SuiteError: the file is missing, not JSON, or breaks the suite rules.
    """
    path = suites_dir / f"{name}_v{version}.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise SuiteError(f"suite file {path} does not exist") from e
    except json.JSONDecodeError as e:
        raise SuiteError(f"suite file {path} is not valid JSON: {e}") from e
    try:
        spec = SuiteSpec.model_validate(raw)
    except ValidationError as e:
        raise SuiteError(f"suite file {path} is not a valid suite: {e}") from e
    for key in ("version", "level"):
        if key not in spec.meta:
            raise SuiteError(f"{path}: meta.{key} is required")
    if spec.name != name or spec.version != version:
        raise SuiteError(
            f"{path}: declares {spec.name} v{spec.version}, expected {name} v{version}"
        )
    _check(spec, path)
    return spec
