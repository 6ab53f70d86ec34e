"""The suites evaluated directly in polars: the reference the GX run is checked against.

Same JSON, same semantics as GX for the expectation types the suites allow (nulls are
skipped by row-level checks, `mostly` honoured, strict bounds honoured). Used by the
tests (GX and polars must flag the same episodes) and by `bench/qc.py` as the baseline.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from expectations.errors import SuiteError
from expectations.outcomes import ExpectationOutcome
from expectations.suite_files import ExpectationSpec, SuiteSpec

__all__ = ["evaluate_suite_polars"]


def _between(x: pl.Expr, kw: dict[str, Any]) -> pl.Expr:
    ok = pl.lit(True)
    if kw.get("min_value") is not None:
        ok = ok & ((x > kw["min_value"]) if kw.get("strict_min") else (x >= kw["min_value"]))
    if kw.get("max_value") is not None:
        ok = ok & ((x < kw["max_value"]) if kw.get("strict_max") else (x <= kw["max_value"]))
    return ok


def _row_failures(spec: ExpectationSpec) -> pl.Expr:
    kw = spec.args
    x = pl.col(kw["column"])
    match spec.type:
        case "expect_column_values_to_be_between":
            return x.is_not_null() & ~_between(x, kw)
        case "expect_column_values_to_be_in_set":
            return x.is_not_null() & ~x.is_in(kw["value_set"])
        case "expect_column_values_to_not_be_in_set":
            return x.is_not_null() & x.is_in(kw["value_set"])
        case "expect_column_values_to_not_be_null":
            return x.is_null()
    raise SuiteError(f"{spec.meta.id}: no polars translation for {spec.type}")


def _aggregate(frame: pl.DataFrame, spec: ExpectationSpec) -> tuple[bool, Any]:
    kw = spec.args
    if spec.type == "expect_table_row_count_to_be_between":
        n = frame.height
        return bool(frame.select(_between(pl.lit(n), kw)).item()), n
    col = frame.get_column(kw["column"])
    if spec.type == "expect_column_values_to_be_unique":
        values = col.drop_nulls()
        return values.n_unique() == values.len(), None
    agg = {
        "expect_column_mean_to_be_between": col.mean,
        "expect_column_max_to_be_between": col.max,
        "expect_column_min_to_be_between": col.min,
        "expect_column_sum_to_be_between": col.sum,
    }.get(spec.type)
    if agg is None:
        raise SuiteError(f"{spec.meta.id}: no polars translation for {spec.type}")
    observed = agg()
    if observed is None:
        return False, None
    return bool(pl.select(_between(pl.lit(observed), kw)).item()), observed


def evaluate_suite_polars(frame: pl.DataFrame, suite: SuiteSpec) -> list[ExpectationOutcome]:
    """Evaluate every expectation of `suite` on `frame`, like GX would."""
    outcomes: list[ExpectationOutcome] = []
    if suite.level in ("batch", "monitor"):
        for spec in suite.expectations:
            ok, observed = _aggregate(frame, spec)
            outcomes.append(
                ExpectationOutcome(expectation=spec.meta.id, success=ok, observed_value=observed)
            )
        return outcomes
    masks = frame.select(
        pl.col("episode_id"),
        *(_row_failures(s).alias(f"__fail_{i}") for i, s in enumerate(suite.expectations)),
    )
    for i, spec in enumerate(suite.expectations):
        failing = masks.filter(pl.col(f"__fail_{i}"))["episode_id"]
        column = frame.get_column(spec.args["column"])
        non_null = column.len() - column.null_count()
        mostly = float(spec.args.get("mostly", 1.0))
        ok = failing.len() == 0 or (non_null > 0 and 1.0 - failing.len() / non_null >= mostly)
        outcomes.append(
            ExpectationOutcome(
                expectation=spec.meta.id,
                success=ok,
                unexpected_episode_ids=[] if ok else failing.to_list(),
            )
        )
    return outcomes
