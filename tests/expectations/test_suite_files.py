"""Suite files: versioned JSON, checked before use; thresholds live in their kwargs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from expectations.errors import SuiteError
from expectations.settings import SUITES_DIR
from expectations.suite_files import QcAction, QcCategory, load_suite


def test_shipped_suites_load_and_map_to_the_seed_table() -> None:
    episode = load_suite(SUITES_DIR, "episode", "1")
    batch = load_suite(SUITES_DIR, "batch", "1")
    assert (episode.version, episode.level, batch.level) == ("1", "episode", "batch")
    actions = {(e.meta.category, e.meta.action) for e in episode.expectations}
    # Seed 000 §3.3: format → discard, logic → downweight, result → reward sign,
    # efficiency → downweight, environment → discard (+ recovered format → downweight).
    assert {
        (QcCategory.FORMAT, QcAction.DISCARD),
        (QcCategory.FORMAT, QcAction.DOWNWEIGHT),
        (QcCategory.LOGIC, QcAction.DOWNWEIGHT),
        (QcCategory.RESULT, QcAction.REWARD_SIGN),
        (QcCategory.EFFICIENCY, QcAction.DOWNWEIGHT),
        (QcCategory.ENVIRONMENT, QcAction.DISCARD),
    } <= actions
    assert batch.by_id()["environment.error_rate"].args["max_value"] == 0.05


def _write(tmp_path: Path, name: str, doc: dict[str, object]) -> Path:
    (tmp_path / name).write_text(json.dumps(doc), encoding="utf-8")
    return tmp_path


def _episode_doc(**over: object) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SUITES_DIR / "episode_v1.json").read_text(encoding="utf-8"))
    doc.update(over)
    return doc


def test_missing_file_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="does not exist"):
        load_suite(tmp_path, "episode", "9")
    (tmp_path / "episode_v1.json").write_text("{", encoding="utf-8")
    with pytest.raises(SuiteError, match="not valid JSON"):
        load_suite(tmp_path, "episode", "1")


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d["expectations"].append(d["expectations"][0]), "unique"),
        (
            lambda d: d["expectations"][0].update(type="expect_column_mean_to_be_between"),
            "episode suites allow only",
        ),
        (
            lambda d: d["expectations"][0]["meta"].update(action="fail_batch"),
            "fail_batch is for the batch suite",
        ),
        (
            lambda d: d["expectations"][0]["meta"].update(action="breach"),
            "breach is for the monitor suite",
        ),
        (lambda d: d["expectations"][0]["meta"].update(category="vibes"), "not a valid suite"),
        (lambda d: d["expectations"][0]["meta"].pop("id"), "not a valid suite"),
        (lambda d: d["meta"].update(version="2"), "expected episode v1"),
        (lambda d: d["meta"].pop("level"), "meta.level is required"),
    ],
)
def test_invalid_suites_are_rejected(tmp_path: Path, mutate, match: str) -> None:
    doc = _episode_doc()
    mutate(doc)
    _write(tmp_path, "episode_v1.json", doc)
    with pytest.raises(SuiteError, match=match):
        load_suite(tmp_path, "episode", "1")


def test_a_new_version_is_a_new_file(tmp_path: Path) -> None:
    shutil.copy(SUITES_DIR / "episode_v1.json", tmp_path / "episode_v1.json")
    doc = _episode_doc(meta={"version": "2", "level": "episode"})
    _write(tmp_path, "episode_v2.json", doc)
    assert load_suite(tmp_path, "episode", "2").version == "2"
    assert load_suite(tmp_path, "episode", "1").version == "1"


def test_the_monitor_suite_loads_and_its_relative_bounds_are_checked(tmp_path: Path) -> None:
    from expectations.monitor import MonitorRule, load_monitor_suite

    shipped = load_monitor_suite(MonitorRule())
    assert {e.meta.action for e in shipped.expectations} == {QcAction.BREACH, QcAction.ALERT}
    doc: dict[str, Any] = json.loads((SUITES_DIR / "monitor_v1.json").read_text(encoding="utf-8"))
    doc["expectations"][0]["meta"].pop("tolerance")
    _write(tmp_path, "monitor_v1.json", doc)
    with pytest.raises(
        SuiteError, match=r"result\.completion_rate: .*needs meta\.bound and meta\.tolerance"
    ):
        load_monitor_suite(MonitorRule(suites_dir=tmp_path))
    doc["expectations"][0]["meta"].update(tolerance=0.1, action="discard")
    _write(tmp_path, "monitor_v1.json", doc)
    with pytest.raises(SuiteError, match="must have action breach or alert"):
        load_monitor_suite(MonitorRule(suites_dir=tmp_path))
