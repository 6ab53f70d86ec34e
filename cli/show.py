"""Render a trajectory readably in the terminal (`epiflow show`).

Model output, tool output and task text are data, not markup and not terminal control:
they are printed as rich `Text` (no markup parsing, no highlighting; rich's highlighter is
quadratic on long lines without spaces) after `fit_text` has made their control
characters visible (`cli.terminal.neutralise`: an `ESC[2J` in a model's output cannot
clear the screen) and cut them to size, in linear passes. By
default a block is cut at `max_chars` and each line at `LINE_CLIP` characters, with a
marker saying how much was left out; `--full` keeps everything and folds long lines at
the terminal width; `--raw` prints the stored trajectory object itself.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agent.trajectory import EpisodeStatus, ParseKind, Step, Trajectory
from cli.terminal import neutralise

_STATUS_STYLE = {"success": "green", "failed": "yellow", "imported": "dim"}

LINE_CLIP = 400
"""Characters of one line shown by default; the rest is replaced by a marker."""


def fit_text(text: str, *, max_chars: int | None, width: int) -> str:
    """`text` ready to print, in time linear in its length.

    With `max_chars` (the default view): at most `max_chars` characters, each line clipped
    at `LINE_CLIP`, markers saying what was left out. Without (`--full`): everything,
    lines longer than `width` folded onto several lines.
    """
    tail = ""
    if max_chars is not None and len(text) > max_chars:
        tail = f"\n… ({len(text) - max_chars} more characters; --full shows all)"
        text = text[:max_chars]
    lines = []
    for line in text.split("\n"):
        if max_chars is not None and len(line) > LINE_CLIP:
            hidden = len(line) - LINE_CLIP
            lines.append(f"{line[:LINE_CLIP]} … [+{hidden} characters on this line]")
        elif max_chars is None and len(line) > width:
            lines.extend(line[i : i + width] for i in range(0, len(line), width))
        else:
            lines.append(line)
    return "\n".join(lines) + tail


def _safe(value: str, style: str = "") -> Text:
    """Stored text as rich `Text`, its control characters made visible."""
    return Text(neutralise(value), style=style)


def render_trajectory(t: Trajectory, console: Console, *, max_chars: int | None = 1200) -> None:
    """Header (task, policy, outcome), then each step: model text, parsed call, observation."""
    style = _STATUS_STYLE.get(str(t.status), "red")
    width = max(console.width - 4, 20)

    def fit(value: str) -> Text:
        return Text(fit_text(value, max_chars=max_chars, width=width))

    head = Table.grid(padding=(0, 2))
    head.add_row("episode", _safe(str(t.episode_id)))
    head.add_row("run", _safe(t.run_key))
    head.add_row("task", _safe(f"{t.task_id} (difficulty {t.difficulty})"))
    head.add_row("policy", _safe(t.policy))
    if t.agent is not None:
        head.add_row("agent", _safe(f"{t.agent.name} {t.agent.version} (imported)"))
    status = _safe(str(t.status), style=style)
    status.append(neutralise(f" / {t.failure_category}"))
    if t.failure_reason:
        status.append(": " + fit_text(t.failure_reason, max_chars=max_chars, width=width))
    head.add_row("status", status)
    head.add_row("verifier", _safe(f"{t.verifier_score} {t.verifier_reason or ''}"))
    scored = t.status != EpisodeStatus.IMPORTED
    if scored:
        head.add_row("reward", Text(f"final {t.final_reward}, total {t.total_reward}"))
    else:
        head.add_row("reward", Text("not recorded (imported, no outcome in the file)"))
    if t.started_at is None:
        head.add_row("times", Text("not recorded"))
    head.add_row("faults", _safe(str(t.fault_profile or "off")))
    console.print(Panel(head, title="epiflow episode", expand=False))
    if t.agent is None:
        console.rule(Text("task prompt"))
        console.print(fit(t.prompt))
    context: dict[int, list[tuple[str, str]]] = {}
    for c in t.context_steps:
        context.setdefault(c.before_step, []).append((c.source, c.message))
    for index in range(len(t.steps) + 1):
        for source, message in context.get(index, []):
            console.rule(_safe(f"{source} (imported)"))
            console.print(fit(message))
        if index < len(t.steps):
            _step(t.steps[index], console, fit, scored=scored)


def _step(s: Step, console: Console, fit: Callable[[str], Text], *, scored: bool) -> None:
    meta = [f"step {s.index}", str(s.parse_kind)]
    if s.generation_latency_ms is not None:
        meta.append(f"gen {s.generation_latency_ms:.0f} ms")
    if s.duration_ms is not None:
        meta.append(f"tool {s.duration_ms:.0f} ms")
    if s.injected_fault:
        meta.append(f"fault {s.injected_fault.kind}")
    if s.policy_perturbation:
        meta.append(f"perturbation {s.policy_perturbation}")
    if scored:  # an imported episode with no recorded outcome was never scored
        meta.append(f"reward {s.immediate_reward:+.3f}, return {s.return_:+.3f}")
    console.rule(_safe(" · ".join(meta)))
    if s.reasoning_content is not None:
        console.print(Text("reasoning", style="bold blue"))
        console.print(fit(s.reasoning_content))
    console.print(Text("assistant", style="bold cyan"))
    console.print(fit(s.raw_output))
    if s.parse_kind == ParseKind.TOOL_CALL:
        outcome = (
            f"failed: exit {s.exit_code} {s.error_type or ''}".rstrip()
            + (" (timed out)" if s.timed_out else "")
            + (f" (signal {s.signal})" if s.signal is not None else "")
            if s.tool_failed
            else ("ok" if s.exit_code is not None else "outcome not recorded")
        )
        line = Text("call ", style="bold")
        line.append_text(fit(f"{s.call_id} {s.tool}({s.args}) → {outcome}"))
        console.print(line)
        for change in s.files_changed:
            console.print(
                _safe(
                    f"  {change.change} {change.path} ({change.size} B, "
                    f"sha256 {str(change.sha256)[:12]})",
                    style="dim",
                )
            )
    elif s.parse_kind == ParseKind.ERROR:
        line = Text("parse error ", style="bold red")
        line.append_text(fit(s.parse_error or ""))
        console.print(line)
    if s.observation is not None:
        console.print(Text("observation", style="bold"))
        console.print(fit(s.observation))
