"""`epiflow report` on a real gated run: counts, charts, every trajectory, hostile text escaped.

The run is collected for real (nsjail, `scripted:noisy`, light faults), one hand-built
trajectory full of markup is stored next to it, and the rule judge plus the GX gate
write `qc_run` / `qc_result` / `judgement` rows. The page is then checked by parsing it,
and in a real headless Chromium when one is installed.
"""

from __future__ import annotations

import html
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select
from sqlmodel import col
from typer.testing import CliRunner

from agent.trajectory import utcnow
from cli.report import register
from models import Episode, Judgement, run_id_for
from reports.gather import gather_report
from reports.html import render_report
from reports.model import EpisodeEntry, RunInfo, RunReport, StatusCount
from reports.svg import histogram_bins, histogram_svg
from storage.db import make_engine
from storage.errors import RunNotFound
from storage.migrate import upgrade
from storage.objects import LocalObjectStore
from storage.run_reads import summarize_run
from storage.settings import DatabaseSettings
from tests.reports.report_checks import (
    HOSTILE_TEMPLATE,
    HOSTILE_TOOL,
    PWN,
    assert_inert,
    build_gated_run,
    hostile_trajectory,
    rows,
)
from tests.services.chromium import require_chromium, run_chromium
from tests.storage.builders import make_trajectory


@pytest.mark.slow
def test_report_shows_the_gated_run(migrated_engine: Engine, tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    build_gated_run(migrated_engine, store, "report-run")
    run_id = run_id_for("report-run")
    report = gather_report(migrated_engine, store, "report-run")

    with migrated_engine.connect() as conn:
        mix = conn.execute(
            select(col(Episode.status), col(Episode.failure_category), func.count())
            .where(col(Episode.run_id) == run_id)
            .group_by(col(Episode.status), col(Episode.failure_category))
        ).all()
        deductions = conn.execute(
            select(col(Judgement.deductions)).where(col(Judgement.judge) == "rule")
        ).scalars()
        reasons = [d["reason"] for ds in deductions for d in _json_list(ds)]
    episodes = sum(n for _, _, n in mix)
    assert report.n_episodes == episodes == len(report.episodes) == 7
    assert {(c.status, c.failure_category, c.episodes) for c in report.status_mix} == {
        tuple(m) for m in mix
    }
    summary = summarize_run(migrated_engine, run_id)
    assert {t.tool: round(t.failure_rate, 4) for t in report.tools} == summary.tool_failure_rate
    assert {
        t.template: round(t.success_rate, 4) for t in report.templates
    } == summary.success_rate_by_template
    assert report.qc is not None and report.qc.n_episodes == episodes
    assert all(e.qc is not None and len(e.judgements) == 1 for e in report.episodes)
    assert sorted(report.quality_scores) == sorted(
        e.qc.quality_score for e in report.episodes if e.qc is not None
    )
    assert reasons, "the noisy policy should have cost deductions"
    assert report.perturbations, "the noisy policy should have perturbed some turns"

    page = render_report(report)
    parsed = assert_inert(page)
    assert sorted(map(tuple, rows(parsed, "status-mix"))) == sorted(
        (s, f, str(n), f"{n / episodes:.1%}") for s, f, n in mix
    )
    assert rows(parsed, "tools") == [
        [t.tool, str(t.calls), str(t.failed), f"{t.failure_rate:.1%}"] for t in report.tools
    ]
    assert rows(parsed, "templates") == [
        [t.template, str(t.episodes), str(t.successes), f"{t.success_rate:.1%}"]
        for t in report.templates
    ]
    assert page.count('<details class="episode">') == episodes
    for e in report.episodes:
        assert f'href="#ep-{e.episode_id}"' in page and f'id="ep-{e.episode_id}"' in page
        assert e.qc is not None and f"{e.qc.verdict} {e.qc.quality_score:.2f}" in page
    for reason in reasons:
        assert html.escape(reason) in page
    assert page.count("<svg") >= 5  # status bar, reward, steps, quality, tools, templates
    # hostile text is shown, as text
    assert PWN not in page and html.escape(PWN) in page
    assert html.escape(HOSTILE_TEMPLATE) in page and html.escape(HOSTILE_TOOL) in page


def test_histogram_bins_count_every_value() -> None:
    steps = [3, 5, 5, 6, 11, 40]
    bins = histogram_bins(steps, integer=True, max_bins=12)
    assert sum(b.count for b in bins) == len(steps)
    assert bins[0].lo == 3 and bins[-1].hi > 40 and len(bins) <= 12
    rewards = [-0.5, 0.25, 1.0, 1.0, 0.9]
    fbins = histogram_bins(rewards, integer=False)
    assert sum(b.count for b in fbins) == len(rewards) and fbins[-1].count >= 2
    assert [b.count for b in histogram_bins([0.7, 0.7], integer=False)] == [2]
    assert histogram_bins([], integer=False) == []
    assert "no values" in histogram_svg([], title="rewards")


def _minimal_report(entry: EpisodeEntry) -> RunReport:
    return RunReport(
        run=RunInfo(run_id=uuid.uuid4(), run_key="k<b>"),
        generated_at=utcnow(),
        status_mix=[StatusCount(status="failed", failure_category="verifier_failed", episodes=1)],
        rewards=[-0.5],
        step_counts=[2],
        episodes=[entry],
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.text(alphabet=st.sampled_from(list("<>&\"'=/ ascript:on!-[]`\x00\u2028é")), max_size=60)
)
def test_any_model_text_stays_text(text: str) -> None:
    t = hostile_trajectory("prop")
    t = t.model_copy(
        update={
            "prompt": text,
            "steps": [
                s.model_copy(update={"raw_output": text, "observation": text}) for s in t.steps
            ],
        }
    )
    entry = EpisodeEntry(
        episode_id=t.episode_id,
        task_id=text or "t",
        template=text,
        status="failed",
        failure_category="verifier_failed",
        failure_reason=text,
        trajectory=t,
    )
    page = render_report(_minimal_report(entry))
    assert_inert(page)
    assert html.escape(text) in page


def test_long_text_is_cut_and_a_missing_trajectory_is_said() -> None:
    t = make_trajectory("cut")
    long = t.steps[0].model_copy(update={"observation": "x" * 5000})
    t = t.model_copy(update={"steps": [long, *t.steps[1:]]})
    entry = EpisodeEntry(
        episode_id=t.episode_id,
        task_id=t.task_id,
        template=t.template,
        status="success",
        failure_category="success",
        trajectory=t,
    )
    cut = render_report(_minimal_report(entry), max_chars=100)
    assert "4900 more characters not shown" in cut and "x" * 101 not in cut
    assert "x" * 5000 in render_report(_minimal_report(entry), max_chars=None)
    missing = entry.model_copy(update={"trajectory": None, "trajectory_error": "gone <b>"})
    page = render_report(_minimal_report(missing))
    assert "Trajectory unavailable: gone &lt;b&gt;" in page


def test_an_empty_run_renders() -> None:
    empty = RunReport(run=RunInfo(run_id=uuid.uuid4(), run_key="empty"), generated_at=utcnow())
    page = render_report(empty)
    assert_inert(page)
    assert "no values" in page and "This run was not gated" in page
    assert '<details class="episode"' not in page


@pytest.fixture(scope="module")
def sqlite_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One gated run on SQLite shared by the CLI and browser tests (collection takes seconds)."""
    root = tmp_path_factory.mktemp("report-sqlite")
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("EPIFLOW_") and name != "EPIFLOW_SCREENSHOT_DIR":
                mp.delenv(name)
        url = f"sqlite:///{root / 'epiflow.db'}"
        engine = make_engine(DatabaseSettings(url=url))
        upgrade(engine)
        store = LocalObjectStore(root / "objects")
        store.check()
        build_gated_run(engine, store, "cli/run 1")
        engine.dispose()
    yield url, root / "objects"


def test_cli_writes_the_default_path_and_prints_it(
    sqlite_run: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, objects = sqlite_run
    monkeypatch.setenv("EPIFLOW_DATABASE_URL", url)
    monkeypatch.setenv("EPIFLOW_OBJECTS_URL", str(objects))
    monkeypatch.chdir(tmp_path)
    app = _app()
    result = CliRunner().invoke(app, ["report", "--run", "cli/run 1"])
    assert result.exit_code == 0, result.output
    printed = result.output.strip()
    assert printed == "epiflow-report-cli_run_1.html"
    page = (tmp_path / printed).read_text()
    assert "<title>epiflow run report: cli/run 1</title>" in page
    assert page.count('<details class="episode">') == 7

    chosen = tmp_path / "out" / "r.html"
    chosen.parent.mkdir()
    result = CliRunner().invoke(
        app, ["report", "--run", str(run_id_for("cli/run 1")), "--out", str(chosen)]
    )
    assert result.exit_code == 0 and result.output.strip() == str(chosen) and chosen.exists()

    unknown = CliRunner().invoke(app, ["report", "--run", "no-such-run"])
    assert isinstance(unknown.exception, RunNotFound)
    unwritable = CliRunner().invoke(
        app, ["report", "--run", "cli/run 1", "--out", str(tmp_path / "missing" / "r.html")]
    )
    assert unwritable.exit_code == 2 and "cannot write" in unwritable.output


@pytest.mark.slow
def test_chromium_renders_the_page_and_runs_no_injected_script(
    sqlite_run: tuple[str, Path], tmp_path: Path
) -> None:
    chromium = require_chromium("the report in a real browser")
    url, objects = sqlite_run
    engine = make_engine(DatabaseSettings(url=url))
    report = gather_report(engine, LocalObjectStore(objects), "cli/run 1")
    engine.dispose()
    target = tmp_path / "report.html"
    target.write_text(render_report(report))
    hostile = next(e for e in report.episodes if e.template == HOSTILE_TEMPLATE)
    page = f"{target.as_uri()}#ep-{hostile.episode_id}"

    dom = run_chromium(chromium, "--dump-dom", page).stdout
    title = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert title is not None and title.group(1) == "epiflow run report: cli/run 1"
    assert "<script" not in dom.lower() and "<iframe" not in dom.lower()
    assert html.escape(PWN, quote=False) in dom  # shown as text
    assert dom.count('<details class="episode"') == len(report.episodes) == 7
    opened = re.findall(r'<details class="episode" open="">', dom)
    assert len(opened) == 1, "following the link should open exactly the linked episode"
    assert f"{report.success_rate:.1%}" in dom

    # Headless Chromium paints nothing in a screenshot scrolled far down (a fragment link),
    # so the episodes are checked in a tall screenshot of the expanded page instead.
    shots = Path(os.environ.get("EPIFLOW_SCREENSHOT_DIR", tmp_path))
    top, episodes = shots / "report-top.png", shots / "report-episodes.png"
    run_chromium(chromium, f"--screenshot={top}", target.as_uri())
    expanded = tmp_path / "expanded.html"
    expanded.write_text(
        render_report(report.model_copy(update={"episodes": [hostile]}), expand=True)
    )
    run_chromium(chromium, f"--screenshot={episodes}", "--window-size=1400,4200", expanded.as_uri())
    assert top.stat().st_size > 10_000 and episodes.stat().st_size > 100_000


def _app() -> Any:
    import typer

    app = typer.Typer()
    register(app)

    @app.callback()
    def main() -> None:
        """A one-command app needs a callback to keep the command's name."""

    return app


def _json_list(value: Any) -> list[dict[str, Any]]:
    import json

    loaded = json.loads(value) if isinstance(value, str) else value
    return [d for d in loaded if isinstance(d, dict)]
