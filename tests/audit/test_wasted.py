"""Wasted tokens read by one rule everywhere (``audit.display.wasted_usage_unknown``): a number when every
wasted attempt reported usage, ``≥ N`` when only N tokens of it are known, ``unknown`` when none are, on the
request page and list, the dashboard, the usage page and both CSVs, for the same requests."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from audit.exports import summary_json, write_requests_csv
from audit.models import Attempt, ProxyRequest
from audit.reports import Scope, build_figures
from tests.audit.conftest import PERIOD, T0, AuditRows

Login = Callable[[User], Client]
QUERY = {"start": "2026-01-01", "end": "2026-01-03"}
MODEL = "no-usage-model"


def _request(rows: AuditRows, *, wasted: int, usage: bool, minute: int) -> ProxyRequest:
    """Tenant A's request of ``MODEL``: a failed attempt (with usage or not), then the answer with usage."""
    request = ProxyRequest.objects.create(
        tenant=rows.upstream_a.tenant, upstream=rows.upstream_a, model=MODEL, path="guarded",
        outcome="recovered-by-retry", attempts=2, status=200, total_ms=900.0, prompt_tokens=1800 if usage else 900,
        completion_tokens=40 + wasted, wasted_completion_tokens=wasted, wasted_ms=400.0,
        created=T0 + timedelta(hours=5, minutes=minute), finished=T0 + timedelta(hours=5, minutes=minute + 1))
    Attempt.objects.create(request=request, number=0, upstream=rows.upstream_a, outcome="retry", upstream_status=200,
                           prompt_tokens=900 if usage else 0, completion_tokens=wasted, created=request.created)
    Attempt.objects.create(request=request, number=1, upstream=rows.upstream_a, outcome="clean", upstream_status=200,
                           prompt_tokens=900, completion_tokens=40, created=request.created)
    return request


@pytest.fixture
def unknown(audit_rows: AuditRows) -> ProxyRequest:
    """One request of ``MODEL`` whose wasted attempt reported no usage (so its 0 is not known)."""
    return _request(audit_rows, wasted=0, usage=False, minute=0)


def _model_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in rows if r.get("model", r.get("group")) == MODEL)


def test_a_figure_without_known_usage_reads_unknown_everywhere(unknown: ProxyRequest, viewer_a: User,
                                                               login: Login) -> None:
    client = login(viewer_a)
    page = client.get(reverse("admin:audit_proxyrequest_change", args=[unknown.pk])).content.decode()
    assert re.search(r"<label>Wasted tokens:</label>\s*<div class=\"readonly\">unknown</div>", page)

    dashboard = client.get(reverse("admin:audit_dashboard"), QUERY)
    figures = dashboard.context["figures"]
    assert _model_row(figures["by_model"])["wasted_unknown_requests"] == 1
    assert figures["totals"]["wasted_unknown_requests"] == 1
    model_cells = dashboard.content.decode().split(f"<td>{MODEL}</td>", 1)[1].split("</tr>", 1)[0]
    assert "<td>unknown</td>" in model_cells
    assert f"<strong>≥ {figures['totals']['wasted_completion_tokens']:,}</strong>" in dashboard.content.decode()

    usage = client.get(reverse("admin:audit_usage"), {**QUERY, "group": "model"})
    row = usage.content.decode().split(f"<td>{MODEL}</td>", 1)[1].split("</tr>", 1)[0]
    assert row.count('<td class="num">unknown</td>') == 2  # wasted tokens in and out
    assert _model_row(usage.context["rows"])["wasted_unknown_requests"] == 1

    exported = client.get(reverse("admin:audit_usage"), {**QUERY, "group": "model", "format": "csv"})
    by_group = {r["group"]: r for r in csv.DictReader(io.StringIO(exported.content.decode()))}
    assert (by_group[MODEL]["wasted_prompt_tokens"], by_group[MODEL]["wasted_completion_tokens"]) == (
        "unknown", "unknown")
    assert by_group["deepseek-chat"]["wasted_completion_tokens"].isdigit()

    out = io.StringIO()
    write_requests_csv(Scope(*PERIOD, tenant_ids=(unknown.tenant_id,)), out)
    cells = {r["id"]: r["wasted_completion_tokens"] for r in csv.DictReader(io.StringIO(out.getvalue()))}
    assert cells[str(unknown.pk)] == "unknown"
    assert sum(cell.isdigit() for cell in cells.values()) == len(cells) - 1


def test_a_partly_known_figure_is_at_least_its_known_part_and_a_known_one_is_the_number(
        unknown: ProxyRequest, audit_rows: AuditRows, viewer_a: User, login: Login) -> None:
    _request(audit_rows, wasted=1234, usage=True, minute=5)
    client = login(viewer_a)
    dashboard = client.get(reverse("admin:audit_dashboard"), QUERY).content.decode()
    assert "<td>≥ 1,234</td>" in dashboard.split(f"<td>{MODEL}</td>", 1)[1].split("</tr>", 1)[0]
    exported = client.get(reverse("admin:audit_usage"), {**QUERY, "group": "model", "format": "csv"})
    by_group = {r["group"]: r for r in csv.DictReader(io.StringIO(exported.content.decode()))}
    assert by_group[MODEL]["wasted_completion_tokens"] == "≥ 1234"

    Attempt.objects.filter(request=unknown, number=0).update(prompt_tokens=900)  # now it reported usage
    dashboard = client.get(reverse("admin:audit_dashboard"), QUERY).content.decode()
    assert "<td>1,234</td>" in dashboard.split(f"<td>{MODEL}</td>", 1)[1].split("</tr>", 1)[0]
    page = client.get(reverse("admin:audit_proxyrequest_change", args=[unknown.pk])).content.decode()
    assert re.search(r"<label>Wasted tokens:</label>\s*<div class=\"readonly\">0</div>", page)


def test_the_json_summary_carries_the_count_of_unknown_requests(unknown: ProxyRequest) -> None:
    figures = json.loads(summary_json(build_figures(Scope(*PERIOD, tenant_ids=(unknown.tenant_id,)))))
    assert figures["totals"]["wasted_unknown_requests"] == 1
    assert _model_row(figures["by_model"])["wasted_unknown_requests"] == 1
