"""Errors of the quality gate. A failing expectation is a verdict, not an error.

ExpectationsError
├── SuiteError              a suite file is missing, not JSON, or breaks the suite rules
├── FeatureSchemaError      the input frames lack a column the features need
└── SuiteExecutionError     Great Expectations raised while evaluating an expectation
"""

from __future__ import annotations

from core.errors import EpiflowError


class ExpectationsError(EpiflowError):
    """Base class of every quality-gate failure."""


class SuiteError(ExpectationsError):
    """A suite file cannot be used (missing, invalid JSON, unknown expectation type or meta)."""


class FeatureSchemaError(ExpectationsError):
    """An input frame lacks a column, or has one of the wrong type."""


class SuiteExecutionError(ExpectationsError):
    """An expectation raised inside Great Expectations instead of passing or failing."""
