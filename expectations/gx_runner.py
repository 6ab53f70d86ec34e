"""Runs the suites with Great Expectations 1.x on the feature frame (as pandas).

An ephemeral context per gate run: a pandas datasource with one dataframe asset, the two
suites built from their JSON specs, one validation definition each. The episode suite
runs with result format COMPLETE keyed by `episode_id` (`unexpected_index_column_names`)
so every failing row maps back to an episode; the batch suite only needs SUMMARY. GX is
imported lazily (≈ 3 s) and its import-time `sre_constants`/`sre_parse` DeprecationWarnings
are silenced right there, precisely, because they are GX's and not ours; so is the INFO
line its ephemeral context logs on creation ("Created temporary directory … for ephemeral
docs site", once per gate run in the demo's terminal and every QC flow run's log): data
docs go to a site added for the directory asked for (`build_data_docs`), never there.

`validate_aggregates` runs aggregate suites on frames of their own (the production
monitor's episode and turn frames), SUMMARY only, in one ephemeral context.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from expectations.errors import SuiteExecutionError
from expectations.outcomes import ExpectationOutcome
from expectations.suite_files import SuiteSpec

__all__ = ["GxRunner", "import_gx", "validate_aggregates"]

_EPISODE_ID = "episode_id"
_GX_DOCS_LOGGER = "great_expectations.data_context.types.base"
"""The GX logger announcing the ephemeral context's unused docs directory at INFO."""


def import_gx() -> ModuleType:
    """`great_expectations`, imported on first use."""
    with warnings.catch_warnings():
        # GX's fluent datasources import the deprecated stdlib `sre_constants`/`sre_parse`.
        warnings.filterwarnings(
            "ignore",
            message=r"module 'sre_(constants|parse|compile)' is deprecated",
            category=DeprecationWarning,
        )
        import great_expectations as gx
    logging.getLogger(_GX_DOCS_LOGGER).setLevel(logging.WARNING)
    return gx


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _json_safe(value.item())
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _raised(info: Any) -> str | None:
    # Either one {"raised_exception": …} record, or one per metric (keyed by metric id).
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message"))
    for value in info.values():
        if isinstance(value, dict) and value.get("raised_exception"):
            return str(value.get("exception_message"))
    return None


def _unexpected_ids(result: dict[str, Any]) -> list[str]:
    # Two shapes: [{"episode_id": "e1", <col>: v}, …], or with exclude_unexpected_values
    # a single [{"episode_id": ["e1", "e2", …]}].
    ids: list[str] = []
    for entry in result.get("unexpected_index_list") or []:
        value = entry.get(_EPISODE_ID) if isinstance(entry, dict) else None
        if isinstance(value, list):
            ids.extend(str(v) for v in value)
        elif value is not None:
            ids.append(str(value))
    return ids


def _outcomes(result: Any, *, with_episode_ids: bool) -> list[ExpectationOutcome]:
    """A GX validation result as outcomes (failing row-level ones name their episodes).

    Raises:
        SuiteExecutionError: an expectation raised instead of passing or failing.
    """
    outcomes: list[ExpectationOutcome] = []
    for r in result.results:
        meta_id = str((r.expectation_config.meta or {}).get("id", r.expectation_config.type))
        message = _raised(r.exception_info)
        if message is not None:
            raise SuiteExecutionError(f"{meta_id}: GX raised {message}")
        body = r.result or {}
        outcomes.append(
            ExpectationOutcome(
                expectation=meta_id,
                success=bool(r.success),
                unexpected_episode_ids=[]
                if r.success or not with_episode_ids
                else _unexpected_ids(body),
                observed_value=_json_safe(body.get("observed_value")),
            )
        )
    return outcomes


def validate_aggregates(
    suites: Mapping[str, tuple[SuiteSpec, Any]],
) -> dict[str, list[ExpectationOutcome]]:
    """Run aggregate suites, each on its own pandas frame (name → (suite, frame)), in one
    ephemeral GX context: the monitor's window frames (`expectations.monitor`).

    Raises:
        SuiteExecutionError: an expectation raised (e.g. its column is missing).
    """
    gx = import_gx()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("monitor")
    results: dict[str, list[ExpectationOutcome]] = {}
    for name, (spec, frame) in suites.items():
        batch = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe(name)
        suite = context.suites.add(
            gx.ExpectationSuite(
                name=f"{spec.name}_v{spec.version}_{name}",
                expectations=[e.gx_dict() for e in spec.expectations],
                meta=dict(spec.meta),
            )
        )
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=suite.name, data=batch, suite=suite)
        )
        result = definition.run(
            batch_parameters={"dataframe": frame},
            result_format={"result_format": "SUMMARY", "partial_unexpected_count": 0},
        )
        results[name] = _outcomes(result, with_episode_ids=False)
    return results


class GxRunner:
    """One ephemeral GX context holding the two suites; `validate` may be called repeatedly."""

    def __init__(self, episode_suite: SuiteSpec, batch_suite: SuiteSpec) -> None:
        gx = import_gx()
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self._gx = gx
        self._context = gx.get_context(mode="ephemeral")
        self._context.variables.progress_bars = ProgressBarsConfig(globally=False)
        asset = self._context.data_sources.add_pandas("qc").add_dataframe_asset("episode_features")
        batch_definition = asset.add_batch_definition_whole_dataframe("batch")
        self._specs = {"episode": episode_suite, "batch": batch_suite}
        self._definitions = {}
        for level, spec in self._specs.items():
            suite = self._context.suites.add(
                gx.ExpectationSuite(
                    name=f"{spec.name}_v{spec.version}",
                    expectations=[e.gx_dict() for e in spec.expectations],
                    meta=dict(spec.meta),
                )
            )
            self._definitions[level] = self._context.validation_definitions.add(
                gx.ValidationDefinition(
                    name=f"{spec.name}_v{spec.version}", data=batch_definition, suite=suite
                )
            )

    def _run(
        self, level: str, frame: Any, result_format: dict[str, Any]
    ) -> list[ExpectationOutcome]:
        result = self._definitions[level].run(
            batch_parameters={"dataframe": frame}, result_format=result_format
        )
        return _outcomes(result, with_episode_ids=level != "batch")

    def validate_episodes(self, frame: Any) -> list[ExpectationOutcome]:
        """Run the episode suite on a pandas frame; failing outcomes list the episodes that broke them.

        Raises:
            SuiteExecutionError: an expectation raised (e.g. its column is missing).
        """
        return self._run(
            "episode",
            frame,
            {
                "result_format": "COMPLETE",
                "unexpected_index_column_names": [_EPISODE_ID],
                "exclude_unexpected_values": True,
                "return_unexpected_index_query": False,
                "partial_unexpected_count": 0,
            },
        )

    def validate_batch(self, frame: Any) -> list[ExpectationOutcome]:
        """Run the batch suite.

        Raises:
            SuiteExecutionError: an expectation raised (e.g. its column is missing).
        """
        return self._run(
            "batch", frame, {"result_format": "SUMMARY", "partial_unexpected_count": 0}
        )

    def build_data_docs(self, directory: Path) -> Path:
        """Render GX data docs of the validations run so far into `directory`; the index.html path."""
        directory.mkdir(parents=True, exist_ok=True)
        site = "epiflow_qc"
        self._context.add_data_docs_site(
            site_name=site,
            site_config={
                "class_name": "SiteBuilder",
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(directory),
                },
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
        self._context.build_data_docs(site_names=[site])
        return directory / "index.html"
