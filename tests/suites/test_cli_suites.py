"""`epiflow suites list|check` end to end: real agent loop, real policies, real nsjail."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.suites import app
from suites.builtin import builtin_suite

runner = CliRunner()


def test_list_json_shows_builtin_and_example_suites():
    result = runner.invoke(app, ["list", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    suites = {s["name"]: s for s in data["suites"]}
    assert {"builtin", "textops"} <= set(suites)
    templates = suites["builtin"]["templates"]
    assert len(templates) == len(builtin_suite().templates)
    assert set(templates[0]) == {"template", "version", "difficulty", "summary"}
    assert data["errors"] == []


def test_list_reports_a_malformed_user_suite(tmp_path, monkeypatch):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "suite.yaml").write_text("name: bad\nversion: 1\ntasks: []\n")
    monkeypatch.setenv("EPIFLOW_SUITES_PATH", str(tmp_path))
    result = runner.invoke(app, ["list", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert "builtin" in {s["name"] for s in data["suites"]}
    assert "suite.yaml:3:" in data["errors"][0] and "tasks" in data["errors"][0]


def run_check(*args):
    result = runner.invoke(app, ["check", "--json", *args])
    return result, (json.loads(result.stdout) if result.exit_code in (0, 1) else None)


@pytest.mark.parametrize(("policy", "expected"), [("scripted:oracle", 1.0), ("scripted:idle", 0.0)])
def test_check_every_builtin_template(policy, expected):
    result, report = run_check("--suite", "builtin", "--policy", policy, "--instances", "2")
    assert result.exit_code == 0, result.output
    assert report["mean_score"] == expected
    assert report["environment_errors"] == 0
    assert [t["template"] for t in report["templates"]] == list(builtin_suite().templates)
    for t in report["templates"]:
        assert t["instances"] == 2
        assert t["mean_score"] == expected
        assert t["failures"] == (0 if expected == 1.0 else 2)


def test_check_example_suite_with_the_oracle_on_heldout_seeds():
    result, report = run_check(
        "--suite", "textops", "--instances", "1", "--heldout", "--min-score", "1"
    )
    assert result.exit_code == 0, result.output
    assert report["mean_score"] == 1.0
    assert {t["template"] for t in report["templates"]} == {"greeting", "count_words", "sort_names"}


def test_check_selected_templates_and_min_score():
    result, report = run_check(
        "--policy",
        "scripted:idle",
        "--template",
        "csv_to_json",
        "--instances",
        "1",
        "--min-score",
        "0.5",
    )
    assert result.exit_code == 1
    assert [t["template"] for t in report["templates"]] == ["csv_to_json"]
    assert report["templates"][0]["failed"][0]["status"] == "failed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--suite", "nope"], "no suite named 'nope'"),
        (["--template", "nope"], "no template 'nope'"),
        (["--policy", "bogus"], "policy spec"),
    ],
)
def test_check_user_errors_exit_2(args, message):
    result = runner.invoke(app, ["check", *args])
    assert result.exit_code == 2
    assert message in result.stderr
