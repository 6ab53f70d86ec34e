"""Shared by the report tests: a real gated run with a hostile episode, and page checks.

`build_gated_run` collects for real (nsjail, `scripted:noisy`), stores one hand-built
trajectory full of markup next to it, and gates the run with the rule judge and the GX
suites. `assert_inert` parses a page the way a browser tokenizer would and fails on any
element, event handler or reference the report must never contain.
"""

from __future__ import annotations

import asyncio
from html.parser import HTMLParser

from sqlalchemy import Engine, select
from sqlmodel import col

from agent.trajectory import EpisodeStatus, FailureCategory, Trajectory, utcnow
from collection.request import CollectRequest
from collection.runner import collect_in_process
from config.settings import load_qc_config
from expectations.gate import run_gate
from models import Episode
from scoring.rule_judge import rule_judgement
from storage.episodes import load_trajectory, persist_episodes
from storage.objects import LocalObjectStore
from storage.qc import write_qc_run
from storage.runs import close_run
from tests.storage.builders import make_trajectory

TEMPLATES = ["csv_to_json", "log_errors", "config_update"]
POLICY = "scripted:noisy?malformed=0.3&fabricated_claim=0.2&repeated_command=0.2"
PWN = "<script>document.title='pwned'</script>"
HOSTILE_TEMPLATE = "evil<svg onload=\"document.title='pwned'\">"
HOSTILE_TOOL = "<img src=x onerror=\"document.title='pwned'\">"
ALLOWED_TAGS = frozenset(
    [
        "html",
        "head",
        "meta",
        "title",
        "style",
        "body",
        "main",
        "nav",
        "a",
        "h1",
        "h2",
        "h3",
        "h4",
        "p",
        "b",
        "span",
        "code",
        "pre",
        "div",
        "dl",
        "dt",
        "dd",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "ul",
        "li",
        "details",
        "summary",
        "br",
        "svg",
        "rect",
        "line",
        "text",
    ]
)
"""Every element the report may contain: no script, img, iframe, object, link, form…"""


def hostile_trajectory(run_key: str) -> Trajectory:
    """A stored episode whose every model- or suite-controlled field carries markup."""
    base = make_trajectory(run_key, task="builtin/evil@1#0-abc", n_steps=3)
    call = base.steps[0].model_copy(
        update={
            "raw_output": f"Looking first. {PWN}\n" + base.steps[0].raw_output,
            "tool": HOSTILE_TOOL,
            "args": {"command": f"echo '{PWN}'"},
            "observation": f'</pre></details>{PWN}<a href="http://evil.example/">x</a>',
        }
    )
    return base.model_copy(
        update={
            "template": HOSTILE_TEMPLATE,
            "prompt": f'Convert the file. <iframe src="http://evil.example/"></iframe>{PWN}',
            "status": EpisodeStatus.FAILED,
            "failure_category": FailureCategory.VERIFIER_FAILED,
            "failure_reason": f"verifier said {PWN}",
            "final_answer": PWN,
            "steps": [call, *base.steps[1:]],
        }
    )


def build_gated_run(engine: Engine, store: LocalObjectStore, run_key: str) -> None:
    """Collect for real, add the hostile episode, close the run, gate it with the rule judge."""
    faults = "light"
    request = CollectRequest(
        run_key=run_key,
        policy=POLICY,
        tasks=1,
        rollouts=2,
        concurrency=4,
        faults=faults,
        templates=TEMPLATES,
    )
    run_id = asyncio.run(collect_in_process(request, engine=engine, store=store)).run_id
    persist_episodes(engine, store, [hostile_trajectory(run_key)])
    close_run(engine, run_id, status="completed")
    with engine.connect() as conn:
        ids = list(
            conn.execute(select(col(Episode.id)).where(col(Episode.run_id) == run_id)).scalars()
        )
    trajectories = [load_trajectory(engine, store, i) for i in ids]
    config = load_qc_config()
    started = utcnow()
    write_qc_run(
        engine,
        run_id=run_id,
        report=run_gate(trajectories, config=config),
        judgements=[rule_judgement(t, config.judge) for t in trajectories],
        docs_key=None,
        started_at=started,
    )


class _Page(HTMLParser):
    """Tags, attributes and table cells of a page, as a browser's tokenizer sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str | None]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._in_body = False
        self._cell: list[str] | None = None
        self._row: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.extend(attrs)
        if tag == "table":
            self._table = dict(attrs).get("class") or ""
            self.tables.setdefault(self._table, [])
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._table is not None and self._in_body:
            self.tables[self._table].append(self._row)
        elif tag == "tbody":
            self._in_body = False
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    parser.close()
    return parser


def assert_inert(page: str, *, sibling_pages: frozenset[str] = frozenset()) -> _Page:
    """No element outside the allowed set, no event handler, nothing fetched from anywhere;
    links go to anchors of this page or, for a paged report, to `sibling_pages` (files in
    the same directory) and their anchors."""
    parsed = parse(page)
    assert parsed.tags <= ALLOWED_TAGS, parsed.tags - ALLOWED_TAGS
    handlers = [a for a, _ in parsed.attrs if a.startswith("on")]
    assert not handlers, handlers
    links = [
        v
        for a, v in parsed.attrs
        if a in ("href", "src") and v and not v.startswith("#")
        if a == "src" or v.split("#", 1)[0] not in sibling_pages
    ]
    assert not links, links
    ids = {v for a, v in parsed.attrs if a == "id"}
    dangling = {
        v for a, v in parsed.attrs if a == "href" and v and v.startswith("#") and v[1:] not in ids
    }
    assert not dangling, dangling
    lowered = page.lower()
    assert "<script" not in lowered
    assert 'src="http' not in lowered and 'href="http' not in lowered and "url(" not in lowered
    return parsed


def rows(parsed: _Page, table: str) -> list[list[str]]:
    """Body rows of the table with that class, as cell texts."""
    return parsed.tables[table]
