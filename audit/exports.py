"""Report exports: CSV of requests and of findings, the JSON summary, one self-contained HTML page.

Writers stream rows from the database (``iterator``) into a file object, so a period of millions
of requests never sits in memory. CSV cells are made safe for spreadsheets as OWASP advises
(https://owasp.org/www-community/attacks/CSV_Injection): every cell is quoted, and a text cell
that starts with ``= + - @``, tab or CR, or contains a line break, gets a leading apostrophe, as
does every line inside it that starts with one (a reader that splits rows on a bare CR would
otherwise start a row with ``=HYPERLINK(...)``). The user agent, the model name and a finding's
detail come from clients and upstreams. Columns are documented in docs/reports.md.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

from django.db.models import Count, F
from django.template.loader import render_to_string

from audit.chart_links import ChartLinks
from audit.charts import figure_charts, upstream_labels
from audit.display import attempt_ordinal, wasted_figure, wasted_tokens, wasted_usage_unknown
from audit.reports import Figures, Scope

REQUEST_COLUMNS = (
    "id", "created", "finished", "tenant", "member", "upstream", "model", "upstream_model", "client_protocol",
    "client_user_agent", "path", "outcome", "status", "attempts", "ttft_ms", "total_ms", "prompt_tokens",
    "completion_tokens", "wasted_completion_tokens", "wasted_ms", "cache_read_tokens", "cache_write_tokens",
    "reasoning_tokens", "usage_estimated", "cost_usd", "delivered_usd", "wasted_usd", "unpriced", "findings", "error",
)
FINDING_COLUMNS = (
    "id", "request_id", "attempt", "created", "tenant", "upstream", "model", "kind", "severity", "action",
    "tool_name", "choice", "slot", "frame", "byte_offset", "detail",
)
#: Token columns of figures rows that follow the wasted-usage rule (``wasted_cells``).
WASTED_TOKEN_COLUMNS = ("wasted_prompt_tokens", "wasted_completion_tokens")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
#: A line break followed by a character that would start a formula on a line of its own.
_BREAK_BEFORE_FORMULA = re.compile(r"(\r\n|\r|\n)(?=[=+\-@\t])")
_CHUNK = 2000


def cell(value: Any) -> Any:
    """A CSV-safe cell: UTC ISO times, blanks for None, formula-looking text defused."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, str):
        return defuse(value)
    return value


def defuse(text: str) -> str:
    """``text`` that no spreadsheet runs as a formula: a leading ``'`` when it starts like one
    (``= + - @``, tab, CR) or holds a line break, and after each line break that precedes one."""
    multiline = "\r" in text or "\n" in text
    if multiline:
        text = _BREAK_BEFORE_FORMULA.sub(r"\1'", text)
    return "'" + text if multiline or text.startswith(_FORMULA_START) else text


def _write(out: TextIO, columns: tuple[str, ...], rows: Iterable[dict[str, Any]]) -> int:
    writer = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writerow(columns)
    count = 0
    for row in rows:
        writer.writerow([cell(row[c]) for c in columns])
        count += 1
    return count


def write_rows(out: TextIO, columns: tuple[str, ...], rows: Iterable[dict[str, Any]]) -> int:
    """``rows`` (dicts with at least ``columns``) as safe CSV into ``out``, a header first; returns the rows."""
    return _write(out, columns, rows)


def wasted_cells(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Figures rows with their wasted token columns as CSV cells by the pages' rule (``audit.display.wasted_figure``:
    the number, ``≥ N`` or ``unknown``; no thousands separators)."""
    for row in rows:
        cells = {c: wasted_figure(row, c, grouped=False) for c in WASTED_TOKEN_COLUMNS if c in row}
        yield {**row, **cells}


def _request_rows(scope: Scope) -> Iterator[dict[str, Any]]:
    rows = (scope.requests().order_by("created", "id")
            .annotate(tenant_slug=F("tenant__slug"), upstream_name=F("upstream__name"), n_findings=Count("findings"),
                      wasted_unknown=wasted_usage_unknown())
            .values(*[c for c in REQUEST_COLUMNS if c not in ("tenant", "member", "upstream", "findings")],
                    "tenant_slug", "upstream_name", "n_findings", "member_username", "wasted_unknown"))
    for row in rows.iterator(chunk_size=_CHUNK):
        wasted = wasted_tokens(row["wasted_completion_tokens"], int(row["wasted_unknown"]), grouped=False)
        yield {**row, "tenant": row["tenant_slug"], "member": row["member_username"], "upstream": row["upstream_name"],
               "findings": row["n_findings"], "wasted_completion_tokens": wasted}


def write_requests_csv(scope: Scope, out: TextIO) -> int:
    """One row per request of ``scope`` (oldest first); returns the number of rows."""
    return _write(out, REQUEST_COLUMNS, _request_rows(scope))


def _finding_rows(scope: Scope) -> Iterator[dict[str, Any]]:
    rows = (scope.findings().order_by("request__created", "request_id", "id")
            .values("id", "request_id", "created", "kind", "severity", "action", "tool_name", "choice", "slot",
                    "frame", "byte_offset", "detail", attempt_number=F("attempt__number"),
                    tenant_slug=F("request__tenant__slug"), upstream_name=F("request__upstream__name"),
                    request_model=F("request__model")))
    for row in rows.iterator(chunk_size=_CHUNK):
        number = row["attempt_number"]
        yield {**row, "attempt": None if number is None else attempt_ordinal(number), "tenant": row["tenant_slug"],
               "upstream": row["upstream_name"], "model": row["request_model"]}


def write_findings_csv(scope: Scope, out: TextIO) -> int:
    """One row per finding of the scope's requests (their fragments are not exported)."""
    return _write(out, FINDING_COLUMNS, _finding_rows(scope))


def summary_json(figures: Figures) -> str:
    """The JSON summary (``audit.schema.SUMMARY_SCHEMA``), keys sorted, indented."""
    return json.dumps(figures, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def report_html(figures: Figures, *, title: str) -> str:
    """One self-contained page (inline CSS and SVG, no scripts, no external links)."""
    return render_to_string("audit/report.html", figure_context(figures, title=title))


def figure_context(figures: Figures, *, title: str, links: ChartLinks | None = None) -> dict[str, Any]:
    """Template context shared by the HTML report and the dashboard (``links``: the dashboard's
    click-through into the admin lists; the self-contained report has none)."""
    labels = upstream_labels(figures)
    by_upstream = [{**row, "label": labels[str(row["upstream_id"])]} for row in figures["by_upstream"]]
    outcomes = sorted(figures["outcomes"].items(), key=lambda kv: -kv[1])
    return {"title": title, "figures": figures, "charts": figure_charts(figures, links), "by_upstream": by_upstream,
            "outcomes": [(name, count, links.requests(outcome__exact=name) if links else None)
                         for name, count in outcomes]}
