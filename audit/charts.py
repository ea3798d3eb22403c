"""Charts as inline SVG, generated server-side: no JavaScript, no CDN, nothing to serve.

The dashboard and the self-contained HTML report embed the same markup. Every text is escaped
here; the result is marked safe for templates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from audit.reports import Figures, series

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2")
WIDTH = 640
FONT = 'font-family="system-ui, sans-serif" font-size="11"'


@dataclass(frozen=True, slots=True)
class Chart:
    """A titled chart; ``svg`` is safe markup."""

    title: str
    svg: SafeString


def _fmt(value: float, percent: bool) -> str:
    if percent:
        return f"{value * 100:.1f}%"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def _svg(height: int, title: str, body: list[str]) -> SafeString:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="100%" '
            f'class="tr-svg" role="img" aria-label="{escape(title)}" {FONT}>'
            f"<title>{escape(title)}</title>")
    return mark_safe(head + "".join(body) + "</svg>")  # noqa: S308 - every text above is escaped


def _empty(title: str) -> Chart:
    return Chart(title, _svg(40, title, ['<text x="8" y="24" fill="#6b7280">No data for this period.</text>']))


def bar_chart(title: str, rows: Sequence[tuple[str, float]], *, percent: bool = False) -> Chart:
    """Horizontal bars, one per ``(label, value)``, longest scaled to the full width."""
    if not rows:
        return _empty(title)
    label_w, bar_w, row_h = 230, 330, 22
    top = max((v for _, v in rows), default=0) or 1
    top = max(top, 1.0) if percent else top
    body = []
    for i, (label, value) in enumerate(rows):
        y = 8 + i * row_h
        width = max(bar_w * value / top, 1 if value else 0)
        short = label if len(label) <= 36 else label[:35] + "…"
        body.append(
            f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end"><title>{escape(label)}</title>'
            f"{escape(short)}</text>"
            f'<rect x="{label_w}" y="{y + 3}" width="{width:.1f}" height="{row_h - 8}" fill="{PALETTE[0]}">'
            f"<title>{escape(label)}: {_fmt(value, percent)}</title></rect>"
            f'<text x="{label_w + width + 4:.1f}" y="{y + 14}">{_fmt(value, percent)}</text>')
    return Chart(title, _svg(16 + len(rows) * row_h, title, body))


def _tick_label(bucket: str) -> str:
    """``2026-01-02T13:00:00Z`` -> ``01-02 13h``; midnight buckets -> ``01-02``."""
    day, _, clock = bucket.partition("T")
    hour = clock[:2]
    return day[5:] if hour in ("", "00") else f"{day[5:]} {hour}h"


def line_chart(title: str, buckets: Sequence[str], lines: Mapping[str, Mapping[str, float]], *,
               percent: bool = True) -> Chart:
    """One line per series over ``buckets``; a bucket missing from a series is a gap in its line."""
    if not buckets or not lines:
        return _empty(title)
    left, right, top_m, plot_h = 52, 16, 12, 170
    plot_w = WIDTH - left - right
    peak = max((v for values in lines.values() for v in values.values()), default=0)
    y_max = 1.0 if percent else (peak or 1)
    step = plot_w / max(len(buckets) - 1, 1)

    def x(i: int) -> float:
        return left + (i * step if len(buckets) > 1 else plot_w / 2)

    def y(v: float) -> float:
        return top_m + plot_h - plot_h * v / y_max

    body = _grid(left, plot_w, top_m, plot_h, y_max, percent)
    body += _x_ticks(buckets, x, top_m + plot_h)
    for n, (name, values) in enumerate(lines.items()):
        body += _line(name, buckets, values, PALETTE[n % len(PALETTE)], x, y, percent)
    legend_y = top_m + plot_h + 34
    body += _legend(list(lines), legend_y)
    rows = (len(lines) + 2) // 3
    return Chart(title, _svg(legend_y + rows * 16 + 4, title, body))


def _grid(left: int, plot_w: float, top: int, height: int, y_max: float, percent: bool) -> list[str]:
    out = []
    for q in (0, 0.25, 0.5, 0.75, 1):
        yy = top + height - height * q
        out.append(f'<line x1="{left}" x2="{left + plot_w:.1f}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e5e7eb"/>'
                   f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end" fill="#6b7280">'
                   f"{_fmt(y_max * q, percent)}</text>")
    return out


def _x_ticks(buckets: Sequence[str], x: Any, baseline: int) -> list[str]:
    every = max(1, -(-len(buckets) // 6))
    return [f'<text x="{x(i):.1f}" y="{baseline + 16}" text-anchor="middle" fill="#6b7280">'
            f"{escape(_tick_label(b))}</text>" for i, b in enumerate(buckets) if i % every == 0]


def _line(name: str, buckets: Sequence[str], values: Mapping[str, float], color: str, x: Any, y: Any,
          percent: bool) -> list[str]:
    out: list[str] = []
    run: list[str] = []
    for i, bucket in enumerate(buckets):
        if bucket not in values:
            out += _polyline(run, color)
            run = []
            continue
        px, py = x(i), y(values[bucket])
        run.append(f"{px:.1f},{py:.1f}")
        out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{color}"><title>{escape(name)} '
                   f"{escape(_tick_label(bucket))}: {_fmt(values[bucket], percent)}</title></circle>")
    return out + _polyline(run, color)


def _polyline(points: list[str], color: str) -> list[str]:
    if len(points) < 2:
        return []
    return [f'<polyline points="{" ".join(points)}" fill="none" stroke="{color}" stroke-width="2"/>']


def _legend(names: list[str], top: int) -> list[str]:
    out = []
    for n, name in enumerate(names):
        col, row = n % 3, n // 3
        xx, yy = 52 + col * 196, top + row * 16
        short = name if len(name) <= 28 else name[:27] + "…"
        out.append(f'<rect x="{xx}" y="{yy}" width="10" height="10" fill="{PALETTE[n % len(PALETTE)]}"/>'
                   f'<text x="{xx + 14}" y="{yy + 9}"><title>{escape(name)}</title>{escape(short)}</text>')
    return out


def upstream_labels(figures: Figures) -> dict[str, str]:
    """Upstream id (as text) -> its name, prefixed with the tenant when several tenants are covered."""
    rows = figures["by_upstream"]
    several = len({r["tenant"] for r in rows if r["tenant"]}) > 1
    return {str(r["upstream_id"]): f"{r['tenant']}/{r['upstream']}" if several and r["tenant"] else r["upstream"]
            for r in rows}


def figure_charts(figures: Figures) -> list[Chart]:
    """The charts of a report / the dashboard, in reading order."""
    buckets = [row["bucket"] for row in figures["over_time"]]
    labels = upstream_labels(figures)
    overall = {"all guarded requests": {r["bucket"]: r["corruption_rate"] for r in figures["over_time"]
                                        if r["guarded"]}}
    requests = {"requests": {r["bucket"]: r["requests"] for r in figures["over_time"]},
                "guarded": {r["bucket"]: r["guarded"] for r in figures["over_time"]}}
    return [
        line_chart("Requests over time", buckets, requests, percent=False),
        line_chart("Corruption rate over time", buckets, overall),
        line_chart("Corruption rate by upstream over time", buckets,
                   {labels.get(key, key): line for key, line in
                    series(figures["over_time_by_upstream"], "upstream_id", "corruption_rate").items()}),
        line_chart("Corruption rate by model over time", buckets,
                   series(figures["over_time_by_model"], "model", "corruption_rate")),
        line_chart("Requests with each finding kind over time", buckets,
                   series(figures["over_time_by_kind"], "kind", "requests"), percent=False),
        bar_chart("Corruption rate by upstream",
                  [(labels[str(r["upstream_id"])], r["corruption_rate"]) for r in figures["by_upstream"]
                   if r["guarded"]],
                  percent=True),
        bar_chart("Corruption rate by model",
                  [(r["model"], r["corruption_rate"]) for r in figures["by_model"] if r["guarded"]], percent=True),
        bar_chart("Share of requests by finding kind", [(r["kind"], r["share"]) for r in figures["by_kind"]],
                  percent=True),
        bar_chart("Usable answers by attempt number",
                  [(f"attempt {r['attempt']}", r["requests"]) for r in figures["recovery_by_attempt"]]),
        bar_chart("Most affected tools (requests)", [(r["tool"], r["requests"]) for r in figures["tools"]]),
        bar_chart("Most affected clients (corrupted requests)",
                  [(r["user_agent"] or "(no user agent)", r["corrupted"]) for r in figures["clients"]]),
    ]
