"""Render a `RunReport` as one self-contained HTML page (`epiflow report`).

Pure: a `RunReport` in, a string out. The page has no script and no external reference
(inline CSS, inline SVG), and a Content-Security-Policy that forbids scripts and any
fetch, so even text that escaped escaping could not run or phone home. Model output is
hostile input: every value goes through `esc`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import datetime

from reports.episode import badge, episode_anchor, esc, render_episode
from reports.model import EpisodeEntry, PageInfo, RunReport
from reports.svg import (
    histogram_bins,
    histogram_svg,
    rate_bars_svg,
    stacked_bar_svg,
    status_color,
)

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
"""No script, no network: only the inline styles the page carries."""

CSS = """
:root{--fg:#212529;--muted:#6c757d;--line:#dee2e6;--soft:#f8f9fa;--accent:#4263eb}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
margin:0;background:#fff}
main{max-width:1320px;margin:0 auto;padding:20px 28px 60px}
h1{font-size:22px;margin:0 0 4px}h1 code{font-size:20px}
h2{font-size:17px;margin:28px 0 10px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:14px 0 6px}
h4{font-size:13px;margin:14px 0 6px}
code{font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:var(--soft);
border:1px solid var(--line);border-radius:4px;padding:8px 10px;margin:4px 0;
white-space:pre-wrap;overflow-wrap:anywhere;max-height:28em;overflow:auto}
pre.assistant{border-left:3px solid var(--accent)}
pre.observation{border-left:3px solid #868e96}
pre.prompt{border-left:3px solid #2f9e44}
.muted{color:var(--muted)}
.sub{color:var(--muted);margin:0 0 14px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{border:1px solid var(--line);border-radius:6px;padding:8px 14px;min-width:130px}
.card .v{font-size:20px;font-weight:600}
.card .k{color:var(--muted);font-size:12px}
.grid{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
.grid>div{min-width:300px}
table{border-collapse:collapse;margin:6px 0}
th,td{border-bottom:1px solid var(--line);padding:3px 10px 3px 0;text-align:left;
vertical-align:top}
td.n,th.n{text-align:right;padding-right:14px}
table.small{font-size:12px}
table.call th{width:70px;color:var(--muted);font-weight:500}
table.call td{min-width:400px}
.badge{display:inline-block;padding:0 7px;border-radius:9px;font-size:11px;line-height:18px;
background:#e9ecef;white-space:nowrap}
.verdict-keep{background:#d3f9d8}.verdict-downweight{background:#fff3bf}
.verdict-discard{background:#ffe3e3}
.perturbation{background:#f3d9fa}.fault{background:#ffe8cc}.warn{background:#fff3bf}
.parse-error{background:#ffe3e3}.parse-final{background:#d0ebff}
details.episode{border:1px solid var(--line);border-radius:6px;margin:8px 0}
details.episode>summary{cursor:pointer;padding:7px 10px;background:var(--soft);
display:flex;flex-wrap:wrap;gap:10px;align-items:center}
details.episode[open]>summary{border-bottom:1px solid var(--line)}
details.episode:has(.episode-body:target){outline:2px solid var(--accent)}
.episode-body{padding:4px 14px 12px;scroll-margin-top:3em}
.num{font-weight:600;color:var(--muted)}
dl.meta{display:grid;grid-template-columns:90px 1fr;gap:2px 10px;margin:8px 0}
dl.meta dt{color:var(--muted)}dl.meta dd{margin:0}
.step{border-top:1px dashed var(--line);padding:8px 0;scroll-margin-top:1em}
.step:target{background:#edf2ff}
.step-head{display:flex;flex-wrap:wrap;gap:8px;align-items:center;margin-bottom:4px}
.reward{margin-left:auto;color:var(--muted);font-size:12px}
.label{font-size:11px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted);
margin-top:6px}
.error{color:#c92a2a}.ok{color:#2b8a3e}.bad{color:#c92a2a}
.cite{margin:2px 0;font-size:12px;color:#862e9c}
.fault{font-size:12px}
.cut{font-size:12px;color:var(--muted);margin:0}
.suggestion{font-size:12px;color:var(--muted)}
.empty{color:var(--muted)}
nav a{margin-right:12px}
"""


def render_report(
    report: RunReport,
    *,
    max_chars: int | None = 4000,
    expand: bool = False,
    pages: Sequence[PageInfo] | None = None,
) -> str:
    """The whole page. `max_chars` cuts each long text block (None: no cut); `expand` opens
    every episode (for printing or saving as PDF, where closed ones would stay hidden).

    With `pages` (a large run, see `reports.pages`), this is the overview: every chart and
    table, then a list of the episode pages instead of the index and the episodes."""
    run = report.run
    sections = [
        _header(report, paged=pages is not None),
        _status_section(report),
        _distributions(report),
        _tools_and_templates(report),
        _faults(report),
        _qc_section(report),
    ]
    if pages is not None:
        sections.append(pages_section(pages, len(report.episodes)))
    else:
        sections += [
            '<h2 id="index">Episode index</h2>',
            index_table(report.episodes),
            '<h2 id="episodes">Episodes</h2>',
            *(
                render_episode(entry, n, max_chars=max_chars, expand=expand)
                for n, entry in enumerate(report.episodes, start=1)
            ),
        ]
    return document(f"epiflow run report: {run.run_key}", sections)


def document(title: str, sections: Sequence[str]) -> str:
    """A self-contained page: the CSP (no script, no fetch), the inline CSS, `sections`."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>"
        f"<body><main>{''.join(sections)}</main></body></html>\n"
    )


def _header(report: RunReport, *, paged: bool = False) -> str:
    run = report.run
    facts = [
        f"run id <code>{esc(run.run_id)}</code>",
        f"suite <b>{esc(run.suite or '—')}</b>",
        f"policy <code>{esc(run.policy or '—')}</code>",
        f"status <b>{esc(run.status)}</b>",
        f"started {esc(_when(run.started_at))}",
        f"ended {esc(_when(run.ended_at))}",
        f"report generated {esc(_when(report.generated_at))}",
    ]
    faults = (
        "faults <code>"
        + esc(", ".join(f"{k}={v}" for k, v in sorted(run.fault_profile.items())))
        + "</code>"
        if run.fault_profile
        else "faults off"
    )
    rewards = report.rewards
    cards = [
        ("episodes", str(report.n_episodes)),
        ("steps", str(report.n_steps)),
        ("success rate", f"{report.success_rate:.1%}"),
        ("mean reward", f"{statistics.fmean(rewards):+.3f}" if rewards else "—"),
        (
            "median steps",
            f"{statistics.median(report.step_counts):g}" if report.step_counts else "—",
        ),
        (
            "mean quality",
            f"{report.qc.mean_quality:.3f}"
            if report.qc is not None and report.qc.mean_quality is not None
            else "not gated",
        ),
    ]
    card_html = "".join(
        f'<div class="card"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
        for k, v in cards
    )
    episodes = (
        '<a href="#pages">episode pages</a>'
        if paged
        else '<a href="#index">episode index</a><a href="#episodes">episodes</a>'
    )
    nav = (
        '<nav><a href="#status">status</a><a href="#distributions">distributions</a>'
        '<a href="#tools">tools</a><a href="#templates">templates</a>'
        f'<a href="#quality">quality gate</a>{episodes}</nav>'
    )
    return (
        f"<h1>epiflow run report: <code>{esc(run.run_key)}</code></h1>"
        f'<p class="sub">{" · ".join([*facts, faults])}</p>{nav}'
        f'<div class="cards">{card_html}</div>'
    )


def _status_section(report: RunReport) -> str:
    by_status = sorted(report.by_status.items(), key=lambda kv: (-kv[1], kv[0]))
    chart = stacked_bar_svg(by_status, title="Episodes by status")
    rows = "".join(
        f"<tr><td>{badge(c.status, color=status_color(c.status))}</td>"
        f'<td>{esc(c.failure_category)}</td><td class="n">{c.episodes}</td>'
        f'<td class="n">{c.episodes / report.n_episodes:.1%}</td></tr>'
        for c in report.status_mix
    )
    categories = "".join(
        f'<tr><td>{esc(k)}</td><td class="n">{v}</td></tr>'
        for k, v in sorted(report.by_failure_category.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    return (
        '<h2 id="status">Status mix</h2>'
        + chart
        + '<div class="grid"><div><h3>By status and failure category</h3>'
        '<table class="status-mix"><thead><tr><th>status</th><th>failure category</th>'
        f'<th class="n">episodes</th><th class="n">share</th></tr></thead><tbody>{rows}'
        "</tbody></table></div>"
        '<div><h3>By failure category</h3><table class="failure-categories"><thead><tr>'
        f'<th>failure category</th><th class="n">episodes</th></tr></thead>'
        f"<tbody>{categories}</tbody></table></div></div>"
    )


def _distributions(report: RunReport) -> str:
    charts = [
        (
            "Total reward per episode",
            histogram_svg(
                histogram_bins(report.rewards, integer=False),
                title="Total reward per episode",
                color="#4263eb",
                edge_labels=True,
            ),
        ),
        (
            "Steps per episode",
            histogram_svg(
                histogram_bins(report.step_counts, integer=True),
                title="Steps per episode",
                color="#0c8599",
            ),
        ),
    ]
    quality = report.quality_scores
    if quality:
        charts.append(
            (
                "Quality score per episode",
                histogram_svg(
                    histogram_bins(quality, integer=False),
                    title="Quality score per episode",
                    color="#5f3dc4",
                    edge_labels=True,
                ),
            )
        )
    blocks = "".join(f"<div><h3>{esc(t)}</h3>{svg}</div>" for t, svg in charts)
    return f'<h2 id="distributions">Distributions</h2><div class="grid">{blocks}</div>'


def _tools_and_templates(report: RunReport) -> str:
    tool_rows = "".join(
        f'<tr><td><code>{esc(t.tool)}</code></td><td class="n">{t.calls}</td>'
        f'<td class="n">{t.failed}</td><td class="n">{t.failure_rate:.1%}</td></tr>'
        for t in report.tools
    )
    tool_chart = rate_bars_svg(
        [(t.tool, t.failure_rate, f"{t.failed}/{t.calls} failed") for t in report.tools],
        title="Failure rate per tool",
        color="#e03131",
    )
    template_rows = "".join(
        f'<tr><td>{esc(t.template)}</td><td class="n">{t.episodes}</td>'
        f'<td class="n">{t.successes}</td><td class="n">{t.success_rate:.1%}</td></tr>'
        for t in report.templates
    )
    template_chart = rate_bars_svg(
        [
            (t.template, t.success_rate, f"{t.successes}/{t.episodes} succeeded")
            for t in report.templates
        ],
        title="Success rate per template",
        color="#2f9e44",
    )
    return (
        '<h2 id="tools">Tool calls</h2><div class="grid"><div>'
        '<table class="tools"><thead><tr><th>tool</th><th class="n">calls</th>'
        '<th class="n">failed</th><th class="n">failure rate</th></tr></thead>'
        f"<tbody>{tool_rows}</tbody></table></div><div>{tool_chart}</div></div>"
        '<h2 id="templates">Templates</h2><div class="grid"><div>'
        '<table class="templates"><thead><tr><th>template</th><th class="n">episodes</th>'
        '<th class="n">successes</th><th class="n">success rate</th></tr></thead>'
        f"<tbody>{template_rows}</tbody></table></div><div>{template_chart}</div></div>"
    )


def _faults(report: RunReport) -> str:
    def table(title: str, counts: dict[str, int], css: str) -> str:
        if not counts:
            return f'<div><h3>{esc(title)}</h3><p class="empty">none</p></div>'
        rows = "".join(
            f'<tr><td>{esc(k)}</td><td class="n">{v}</td></tr>' for k, v in counts.items()
        )
        return (
            f'<div><h3>{esc(title)}</h3><table class="{css}"><thead><tr><th>kind</th>'
            f'<th class="n">steps</th></tr></thead><tbody>{rows}</tbody></table></div>'
        )

    return (
        '<h2 id="faults">Injected faults and policy perturbations</h2><div class="grid">'
        + table("Injected faults", report.injected_faults, "faults")
        + table("Noisy-policy perturbations", report.perturbations, "perturbations")
        + "</div>"
    )


def _qc_section(report: RunReport) -> str:
    qc = report.qc
    if qc is None:
        return (
            '<h2 id="quality">Quality gate</h2><p class="empty">This run was not gated '
            "(<code>epiflow collect --gate</code> or the qc-gate flow).</p>"
        )
    verdict = "passed" if qc.batch_passed else "FAILED"
    failures = "".join(
        f"<li><code>{esc(f.get('expectation', '?'))}</code>: {esc(f.get('message', ''))}"
        f" (observed {esc(f.get('observed_value'))})</li>"
        for f in qc.batch_failures
    )
    mean = f"{qc.mean_quality:.3f}" if qc.mean_quality is not None else "—"
    return (
        '<h2 id="quality">Quality gate</h2>'
        f"<p>Gate run <code>{esc(qc.qc_run_id)}</code> at {esc(_when(qc.started_at))}: "
        f"batch <b>{verdict}</b>; {qc.n_episodes} episodes: "
        f"{badge(f'keep {qc.n_keep}', 'verdict-keep')} "
        f"{badge(f'downweight {qc.n_downweight}', 'verdict-downweight')} "
        f"{badge(f'discard {qc.n_discard}', 'verdict-discard')}; mean quality {mean}.</p>"
        + (f'<ul class="batch-failures">{failures}</ul>' if failures else "")
    )


def index_table(entries: Sequence[EpisodeEntry], *, start: int = 1, page_file: str = "") -> str:
    """The episode index: one row per entry, numbered from `start`, linking to the
    episode's anchor (in `page_file` when the episodes are on another page)."""
    rows = []
    for n, e in enumerate(entries, start=start):
        verdict = (
            badge(f"{e.qc.verdict} {e.qc.quality_score:.2f}", f"verdict-{e.qc.verdict}")
            if e.qc is not None
            else ""
        )
        reward = "—" if e.total_reward is None else f"{e.total_reward:+.3f}"
        rows.append(
            f'<tr><td><a href="{esc(page_file)}#{esc(episode_anchor(e))}">#{n}</a></td>'
            f'<td>{esc(e.template)}</td><td class="n">{e.rollout_index}</td>'
            f"<td>{badge(e.status, color=status_color(e.status))}</td>"
            f'<td>{esc(e.failure_category)}</td><td class="n">{e.n_steps}</td>'
            f'<td class="n">{reward}</td><td>{verdict}</td></tr>'
        )
    return (
        '<table class="index"><thead><tr><th>episode</th>'
        '<th>template</th><th class="n">rollout</th><th>status</th><th>failure category</th>'
        '<th class="n">steps</th><th class="n">reward</th><th>gate</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def pages_section(pages: Sequence[PageInfo], n_episodes: int) -> str:
    """The overview's list of episode pages, with each page's status counts."""
    rows = "".join(
        f'<tr><td><a href="{esc(p.file)}">page {p.number}</a></td>'
        f'<td class="n">#{p.first}–#{p.last}</td>'
        f"<td>{' '.join(badge(f'{k} {v}', color=status_color(k)) for k, v in p.by_status.items())}"
        "</td></tr>"
        for p in pages
    )
    return (
        f'<h2 id="pages">Episodes ({n_episodes}, on {len(pages)} pages)</h2>'
        '<p class="muted">Each page has the index of its episodes and their trajectories.</p>'
        '<table class="pages"><thead><tr><th>page</th><th class="n">episodes</th>'
        f"<th>status</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value is not None else "—"
