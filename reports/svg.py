"""Inline SVG charts for the run report: histograms, horizontal rate bars, a stacked bar.

Pure functions from numbers to SVG text; no JavaScript, no external assets, every label
escaped (template and tool names come from user suites and model output).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from itertools import pairwise

from pydantic import BaseModel

STATUS_COLORS = {
    "success": "#2f9e44",
    "failed": "#e8a33d",
    "timeout": "#f76707",
    "env_error": "#e03131",
    "policy_error": "#9c36b5",
    "storage_error": "#495057",
    "endpoint_error": "#1c7ed6",
    "aborted": "#868e96",
    "imported": "#adb5bd",
}
"""Fill colour per episode status (the same in charts, badges and tables)."""

_FONT = "font-family:system-ui,sans-serif;font-size:11px"


class Bin(BaseModel):
    """One histogram bin: values in [lo, hi) (the last bin includes hi)."""

    lo: float
    """Lower edge."""
    hi: float
    """Upper edge."""
    count: int
    """Values in the bin."""
    label: str
    """Axis label."""
    span: str
    """The bin's range, shown when hovering its bar."""


def histogram_bins(values: Sequence[float], *, integer: bool, max_bins: int = 12) -> list[Bin]:
    """Bins for `values`: one per integer when integer values span few, else equal width."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if integer:
        span = int(hi) - int(lo) + 1
        width = max(1, math.ceil(span / max_bins))
        edges = [int(lo) + i * width for i in range(math.ceil(span / width) + 1)]
        bins = [
            Bin(
                lo=a,
                hi=b,
                count=0,
                label=str(a) if width == 1 else f"{a}–{b - 1}",
                span=str(a) if width == 1 else f"{a} to {b - 1}",
            )
            for a, b in pairwise(edges)
        ]
        for v in values:
            bins[min(len(bins) - 1, (int(v) - int(lo)) // width)].count += 1
        return bins
    if hi == lo:
        return [Bin(lo=lo, hi=hi, count=len(values), label=_num(lo), span=_num(lo))]
    n = min(max_bins, max(3, math.ceil(math.sqrt(len(values)))))
    width_f = (hi - lo) / n
    bins = [
        Bin(
            lo=lo + i * width_f,
            hi=lo + (i + 1) * width_f,
            count=0,
            label=_num(lo + i * width_f),
            span=f"{_num(lo + i * width_f)} to {_num(lo + (i + 1) * width_f)}",
        )
        for i in range(n)
    ]
    for v in values:
        bins[min(n - 1, int((v - lo) / width_f))].count += 1
    return bins


def histogram_svg(
    bins: Sequence[Bin], *, title: str, color: str = "#4263eb", edge_labels: bool = False
) -> str:
    """A vertical bar chart of `bins` with counts above the bars and labels below: centred
    under each bar, or with `edge_labels` at the bin edges (continuous values)."""
    if not bins:
        return f'<p class="empty">{escape(title)}: no values</p>'
    width, height, left, bottom, top = 520, 200, 34, 38, 18
    left_pad = 10 if edge_labels else 0  # room for the first edge label
    left += left_pad
    plot_w, plot_h = width - left - 8 - left_pad, height - bottom - top
    peak = max(b.count for b in bins) or 1
    slot = plot_w / len(bins)
    parts = [_svg_open(width, height, title)]
    parts.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 8}" y2="{top + plot_h}" '
        'stroke="#adb5bd"/>'
    )
    parts.append(
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" style="{_FONT}">{peak}</text>'
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" style="{_FONT}">0</text>'
    )
    label_every = max(1, math.ceil(len(bins) / 10))
    for i, b in enumerate(bins):
        h = plot_h * b.count / peak
        x = left + i * slot + 2
        y = top + plot_h - h
        tip = f"{b.span}: {b.count}"
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(slot - 4, 1):.1f}" height="{h:.1f}" '
            f'fill="{color}"><title>{escape(tip)}</title></rect>'
        )
        if b.count:
            parts.append(
                f'<text x="{x + (slot - 4) / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
                f'style="{_FONT}">{b.count}</text>'
            )
        if i % label_every == 0 and not edge_labels:
            parts.append(
                f'<text x="{x + (slot - 4) / 2:.1f}" y="{top + plot_h + 14}" '
                f'text-anchor="middle" style="{_FONT}">{escape(b.label)}</text>'
            )
    if edge_labels and len(bins) > 1:
        edges = [b.lo for b in bins] + [bins[-1].hi]
        for i, edge in enumerate(edges):
            if i % label_every == 0 or i == len(edges) - 1:
                parts.append(
                    f'<text x="{left + i * slot:.1f}" y="{top + plot_h + 14}" '
                    f'text-anchor="middle" style="{_FONT}">{escape(_num(edge))}</text>'
                )
    elif edge_labels:
        parts.append(
            f'<text x="{left + slot / 2:.1f}" y="{top + plot_h + 14}" text-anchor="middle" '
            f'style="{_FONT}">{escape(bins[0].label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def rate_bars_svg(rows: Sequence[tuple[str, float, str]], *, title: str, color: str) -> str:
    """Horizontal bars: (label, rate in [0, 1], annotation) per row."""
    if not rows:
        return f'<p class="empty">{escape(title)}: nothing to show</p>'
    row_h, label_w, bar_w, note_w = 22, 170, 260, 150
    width, height = label_w + bar_w + note_w, row_h * len(rows) + 6
    parts = [_svg_open(width, height, title)]
    for i, (label, rate, note) in enumerate(rows):
        y = 3 + i * row_h
        clipped = min(max(rate, 0.0), 1.0)
        short = label if len(label) <= 26 else label[:25] + "…"
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end" style="{_FONT}">'
            f"<title>{escape(label)}</title>{escape(short)}</text>"
            f'<rect x="{label_w}" y="{y + 3}" width="{bar_w}" height="{row_h - 8}" fill="#f1f3f5"/>'
            f'<rect x="{label_w}" y="{y + 3}" width="{bar_w * clipped:.1f}" height="{row_h - 8}" '
            f'fill="{color}"/>'
            f'<text x="{label_w + bar_w + 6}" y="{y + 14}" style="{_FONT}">{escape(note)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def stacked_bar_svg(parts_in: Sequence[tuple[str, int]], *, title: str) -> str:
    """One horizontal bar split by status, with a legend; colours from `STATUS_COLORS`."""
    total = sum(n for _, n in parts_in)
    if not total:
        return f'<p class="empty">{escape(title)}: no episodes</p>'
    width, bar_h = 780, 26
    legend_rows = math.ceil(len(parts_in) / 4)
    height = bar_h + 8 + 20 * legend_rows
    parts = [_svg_open(width, height, title)]
    x = 0.0
    for label, n in parts_in:
        w = width * n / total
        tip = f"{label}: {n} ({n / total:.0%})"
        parts.append(
            f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="{bar_h}" '
            f'fill="{status_color(label)}"><title>{escape(tip)}</title></rect>'
        )
        x += w
    for i, (label, n) in enumerate(parts_in):
        lx, ly = (i % 4) * (width / 4), bar_h + 8 + (i // 4) * 20
        parts.append(
            f'<rect x="{lx:.1f}" y="{ly}" width="12" height="12" fill="{status_color(label)}"/>'
            f'<text x="{lx + 16:.1f}" y="{ly + 10}" style="{_FONT}">'
            f"{escape(f'{label}: {n} ({n / total:.0%})')}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def status_color(status: str) -> str:
    """The colour of a status; grey for one this version does not know."""
    return STATUS_COLORS.get(status, "#adb5bd")


def _svg_open(width: int, height: int, title: str) -> str:
    return (
        f'<svg role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>{escape(title)}</title>'
    )


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:.0f}"
