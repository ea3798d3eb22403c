"""Charts as inline SVG, generated server-side: no JavaScript, no CDN, nothing to serve.

The dashboard and the self-contained HTML report embed the same markup. On the dashboard every bar
and point is a link to the admin list it counts (``audit.chart_links``); the report has no links.
Count axes have integer ticks. Every text is escaped here; the result is marked safe for templates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from audit.chart_links import CORRUPTED, USABLE, ChartLinks
from audit.reports import Figures, series

#: Per series, per bucket: the URL a point links to.
PointLinks = Mapping[str, Mapping[str, str]]

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


def _linked(markup: str, url: str | None, hint: str) -> str:
    """``markup`` inside an SVG link to ``url`` (``href`` is SVG 2; every browser in use reads it)."""
    if not url:
        return markup
    return f'<a href="{escape(url)}" class="tr-chart-link"><title>{escape(hint)}</title>{markup}</a>'


def bar_chart(title: str, rows: Sequence[tuple[str, float]], *, percent: bool = False,
              links: Sequence[str | None] | None = None) -> Chart:
    """Horizontal bars, one per ``(label, value)``, longest scaled to the full width; ``links[i]`` is
    where bar ``i`` (and its label) leads."""
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
        url = links[i] if links is not None and i < len(links) else None
        bar = (f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end"><title>{escape(label)}</title>'
               f"{escape(short)}</text>"
               f'<rect x="{label_w}" y="{y + 3}" width="{width:.1f}" height="{row_h - 8}" fill="{PALETTE[0]}">'
               f"<title>{escape(label)}: {_fmt(value, percent)}</title></rect>"
               # A full-width transparent strip: the whole row is the link, not just a thin bar.
               + (f'<rect x="0" y="{y}" width="{WIDTH}" height="{row_h}" fill="transparent"/>' if url else "")
               + f'<text x="{label_w + width + 4:.1f}" y="{y + 14}">{_fmt(value, percent)}</text>')
        body.append(_linked(bar, url, f"{label}: show these in the admin"))
    return Chart(title, _svg(16 + len(rows) * row_h, title, body))


def _tick_label(bucket: str) -> str:
    """``2026-01-02T13:00:00Z`` -> ``01-02 13h``; midnight buckets -> ``01-02``; ``…T13:05:00Z`` -> ``13:05``."""
    day, _, clock = bucket.partition("T")
    hour, minute = clock[:2], clock[3:5]
    if minute not in ("", "00"):
        return f"{hour}:{minute}"
    return day[5:] if hour in ("", "00") else f"{day[5:]} {hour}h"


def count_ticks(peak: float) -> list[float]:
    """Integer ticks from 0 covering ``peak``: steps of 1, 2, 5, 10, 20, 50… (at most 6 ticks)."""
    if peak <= 0:
        return [0.0, 1.0]
    raw = peak / 5
    magnitude = 10 ** max(0, math.floor(math.log10(raw))) if raw >= 1 else 1
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    top = step * math.ceil(peak / step)
    return [float(step * n) for n in range(int(top / step) + 1)]


def line_chart(title: str, buckets: Sequence[str], lines: Mapping[str, Mapping[str, float]], *,
               percent: bool = True, links: PointLinks | None = None) -> Chart:
    """One line per series over ``buckets``; a bucket missing from a series is a gap in its line.
    ``links[series][bucket]`` is where that point leads."""
    if not buckets or not lines:
        return _empty(title)
    left, right, top_m, plot_h = 52, 16, 12, 170
    plot_w = WIDTH - left - right
    peak = max((v for values in lines.values() for v in values.values()), default=0)
    ticks = [0, 0.25, 0.5, 0.75, 1.0] if percent else count_ticks(peak)
    y_max = ticks[-1]
    step = plot_w / max(len(buckets) - 1, 1)

    def x(i: int) -> float:
        return left + (i * step if len(buckets) > 1 else plot_w / 2)

    def y(v: float) -> float:
        return top_m + plot_h - plot_h * v / y_max

    body = _grid(left, plot_w, top_m, plot_h, ticks, percent)
    body += _x_ticks(buckets, x, top_m + plot_h)
    for n, (name, values) in enumerate(lines.items()):
        urls = (links or {}).get(name, {})
        body += _line(name, buckets, values, PALETTE[n % len(PALETTE)], x, y, percent, urls)
    legend_y = top_m + plot_h + 34
    body += _legend(list(lines), legend_y)
    rows = (len(lines) + 2) // 3
    return Chart(title, _svg(legend_y + rows * 16 + 4, title, body))


def _grid(left: int, plot_w: float, top: int, height: int, ticks: Sequence[float], percent: bool) -> list[str]:
    out = []
    for value in ticks:
        yy = top + height - height * value / ticks[-1]
        out.append(f'<line x1="{left}" x2="{left + plot_w:.1f}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e5e7eb"/>'
                   f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end" fill="#6b7280">'
                   f"{_fmt(value, percent)}</text>")
    return out


def _x_ticks(buckets: Sequence[str], x: Any, baseline: int) -> list[str]:
    every = max(1, -(-len(buckets) // 6))
    return [f'<text x="{x(i):.1f}" y="{baseline + 16}" text-anchor="middle" fill="#6b7280">'
            f"{escape(_tick_label(b))}</text>" for i, b in enumerate(buckets) if i % every == 0]


def _line(name: str, buckets: Sequence[str], values: Mapping[str, float], color: str, x: Any, y: Any,
          percent: bool, urls: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    run: list[str] = []
    for i, bucket in enumerate(buckets):
        if bucket not in values:
            out += _polyline(run, color)
            run = []
            continue
        px, py = x(i), y(values[bucket])
        run.append(f"{px:.1f},{py:.1f}")
        hint = f"{name} {_tick_label(bucket)}: {_fmt(values[bucket], percent)}"
        dot = f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{color}"><title>{escape(hint)}</title></circle>'
        url = urls.get(bucket)
        if url:  # a larger, invisible target around the dot
            dot = f'<circle cx="{px:.1f}" cy="{py:.1f}" r="7" fill="transparent"/>' + dot
        out.append(_linked(dot, url, hint))
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


def _by_bucket(rows: list[dict[str, Any]], value: str) -> dict[str, float]:
    return {r["bucket"]: r[value] for r in rows}


def figure_charts(figures: Figures, links: ChartLinks | None = None) -> list[Chart]:
    """The charts of a report / the dashboard, in reading order; with ``links`` every bar and point
    leads to the admin list it counts."""
    buckets = [row["bucket"] for row in figures["over_time"]]
    labels = upstream_labels(figures)
    over = figures["over_time"]
    return [
        line_chart("Requests over time", buckets, {"requests": _by_bucket(over, "requests"),
                                                   "guarded": _by_bucket(over, "guarded")},
                   percent=False, links=_request_points(links, buckets)),
        line_chart("Request corruption rate over time (requests needing a retry)", buckets,
                   {"all guarded requests": {r["bucket"]: r["corruption_rate"] for r in over if r["guarded"]}},
                   links=_points(links, {"all guarded requests": {}}, buckets, "requests", CORRUPTED)),
        *_series_charts(figures, buckets, labels, links),
        *_bar_charts(figures, labels, links),
    ]


def _points(links: ChartLinks | None, names: Mapping[str, Mapping[str, Any]], buckets: Sequence[str], target: str,
            base: Mapping[str, str]) -> dict[str, dict[str, str]] | None:
    """For each series ``name`` (its extra filters in ``names[name]``): bucket -> URL."""
    if links is None:
        return None
    make = links.requests if target == "requests" else links.findings
    return {name: {b: make(b, **base, **extra) for b in buckets} for name, extra in names.items()}


def _request_points(links: ChartLinks | None, buckets: Sequence[str]) -> dict[str, dict[str, str]] | None:
    if links is None:
        return None
    return {"requests": {b: links.requests(b) for b in buckets},
            "guarded": {b: links.requests(b, path__exact="guarded") for b in buckets}}


def _series_charts(figures: Figures, buckets: list[str], labels: dict[str, str],
                   links: ChartLinks | None) -> list[Chart]:
    by_upstream = series(figures["over_time_by_upstream"], "upstream_id", "corruption_rate")
    by_model = series(figures["over_time_by_model"], "model", "corruption_rate")
    by_kind = series(figures["over_time_by_kind"], "kind", "requests")
    upstream_points = _points(links, {labels.get(k, k): {"upstream": k} for k in by_upstream}, buckets, "requests",
                              CORRUPTED)
    return [
        line_chart("Request corruption rate by upstream over time", buckets,
                   {labels.get(key, key): line for key, line in by_upstream.items()}, links=upstream_points),
        line_chart("Request corruption rate by model over time", buckets, by_model,
                   links=_points(links, {m: {"model": m} for m in by_model}, buckets, "requests", CORRUPTED)),
        line_chart("Requests with each finding kind over time", buckets, by_kind, percent=False,
                   links=_points(links, {k: {"kind": k} for k in by_kind}, buckets, "findings", {})),
    ]


LinkOf = Callable[[ChartLinks, dict[str, Any]], str]


def _bar_charts(figures: Figures, labels: dict[str, str], links: ChartLinks | None) -> list[Chart]:
    upstreams = [r for r in figures["by_upstream"] if r["guarded"]]
    models = [r for r in figures["by_model"] if r["guarded"]]

    def urls(rows: list[dict[str, Any]], make: LinkOf) -> list[str | None] | None:
        return None if links is None else [make(links, r) for r in rows]

    return [
        bar_chart("Request corruption rate by upstream",
                  [(labels[str(r["upstream_id"])], r["corruption_rate"]) for r in upstreams], percent=True,
                  links=urls(upstreams, lambda to, r: to.requests(upstream=r["upstream_id"] or "", **CORRUPTED))),
        bar_chart("Request corruption rate by model", [(r["model"], r["corruption_rate"]) for r in models],
                  percent=True, links=urls(models, lambda to, r: to.requests(model=r["model"], **CORRUPTED))),
        bar_chart("Share of requests by finding kind", [(r["kind"], r["share"]) for r in figures["by_kind"]],
                  percent=True, links=urls(figures["by_kind"], lambda to, r: to.findings(kind=r["kind"]))),
        bar_chart("Usable answers by attempt number",
                  [(f"attempt {r['attempt']}", r["requests"]) for r in figures["recovery_by_attempt"]],
                  links=urls(figures["recovery_by_attempt"],
                             lambda to, r: to.requests(attempts=r["attempt"], **USABLE))),
        bar_chart("Most affected tools (requests)", [(r["tool"], r["requests"]) for r in figures["tools"]],
                  links=urls(figures["tools"], lambda to, r: to.findings(q=r["tool"]))),
        bar_chart("Most affected clients (corrupted requests)",
                  [(r["user_agent"] or "(no user agent)", r["corrupted"]) for r in figures["clients"]],
                  links=urls(figures["clients"],
                             lambda to, r: to.requests(client_user_agent=r["user_agent"], **CORRUPTED))),
    ]


#: Bars per usage chart (the rest is in the table and the CSV).
USAGE_BARS = 15


def usage_charts(rows: Sequence[dict[str, Any]], over_time: Sequence[dict[str, Any]]) -> list[Chart]:
    """The usage page's charts (``audit.usage``): tokens and requests over time, then per group (the
    ``USAGE_BARS`` largest) tokens, wasted tokens and seconds, loops broken."""
    buckets = [r["bucket"] for r in over_time]

    def line(name: str) -> dict[str, float]:
        return {r["bucket"]: r[name] for r in over_time}

    def bars(title: str, value: Callable[[dict[str, Any]], float]) -> Chart:
        top = sorted(rows, key=lambda r: -value(r))[:USAGE_BARS]
        return bar_chart(title, [(r["group"], value(r)) for r in top if value(r)])

    return [
        line_chart("Tokens over time", buckets, {"input": line("prompt_tokens"), "output": line("completion_tokens"),
                                                 "output wasted on failed attempts": line("wasted_completion_tokens")},
                   percent=False),
        line_chart("Requests over time", buckets, {"requests": line("requests")}, percent=False),
        bars("Tokens (input + output)", lambda r: r["prompt_tokens"] + r["completion_tokens"]),
        bars("Tokens wasted on failed attempts (input + output)",
             lambda r: r["wasted_prompt_tokens"] + r["wasted_completion_tokens"]),
        bars("Seconds wasted on failed attempts", lambda r: r["wasted_seconds"]),
        bars("Agent loops broken", lambda r: r["loops_broken"]),
    ]
