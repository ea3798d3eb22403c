"""The dashboard: figures and charts for a period and tenant, staff only, tenant-scoped."""

from __future__ import annotations

import re
from collections.abc import Callable

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.audit.conftest import AuditRows

Login = Callable[[User], Client]
URL = "admin:audit_dashboard"


def _without_csrf(content: bytes) -> bytes:
    """The page without its per-response CSRF token (the admin's logout form) and CSP nonces."""
    return re.sub(rb'name="csrfmiddlewaretoken" value="[^"]*"|nonce="[^"]*"', b"", content)


def _dashboard(client: Client, **query: object) -> Client:
    return client.get(reverse(URL), query)  # type: ignore[return-value]


def test_it_shows_the_figures_and_charts_of_the_chosen_period(audit_rows: AuditRows, viewer_a: User,
                                                              login: Login) -> None:
    """Tenant A's three days: the hand-computed totals, eleven inline SVG charts, the tables."""
    page = _dashboard(login(viewer_a), start="2026-01-01", end="2026-01-03")
    assert page.status_code == 200
    totals = page.context["figures"]["totals"]
    assert (totals["requests"], totals["guarded"], totals["corrupted"], totals["wasted_completion_tokens"]) == (
        7, 6, 3, 250)
    text = page.content.decode()
    assert text.count('role="img"') == 11 and "read_file" in text and "codex_cli_rs/0.9" in text
    assert "tenant-b-model" not in text and "bash" not in text


def test_it_shows_every_tenant_to_superusers_and_one_when_chosen(audit_rows: AuditRows, superuser: User,
                                                                 login: Login) -> None:
    """A superuser's default scope is every tenant; choosing B narrows it to B."""
    client = login(superuser)
    everything = _dashboard(client, start="2026-01-01", end="2026-01-03").context["figures"]["totals"]
    only_b = _dashboard(client, start="2026-01-01", end="2026-01-03",
                        tenant=audit_rows.upstream_b.tenant_id).context["figures"]["totals"]
    assert (everything["requests"], only_b["requests"]) == (8, 1)


def test_it_refuses_another_tenant_like_a_missing_one(audit_rows: AuditRows, viewer_a: User, login: Login) -> None:
    """A's viewer asking for B's tenant gets the same invalid-choice page as for a tenant that does not exist."""
    client = login(viewer_a)
    foreign = _dashboard(client, start="2026-01-01", end="2026-01-03", tenant=audit_rows.upstream_b.tenant_id)
    missing = _dashboard(client, start="2026-01-01", end="2026-01-03", tenant=10**9)
    assert foreign.status_code == missing.status_code == 200
    assert "figures" not in foreign.context and "figures" not in missing.context
    assert _without_csrf(foreign.content) == _without_csrf(missing.content)
    assert "Tenant B" not in foreign.content.decode()


def test_it_defaults_to_the_last_seven_days_and_offers_a_report_link(audit_rows: AuditRows, viewer_a: User,
                                                                     login: Login) -> None:
    """No query: the last 7 UTC days; the page links to the report form prefilled with the period."""
    page = _dashboard(login(viewer_a))
    period = page.context["figures"]["period"]
    assert period["bucket"] == "day" and len(page.context["figures"]["over_time"]) == 7
    assert page.context["report_link"].startswith(reverse("admin:audit_report_add") + "?since=")
    assert f"tenants={audit_rows.upstream_a.tenant_id}" in page.context["report_link"]


def test_it_rejects_reversed_and_overlong_periods(audit_rows: AuditRows, viewer_a: User, login: Login) -> None:
    """start > end and more than 366 days are form errors, not queries."""
    client = login(viewer_a)
    assert "figures" not in _dashboard(client, start="2026-01-03", end="2026-01-01").context
    assert "figures" not in _dashboard(client, start="2024-01-01", end="2026-01-01").context
