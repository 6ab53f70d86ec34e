"""`epiflow suites list|check` end to end: real agent loop, real policies, real nsjail."""

from __future__ import annotations

import json
from pathlib import Path

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
    assert {t["template"] for t in report["templates"]} == {
        "greeting",
        "count_words",
        "sort_names",
        "numbers_above",
        "invoice_total",
    }


def test_check_generated_example_templates_with_the_oracle_over_ten_seeds():
    result, report = run_check(
        "--suite",
        "textops",
        "--template",
        "numbers_above",
        "--template",
        "invoice_total",
        "--instances",
        "10",
    )
    assert result.exit_code == 0, result.output
    assert report["mean_score"] == 1.0
    for t in report["templates"]:
        assert (t["instances"], t["distinct"], t["below_full"], t["failures"]) == (10, 10, 0, 0)


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


FALLS_SHORT = """\
name: short
version: 1
tasks:
  - name: missing_tool
    difficulty: 1
    params:
      n: {int: [2, 99]}
    prompt: Write the first column of in.txt to out.txt
    files:
      in.txt: "{{ n }} x\\n"
    reference_solution:
      - tool: write_file
        args: {path: notes.txt, content: "fine"}
      - tool: execute_shell
        args: {command: "no-such-tool-epiflow '{print $1}' in.txt > out.txt"}
    verifier:
      command: >-
        if [ "$(cat out.txt)" = "{{ n }}" ]; then echo '{"score": 1, "reason": "ok"}';
        else echo '{"score": 0, "reason": "out.txt is wrong"}'; fi
  - name: half_right
    difficulty: 1
    prompt: Write hi to out.txt
    reference_solution:
      - tool: write_file
        args: {path: out.txt, content: "hi"}
    verifier:
      command: >-
        echo '{"score": 0.5, "reason": "half"}'
"""


def short_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "suite.yaml").write_text(FALLS_SHORT)
    monkeypatch.setenv("EPIFLOW_SUITES_PATH", str(tmp_path))


def test_check_exits_1_when_the_oracle_scores_below_1_and_shows_failing_reference_steps(
    tmp_path, monkeypatch
):
    short_suite(tmp_path, monkeypatch)
    result = runner.invoke(app, ["check", "--suite", "short", "--instances", "2"])
    assert result.exit_code == 1, result.output
    out = result.stdout
    for seed in (0, 1):
        assert f"missing_tool seed {seed}: score 0.000, failed: out.txt is wrong" in out
    assert (
        out.count("failing reference step 1 (execute_shell): exit code 127 (command_not_found)")
        == 2
    )
    assert "$ no-such-tool-epiflow '{print $1}' in.txt > out.txt" in out
    assert "stderr: /bin/sh: 1: no-such-tool-epiflow: not found" in out
    assert "half_right seed 0: score 0.500" in out
    assert "the oracle scored below 1.0 on 4 of 4 instance(s)" in result.stderr


def test_check_json_carries_the_failing_steps(tmp_path, monkeypatch):
    short_suite(tmp_path, monkeypatch)
    result, report = run_check("--suite", "short", "--instances", "1")
    assert result.exit_code == 1
    missing, half = report["templates"]
    assert (missing["below_full"], half["below_full"], half["failures"]) == (1, 1, 1)
    [step] = missing["failed"][0]["failed_steps"]
    assert step["index"] == 1 and step["tool"] == "execute_shell"
    assert step["command"] == "no-such-tool-epiflow '{print $1}' in.txt > out.txt"
    assert step["exit_code"] == 127 and step["error_type"] == "command_not_found"
    assert step["stderr"].endswith("no-such-tool-epiflow: not found")
    assert half["failed"][0]["failed_steps"] == []
    # Other policies are not held to 1.0: idle scores 0 and the check still exits 0.
    idle, _ = run_check("--suite", "short", "--instances", "1", "--policy", "scripted:idle")
    assert idle.exit_code == 0, idle.output


def test_check_reports_a_failing_generator_with_exit_2(tmp_path, monkeypatch):
    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "suite.yaml").write_text(
        "name: genfail\nversion: 1\ntasks:\n  - name: boom\n    difficulty: 1\n"
        "    generator: {script: gen.py, provides: [x]}\n"
        "    prompt: x is {{ x }}\n"
        "    verifier: {command: 'true'}\n"
    )
    (folder / "gen.py").write_text("raise RuntimeError('no values today')\n")
    monkeypatch.setenv("EPIFLOW_SUITES_PATH", str(tmp_path))
    result = runner.invoke(app, ["check", "--suite", "genfail", "--instances", "1"])
    assert result.exit_code == 2
    assert (
        "template 'boom', seed 0: generator gen.py failed with exit code 1: "
        "RuntimeError: no values today"
    ) in result.stderr
    assert 'File "/workspace/gen.py", line 1' in result.stderr


def test_check_flags_a_generator_that_ignores_its_seed(tmp_path, monkeypatch):
    folder = tmp_path / "clock"
    folder.mkdir()
    (folder / "suite.yaml").write_text(
        "name: clock\nversion: 1\ntasks:\n  - name: unseeded\n    difficulty: 1\n"
        "    generator: {script: gen.py, provides: [x]}\n"
        "    prompt: x is {{ x }}\n"
        '    verifier: {command: \'echo "{\\"score\\": 1, \\"reason\\": \\"ok\\"}"\'}\n'
    )
    # Unseeded: the OS's random source, so every run differs.
    (folder / "gen.py").write_text(
        "import json, random\nprint(json.dumps({'params': {'x': random.random()}}))\n"
    )
    monkeypatch.setenv("EPIFLOW_SUITES_PATH", str(tmp_path))
    result, report = run_check("--suite", "clock", "--instances", "1")
    assert result.exit_code == 1, result.output
    assert report["nondeterministic"] == ["unseeded"]
    assert report["mean_score"] == 1.0
    assert "template 'unseeded' is not deterministic" in result.stderr
