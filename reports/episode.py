"""One episode of the run report as HTML: header, task prompt, steps, gate verdict, judges.

Everything that came from a model, a tool or a user suite is escaped here; nothing in
this module emits a script, an event handler or an external reference.
"""

from __future__ import annotations

import json
import re
from html import escape
from typing import Any

from agent.trajectory import EpisodeStatus, ParseKind, Step, Trajectory
from reports.model import DeductionInfo, EpisodeEntry, JudgementInfo, QcVerdictInfo
from reports.svg import status_color

_SPECIAL = re.compile("[&<>\"']")


def esc(value: object) -> str:
    """HTML-escape any value (quotes included, so it is safe in attributes too)."""
    text = str(value)
    # Most values have nothing to escape; one regex scan is cheaper than five replaces.
    return escape(text, quote=True) if _SPECIAL.search(text) else text


def episode_anchor(entry: EpisodeEntry) -> str:
    """The id of an episode's element (the index table links to it)."""
    return f"ep-{entry.episode_id}"


def text_block(text: str | None, *, max_chars: int | None, css: str = "") -> str:
    """Preformatted text, cut to `max_chars` with a note saying how much was left out."""
    if text is None:
        return ""
    note = ""
    if max_chars is not None and len(text) > max_chars:
        note = (
            f'<p class="cut">… {len(text) - max_chars} more characters not shown '
            "(--max-chars 0 shows everything)</p>"
        )
        text = text[:max_chars]
    cls = f' class="{esc(css)}"' if css else ""
    return f"<pre{cls}>{esc(text)}</pre>{note}"


def badge(text: str, css: str = "", *, color: str | None = None) -> str:
    """A small label; `color` fills it (status colours)."""
    style = f' style="background:{color};color:#fff"' if color else ""
    return f'<span class="badge {esc(css)}"{style}>{esc(text)}</span>'


def render_episode(
    entry: EpisodeEntry, number: int, *, max_chars: int | None, expand: bool = False
) -> str:
    """The `<details>` of one episode; links to its anchor (or a step) open it when closed."""
    anchor = episode_anchor(entry)
    summary = [
        f'<span class="num">#{number}</span>',
        badge(entry.status, color=status_color(entry.status)),
        f"<b>{esc(entry.template)}</b>",
        f'<span class="muted">{esc(entry.task_id)} · rollout {entry.rollout_index}</span>',
        f"<span>{entry.n_steps} steps</span>",
        f"<span>reward {_signed(entry.total_reward)}</span>",
    ]
    if entry.qc is not None:
        summary.append(
            badge(f"{entry.qc.verdict} {entry.qc.quality_score:.2f}", f"verdict-{entry.qc.verdict}")
        )
    body = [_meta(entry)]
    t = entry.trajectory
    if t is None:
        body.append(f'<p class="error">Trajectory unavailable: {esc(entry.trajectory_error)}</p>')
    else:
        body.append(
            "<h4>Task prompt</h4>" + text_block(t.prompt, max_chars=max_chars, css="prompt")
        )
    if entry.qc is not None:
        body.append(_qc(entry.qc))
    for j in entry.judgements:
        body.append(_judgement(j, anchor))
    if t is not None:
        cites = _citations(entry.judgements)
        body.append(f"<h4>Steps ({len(t.steps)})</h4>")
        scored = t.status != EpisodeStatus.IMPORTED  # an unknown imported outcome: never scored
        body.extend(
            _step(s, anchor, cites.get(s.index, []), max_chars=max_chars, scored=scored)
            for s in t.steps
        )
        last_final = next(
            (s.final_answer for s in reversed(t.steps) if s.parse_kind == ParseKind.FINAL), None
        )
        if t.final_answer is not None and t.final_answer != last_final:
            body.append("<h4>Final answer</h4>" + text_block(t.final_answer, max_chars=max_chars))
    # The anchor sits inside the closed <details>: following a link to it makes the browser
    # open the episode (the ancestor-revealing step of fragment navigation), no script needed.
    return (
        f'<details class="episode"{" open" if expand else ""}>'
        f"<summary>{' '.join(summary)}</summary>"
        f'<div class="episode-body" id="{esc(anchor)}">{"".join(body)}</div></details>'
    )


def _meta(entry: EpisodeEntry) -> str:
    t = entry.trajectory
    rows: list[tuple[str, str]] = [
        ("episode", f"<code>{esc(entry.episode_id)}</code>"),
        ("task", f"<code>{esc(entry.task_id)}</code>"),
        (
            "outcome",
            f"{esc(entry.status)} / {esc(entry.failure_category)}"
            + (f": {esc(entry.failure_reason)}" if entry.failure_reason else ""),
        ),
        ("verifier", _verifier(entry, t)),
        (
            "reward",
            f"final {_signed(t.final_reward if t else None)}, total {_signed(entry.total_reward)}",
        ),
        (
            "duration",
            f"{entry.duration_ms / 1000:.2f} s" if entry.duration_ms is not None else "—",
        ),
    ]
    if t is not None:
        rows += [
            ("policy", f"<code>{esc(t.policy)}</code> (seed {t.policy_seed})"),
            (
                "faults",
                f"<code>{esc(_json(t.fault_profile))}</code> (seed {esc(t.fault_seed)})"
                if t.fault_profile
                else "off",
            ),
            (
                "tokens",
                f"{t.prompt_tokens} prompt, {t.completion_tokens} completion"
                if any(
                    s.prompt_tokens is not None or s.completion_tokens is not None for s in t.steps
                )
                else "not reported by the policy",
            ),
        ]
    cells = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in rows)
    return f'<dl class="meta">{cells}</dl>'


def _verifier(entry: EpisodeEntry, t: Trajectory | None) -> str:
    score = "not run" if entry.verifier_score is None else f"{entry.verifier_score:.2f}"
    reason = t.verifier_reason if t is not None else None
    return esc(score) + (f" — {esc(reason)}" if reason else "")


def _qc(qc: QcVerdictInfo) -> str:
    head = (
        f"<h4>Quality gate: {badge(qc.verdict, f'verdict-{qc.verdict}')} "
        f"quality {qc.quality_score:.3f}, reward sign {qc.reward_sign:+d}</h4>"
    )
    if not qc.reasons:
        return head + '<p class="muted">No failed expectation.</p>'
    rows = "".join(
        "<tr>"
        f"<td><code>{esc(r.get('expectation', '?'))}</code></td>"
        f"<td>{esc(r.get('category', ''))}</td>"
        f"<td>{esc(r.get('action', ''))}</td>"
        f"<td>{esc(r.get('message', ''))}</td>"
        "</tr>"
        for r in qc.reasons
    )
    return (
        head + '<table class="small"><thead><tr><th>expectation</th><th>category</th>'
        f"<th>action</th><th>message</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _judgement(j: JudgementInfo, anchor: str) -> str:
    head = f"<h4>Judge <code>{esc(j.judge)}</code> (rubric v{esc(j.judge_version)})</h4>"
    if not j.parsed:
        return head + f'<p class="error">Answer did not parse: {esc(j.parse_error)}</p>'
    scores = "".join(f"<td>{'—' if v is None else f'{v:.1f}'}</td>" for v in j.scores.values())
    names = "".join(f"<th>{esc(k)}</th>" for k in j.scores)
    parts = [
        head,
        f'<table class="small"><thead><tr>{names}</tr></thead><tbody><tr>{scores}</tr>'
        "</tbody></table>",
    ]
    if j.deductions:
        rows = "".join(
            "<tr>"
            f"<td>{esc(d.dimension)}</td><td>−{d.points:g}</td>"
            f"<td>{_step_links(d.steps, anchor)}</td>"
            f"<td>{esc(d.reason)}"
            + (f' <span class="muted">({esc(d.code)})</span>' if d.code else "")
            + "</td></tr>"
            for d in j.deductions
        )
        parts.append(
            '<table class="small"><thead><tr><th>dimension</th><th>points</th><th>steps</th>'
            f"<th>reason</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    else:
        parts.append('<p class="muted">No deduction.</p>')
    if j.suggestion:
        parts.append(f'<p class="suggestion">Suggestion: {esc(j.suggestion)}</p>')
    return "".join(parts)


def _step_links(steps: list[int], anchor: str) -> str:
    if not steps:
        return '<span class="muted">whole episode</span>'
    return ", ".join(f'<a href="#{esc(anchor)}-s{int(i)}">{int(i)}</a>' for i in steps)


def _citations(judgements: list[JudgementInfo]) -> dict[int, list[tuple[str, DeductionInfo]]]:
    cites: dict[int, list[tuple[str, DeductionInfo]]] = {}
    for j in judgements:
        for d in j.deductions:
            for i in d.steps:
                cites.setdefault(i, []).append((j.judge, d))
    return cites


def _step(
    s: Step,
    anchor: str,
    cites: list[tuple[str, DeductionInfo]],
    *,
    max_chars: int | None,
    scored: bool = True,
) -> str:
    head = [f"<b>step {s.index}</b>", badge(str(s.parse_kind), f"parse-{s.parse_kind}")]
    if s.policy_perturbation:
        head.append(badge(f"perturbation: {s.policy_perturbation}", "perturbation"))
    if s.injected_fault is not None:
        head.append(badge(f"fault: {s.injected_fault.kind}", "fault"))
    if s.repetition_warning:
        head.append(badge(f"repeated ×{s.repeat_count}", "warn"))
    if s.soft_timeout_warning:
        head.append(badge("soft timeout", "warn"))
    if s.generation_latency_ms is not None:
        head.append(f'<span class="muted">gen {s.generation_latency_ms:.0f} ms</span>')
    if s.duration_ms is not None:
        head.append(f'<span class="muted">tool {s.duration_ms:.0f} ms</span>')
    if scored:
        head.append(
            f'<span class="reward">reward {s.immediate_reward:+.3f} · return {s.return_:+.3f}</span>'
        )
    parts = [f'<div class="step-head">{" ".join(head)}</div>']
    for judge, d in cites:
        parts.append(
            f'<p class="cite">judge {esc(judge)}: −{d.points:g} {esc(d.dimension)} — '
            f"{esc(d.reason)}</p>"
        )
    parts.append('<div class="label">assistant</div>')
    parts.append(text_block(s.raw_output, max_chars=max_chars, css="assistant"))
    if s.raw_output_truncated:
        parts.append('<p class="cut">The model\'s answer exceeded the output cap.</p>')
    if s.parse_kind == ParseKind.TOOL_CALL:
        parts.append(_call(s, max_chars=max_chars))
    elif s.parse_kind == ParseKind.ERROR:
        parts.append(
            f'<p class="error">parse error <code>{esc(s.parse_error_code or "?")}</code>: '
            f"{esc(s.parse_error or '')}</p>"
        )
    elif s.parse_kind == ParseKind.FINAL and s.final_answer is not None:
        parts.append('<div class="label">final answer</div>')
        parts.append(text_block(s.final_answer, max_chars=max_chars))
    if s.injected_fault is not None:
        parts.append(
            f'<p class="fault">injected fault <b>{esc(s.injected_fault.kind)}</b> '
            f"<code>{esc(_json(s.injected_fault.detail))}</code></p>"
        )
    if s.observation is not None:
        parts.append('<div class="label">observation</div>')
        parts.append(text_block(s.observation, max_chars=max_chars, css="observation"))
    return f'<div class="step" id="{esc(anchor)}-s{s.index}">{"".join(parts)}</div>'


def _call(s: Step, *, max_chars: int | None) -> str:
    ok = not s.tool_failed
    outcome = [f"exit code {esc(s.exit_code) if s.exit_code is not None else '—'}"]
    if s.error_type:
        outcome.append(f"error {esc(s.error_type)}")
    if s.timed_out:
        outcome.append("timed out")
    if s.signal is not None:
        outcome.append(f"signal {s.signal}")
    rows = [
        ("tool", f"<code>{esc(s.tool)}</code>"),
        ("call id", f"<code>{esc(s.call_id)}</code>"),
        ("args", text_block(_args_json(s.args), max_chars=max_chars, css="args")),
        ("result", f'<span class="{"ok" if ok else "bad"}">{", ".join(outcome)}</span>'),
    ]
    if s.files_changed:
        rows.append(
            (
                "files",
                "<br>".join(
                    f"{esc(c.change)} <code>{esc(c.path)}</code> ({esc(c.size)} B)"
                    for c in s.files_changed
                ),
            )
        )
    cells = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="call">{cells}</table>'


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.3f}"


def _args_json(args: Any) -> str:
    """Arguments on one line when short, indented when long (json's C encoder only
    serves the one-line form, and most calls' arguments are short)."""
    compact = _json(args)
    return compact if len(compact) <= 100 else _json(args, indent=2)


def _json(value: Any, *, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=True, default=str)
