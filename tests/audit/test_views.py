"""The dashboard: figures and charts for a period and tenant, staff only, tenant-scoped."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tests.audit.conftest import AuditRows, add_request

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


def test_it_defaults_to_the_span_of_old_data_and_offers_a_report_link(audit_rows: AuditRows, viewer_a: User,
                                                                      login: Login) -> None:
    """No query and nothing in the last 24 hours: the span of the data (all nine of A's requests,
    by day); the page links to the report form prefilled with the period."""
    page = _dashboard(login(viewer_a))
    figures = page.context["figures"]
    assert figures["period"]["bucket"] == "day" and figures["totals"]["requests"] == 9
    assert figures["period"]["since"] <= "2025-12-31T23:59:59Z" and figures["period"]["until"] > "2026-01-04T00:00:00Z"
    assert page.context["report_link"].startswith(reverse("admin:audit_report_add") + "?since=")
    assert f"tenants={audit_rows.upstream_a.tenant_id}" in page.context["report_link"]


def test_it_zooms_in_on_recent_data_within_the_last_day(audit_rows: AuditRows, viewer_a: User, login: Login) -> None:
    """Requests of the last minutes: the default period is those minutes (at least half an hour),
    by minute, not a dot at the end of a week."""
    now = timezone.now()
    for minutes in (12, 5, 1):
        add_request(audit_rows.upstream_a.tenant, audit_rows.upstream_a, f"recent{minutes}",
                    at=now - timedelta(minutes=minutes), model="deepseek-chat")
    figures = _dashboard(login(viewer_a)).context["figures"]
    assert figures["period"]["bucket"] == "minute" and figures["totals"]["requests"] == 3
    assert 30 <= len(figures["over_time"]) <= 32
    add_request(audit_rows.upstream_a.tenant, audit_rows.upstream_a, "hours ago", at=now - timedelta(hours=20),
                model="deepseek-chat")
    figures = _dashboard(login(viewer_a)).context["figures"]
    assert figures["period"]["bucket"] == "hour" and figures["totals"]["requests"] == 4


def test_it_shows_both_corruption_rates_integer_ticks_and_links_into_the_lists(
        audit_rows: AuditRows, viewer_a: User, login: Login) -> None:
    """Attempt- and request-level rates side by side; count axes tick 0, 1, 2…; every bar links to the
    list it counts, and that list holds exactly those rows."""
    client = login(viewer_a)
    page = _dashboard(client, start="2026-01-01", end="2026-01-03")
    html = page.content.decode()
    assert "Attempt corruption rate" in html and "72.7%" in html and "8 of 11 guarded attempts" in html
    assert "Request corruption rate" in html and "50.0%" in html and "3 of 6 guarded requests" in html
    requests_chart = next(c.svg for c in page.context["charts"] if c.title == "Requests over time")
    ticks = re.findall(r'text-anchor="end" fill="#6b7280">([^<]+)<', requests_chart)
    assert ticks == ["0", "1", "2", "3"]
    by_upstream = next(c.svg for c in page.context["charts"] if c.title == "Request corruption rate by upstream")
    hrefs = [h.replace("&amp;", "&") for h in re.findall(r'<a href="([^"]+)"', by_upstream)]
    assert len(hrefs) == 2
    listed = client.get(next(h for h in hrefs if f"upstream={audit_rows.qwen_a.pk}&" in h + "&"))
    assert [r.pk for r in listed.context["cl"].result_list] == [audit_rows.requests["r4"].pk]
    kinds = next(c.svg for c in page.context["charts"] if c.title == "Share of requests by finding kind")
    kind_link = next(h.replace("&amp;", "&") for h in re.findall(r'<a href="([^"]+)"', kinds) if "sse-comment" in h)
    assert {f.kind for f in client.get(kind_link).context["cl"].result_list} == {"sse-comment-keepalives"}


def test_the_report_has_no_links_into_the_admin(audit_rows: AuditRows) -> None:
    """The self-contained HTML report keeps its charts free of admin links."""
    from audit.exports import report_html
    from audit.reports import Scope, build_figures
    from tests.audit.conftest import PERIOD

    html = report_html(build_figures(Scope(*PERIOD, (audit_rows.upstream_a.tenant_id,))), title="r")
    assert "<a href" not in html and "/admin/" not in html


def test_it_rejects_reversed_and_overlong_periods(audit_rows: AuditRows, viewer_a: User, login: Login) -> None:
    """start > end and more than 366 days are form errors, not queries."""
    client = login(viewer_a)
    assert "figures" not in _dashboard(client, start="2026-01-03", end="2026-01-01").context
    assert "figures" not in _dashboard(client, start="2024-01-01", end="2026-01-01").context
