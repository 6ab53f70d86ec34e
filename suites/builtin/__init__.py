"""The built-in suite: data-processing chores from 2-step conversions to ~15-step jobs with traps.

One template per module; `common` holds the shared helpers. Bump `BUILTIN_VERSION` when
templates are added or removed; bump a template's own version when its tasks change.
"""

from __future__ import annotations

from suites.builtin import (
    checksums,
    config_update,
    csv_to_json,
    dedupe_records,
    dir_tree,
    fix_script,
    jsonl_extract,
    largest_files,
    log_errors,
    merge_csv,
    rename_files,
    sales_rollup,
    summary_stats,
)
from suites.suite import Suite
from suites.template import TaskTemplate

BUILTIN_NAME = "builtin"
"""Name of the built-in suite."""
BUILTIN_VERSION = "1"
"""Version of the built-in suite (its set of templates)."""

BUILTIN_TEMPLATES: tuple[TaskTemplate, ...] = tuple(
    sorted(
        (
            m.TEMPLATE
            for m in (
                csv_to_json,
                dir_tree,
                summary_stats,
                log_errors,
                config_update,
                jsonl_extract,
                rename_files,
                dedupe_records,
                largest_files,
                checksums,
                merge_csv,
                fix_script,
                sales_rollup,
            )
        ),
        key=lambda t: (t.difficulty, t.name),
    )
)
"""Every built-in template, easiest first."""


def builtin_suite() -> Suite:
    """The built-in suite."""
    return Suite(
        BUILTIN_NAME,
        BUILTIN_VERSION,
        BUILTIN_TEMPLATES,
        description="Data-processing chores: CSV/JSON/logs/files, 2-step to ~15-step with traps.",
    )
