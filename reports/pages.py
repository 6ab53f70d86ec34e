"""A run report in pages, so a large run stays fast to write and to open.

A run with at most `page_size` episodes is one page, as always. A larger run is an
overview page (every chart and table, and a list of episode pages) plus one page per
`page_size` episodes beside it (`<name>-p0001.html`, …), each with the index of its
episodes, their trajectories, and links to the previous and next page and the overview.
Every page is self-contained under the same CSP (no script, no fetch). Writing reads one
page's trajectories at a time, so memory follows the page size, not the run.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import re
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from reports.episode import esc, render_episode
from reports.gather import gather_report, load_trajectories
from reports.html import document, index_table, render_report
from reports.model import EpisodeEntry, PageInfo
from storage.objects import LocalObjectStore, ObjectStore

__all__ = ["DEFAULT_PAGE_SIZE", "page_file", "plan_pages", "render_episode_page", "write_report"]

DEFAULT_PAGE_SIZE = 200
"""Episodes per page."""


def page_file(stem: str, number: int) -> str:
    """The file name of page `number` of the report whose overview is `<stem>.html`."""
    return f"{stem}-p{number:04d}.html"


def plan_pages(entries: Sequence[EpisodeEntry], *, page_size: int, stem: str) -> list[PageInfo]:
    """The pages `entries` fall into, `page_size` at a time, in order."""
    pages = []
    for number, start in enumerate(range(0, len(entries), page_size), start=1):
        chunk = entries[start : start + page_size]
        counts = Counter(e.status for e in chunk)
        pages.append(
            PageInfo(
                number=number,
                file=page_file(stem, number),
                first=start + 1,
                last=start + len(chunk),
                by_status=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
            )
        )
    return pages


def render_episode_page(
    run_key: str,
    n_episodes: int,
    page: PageInfo,
    n_pages: int,
    entries: Sequence[EpisodeEntry],
    *,
    overview: str,
    max_chars: int | None = 4000,
    expand: bool = False,
) -> str:
    """One page of episodes: navigation, the index of its episodes, the episodes."""
    links = [f'<a href="{esc(overview)}">overview</a>']
    if page.number > 1:
        links.append(
            f'<a href="{esc(page_file(_stem(page.file), page.number - 1))}">← previous</a>'
        )
    if page.number < n_pages:
        links.append(f'<a href="{esc(page_file(_stem(page.file), page.number + 1))}">next →</a>')
    head = (
        f"<h1>epiflow run report: <code>{esc(run_key)}</code></h1>"
        f'<p class="sub">episodes #{page.first}–#{page.last} of {n_episodes} '
        f"· page {page.number} of {n_pages}</p><nav>{''.join(links)}</nav>"
    )
    sections = [
        head,
        '<h2 id="index">Episode index</h2>',
        index_table(entries, start=page.first),
        '<h2 id="episodes">Episodes</h2>',
        *(
            render_episode(entry, n, max_chars=max_chars, expand=expand)
            for n, entry in enumerate(entries, start=page.first)
        ),
    ]
    return document(f"epiflow run report: {run_key} (page {page.number})", sections)


def _stem(file: str) -> str:
    return file.rsplit("-p", 1)[0]


@dataclass(frozen=True)
class _PageJob:
    """Everything one page needs, picklable for a worker process."""

    store: ObjectStore
    run_key: str
    n_episodes: int
    page: PageInfo
    n_pages: int
    entries: list[EpisodeEntry]
    overview: str
    target: Path
    max_chars: int | None
    expand: bool


def _write_page(job: _PageJob) -> Path:
    entries = load_trajectories(job.store, job.entries)
    html = render_episode_page(
        job.run_key,
        job.n_episodes,
        job.page,
        job.n_pages,
        entries,
        overview=job.overview,
        max_chars=job.max_chars,
        expand=job.expand,
    )
    job.target.write_text(html, encoding="utf-8")
    return job.target


def _workers(jobs: int, store: ObjectStore, requested: int) -> int:
    if not isinstance(store, LocalObjectStore):
        # An S3 client does not cross a process boundary; its reads run in threads instead.
        return 1
    return max(1, min(requested, jobs))


def _context() -> multiprocessing.context.BaseContext:
    # fork starts workers at once; with other threads running it is unsafe, so forkserver.
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver")


def write_report(
    engine: Engine,
    store: ObjectStore,
    run: str,
    target: Path | None,
    *,
    page_size: int = DEFAULT_PAGE_SIZE,
    max_chars: int | None = 4000,
    expand: bool = False,
    workers: int = 1,
) -> list[Path]:
    """Write the report of run `run`; returns the files, the overview (or only page) first.

    `target` None: `./epiflow-report-<run_key>.html`. With `workers` > 1 and a local
    object directory, episode pages are rendered by that many processes (it pays on an
    idle multi-core machine; on a saturated one it costs: see bench/report.py). Episode
    pages of an earlier, larger report of the same name are removed.

    Raises:
        RunNotFound: no run has that key or id.
        OSError: a file cannot be written.
    """
    from reports.gather import default_report_path

    report = gather_report(engine, store, run, trajectories=False)
    path = target or default_report_path(report.run.run_key)
    pages = plan_pages(report.episodes, page_size=page_size, stem=path.stem)
    if len(pages) <= 1:
        whole = report.model_copy(update={"episodes": load_trajectories(store, report.episodes)})
        path.write_text(render_report(whole, max_chars=max_chars, expand=expand), encoding="utf-8")
        _remove_stale_pages(path, keep=0)
        return [path]
    path.write_text(
        render_report(report, max_chars=max_chars, expand=expand, pages=pages), encoding="utf-8"
    )
    jobs = [
        _PageJob(
            store=store,
            run_key=report.run.run_key,
            n_episodes=len(report.episodes),
            page=page,
            n_pages=len(pages),
            entries=report.episodes[page.first - 1 : page.last],
            overview=path.name,
            target=path.parent / page.file,
            max_chars=max_chars,
            expand=expand,
        )
        for page in pages
    ]
    count = _workers(len(jobs), store, workers)
    if count > 1:
        with ProcessPoolExecutor(max_workers=count, mp_context=_context()) as pool:
            written = list(pool.map(_write_page, jobs))
    else:
        written = [_write_page(job) for job in jobs]
    _remove_stale_pages(path, keep=len(pages))
    return [path, *written]


def _remove_stale_pages(path: Path, *, keep: int) -> None:
    pattern = re.compile(re.escape(path.stem) + r"-p(\d{4})\.html")
    for old in path.parent.glob(f"{path.stem}-p*.html"):
        match = pattern.fullmatch(old.name)
        if match and int(match.group(1)) > keep:
            old.unlink()
