"""Render a trajectory readably in the terminal (`epiflow show`)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from agent.trajectory import ParseKind, Step, Trajectory

_STATUS_STYLE = {"success": "green", "failed": "yellow"}


def _cut(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n… ({len(text) - max_chars} more characters; --full shows all)"


def render_trajectory(t: Trajectory, console: Console, *, max_chars: int | None = 1200) -> None:
    """Header (task, policy, outcome), then each step: model text, parsed call, observation."""
    style = _STATUS_STYLE.get(str(t.status), "red")
    head = Table.grid(padding=(0, 2))
    head.add_row("episode", str(t.episode_id))
    head.add_row("run", t.run_key)
    head.add_row("task", f"{t.task_id} (difficulty {t.difficulty})")
    head.add_row("policy", t.policy)
    head.add_row(
        "status",
        f"[{style}]{t.status}[/] / {t.failure_category}"
        + (f": {escape(t.failure_reason)}" if t.failure_reason else ""),
    )
    head.add_row("verifier", f"{t.verifier_score} {escape(t.verifier_reason or '')}")
    head.add_row("reward", f"final {t.final_reward}, total {t.total_reward}")
    head.add_row("faults", str(t.fault_profile or "off"))
    console.print(Panel(head, title="epiflow episode", expand=False))
    console.print(Panel(escape(_cut(t.prompt, max_chars)), title="task prompt", expand=False))
    for step in t.steps:
        _step(step, console, max_chars)


def _step(s: Step, console: Console, max_chars: int | None) -> None:
    meta = [f"step {s.index}", str(s.parse_kind)]
    if s.generation_latency_ms is not None:
        meta.append(f"gen {s.generation_latency_ms:.0f} ms")
    if s.duration_ms is not None:
        meta.append(f"tool {s.duration_ms:.0f} ms")
    if s.injected_fault:
        meta.append(f"[magenta]fault {s.injected_fault.kind}[/]")
    if s.policy_perturbation:
        meta.append(f"[magenta]perturbation {s.policy_perturbation}[/]")
    meta.append(f"reward {s.immediate_reward:+.3f}, return {s.return_:+.3f}")
    console.rule(" · ".join(meta))
    console.print("[bold cyan]assistant[/]")
    console.print(escape(_cut(s.raw_output, max_chars)))
    if s.parse_kind == ParseKind.TOOL_CALL:
        outcome = (
            f"failed: exit {s.exit_code} {s.error_type or ''}".rstrip()
            + (" (timed out)" if s.timed_out else "")
            + (f" (signal {s.signal})" if s.signal is not None else "")
            if s.tool_failed
            else ("ok" if s.exit_code is not None else "ok (no exit code recorded)")
        )
        console.print(f"[bold]call[/] {s.call_id} {s.tool}({escape(str(s.args))}) → {outcome}")
        for change in s.files_changed:
            console.print(
                f"  [dim]{change.change} {change.path} ({change.size} B, sha256 {str(change.sha256)[:12]})[/]"
            )
    elif s.parse_kind == ParseKind.ERROR:
        console.print(f"[bold red]parse error[/] {escape(s.parse_error or '')}")
    if s.observation is not None:
        console.print("[bold]observation[/]")
        console.print(escape(_cut(s.observation, max_chars)))
