"""A large run's report in pages: an overview with every chart and a list of pages, and
one self-contained page per N episodes (its index, its trajectories, navigation). The
speed target is measured by bench/report.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agent.trajectory import EpisodeStatus, FailureCategory
from reports.pages import page_file, write_report
from storage import migrate
from storage.db import make_engine
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from tests.reports.report_checks import PWN, assert_inert, rows
from tests.services.chromium import require_chromium, run_chromium
from tests.storage.builders import make_trajectory

EPISODES = 11
ANCHOR = re.compile(r'id="(ep-[0-9a-f-]{36})"')


@pytest.fixture
def run(tmp_path: Path) -> tuple[Engine, LocalObjectStore]:
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{tmp_path / 'pages.db'}"))
    migrate.upgrade(engine)
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    trajectories = []
    for i in range(EPISODES):
        t = make_trajectory("paged", f"builtin/csv_to_json@1#{i}", 0, n_steps=3)
        if i % 2:
            t.status, t.failure_category = EpisodeStatus.FAILED, FailureCategory.VERIFIER_FAILED
        t.steps[0].raw_output = f"{PWN} episode {i}"
        trajectories.append(t)
    persist_episodes(engine, store, trajectories)
    return engine, store


def test_a_large_run_is_an_overview_plus_pages(
    run: tuple[Engine, LocalObjectStore], tmp_path: Path
) -> None:
    engine, store = run
    out = tmp_path / "site"
    out.mkdir()
    files = write_report(engine, store, "paged", out / "report.html", page_size=4)
    names = [f.name for f in files]
    assert names == ["report.html", *(page_file("report", n) for n in (1, 2, 3))]
    siblings = frozenset(names)

    overview = files[0].read_text()
    parsed_overview = assert_inert(overview, sibling_pages=siblings)
    assert '<details class="episode"' not in overview
    assert [r[:2] for r in rows(parsed_overview, "pages")] == [
        ["page 1", "#1–#4"],
        ["page 2", "#5–#8"],
        ["page 3", "#9–#11"],
    ]
    seen: list[str] = []
    for number, page in enumerate(files[1:], start=1):
        html = page.read_text()
        parsed = assert_inert(html, sibling_pages=siblings)
        anchors = ANCHOR.findall(html)
        assert html.count('<details class="episode"') == len(anchors) == len(rows(parsed, "index"))
        assert [r[0] for r in rows(parsed, "index")] == [
            f"#{n}" for n in range(4 * number - 3, 4 * number - 3 + len(anchors))
        ]
        assert (">← previous</a>" in html) == (number > 1)
        assert (">next →</a>" in html) == (number < 3)
        assert 'href="report.html">overview</a>' in html
        assert PWN not in html
        seen += anchors
    assert len(seen) == len(set(seen)) == EPISODES  # every episode exactly once
    counted = sum(int(n) for r in rows(parsed_overview, "pages") for n in re.findall(r"\d+", r[2]))
    assert counted == EPISODES  # the status badges of the pages add up to the run

    # In parallel the pages are the same; a smaller run later leaves no stale page behind.
    again = tmp_path / "again"
    again.mkdir()
    parallel = write_report(engine, store, "paged", again / "report.html", page_size=4, workers=2)
    for a, b in zip(files[1:], parallel[1:], strict=True):
        assert a.read_text() == b.read_text()
    single = write_report(engine, store, "paged", out / "report.html", page_size=50)
    assert single == [out / "report.html"] and sorted(p.name for p in out.iterdir()) == [
        "report.html"
    ]
    assert single[0].read_text().count('<details class="episode"') == EPISODES


@pytest.mark.slow
def test_chromium_follows_a_link_from_a_page_index(
    run: tuple[Engine, LocalObjectStore], tmp_path: Path
) -> None:
    chromium = require_chromium("the paged report in a real browser")
    engine, store = run
    files = write_report(engine, store, "paged", tmp_path / "report.html", page_size=4)
    page = files[2]
    anchor = ANCHOR.findall(page.read_text())[1]
    dom = run_chromium(chromium, "--dump-dom", f"{page.as_uri()}#{anchor}").stdout
    assert "<title>epiflow run report: paged (page 2)</title>" in dom
    assert "<script" not in dom.lower()
    assert len(re.findall(r'<details class="episode" open="">', dom)) == 1
