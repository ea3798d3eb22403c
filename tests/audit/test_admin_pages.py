"""The incident on the first screen: list columns and default filters for every persona, the request
page (timeline, rounded units, frame counts, unknown usage, the delivered answer), and the tidy
admin (branding, one Audit section, broker-only models)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

from audit.delivered import delivered_exhaustion, delivered_turn
from audit.models import Attempt, Finding, Fragment, ProxyRequest, Report
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn
from tests.audit.conftest import AuditRows

Login = Callable[[User], Client]
REQUESTS = reverse("admin:audit_proxyrequest_changelist")
FINDINGS = reverse("admin:audit_finding_changelist")
COLUMNS = ["Request", "Time (UTC)", "Tenant / upstream", "Model", "Outcome", "Attempts", "Status", "TTFT",
           "Wasted tokens"]
#: Persona -> the fixture requests the default ("problems only") list shows them.
PROBLEMS_SEEN = {"admin_a": {"r2", "r4", "r7", "r6", "before", "at_end"},
                 "viewer_a": {"r2", "r4", "r7", "r6", "before", "at_end"},
                 "outsider_b": {"r9"},
                 "superuser": {"r2", "r4", "r7", "r6", "before", "at_end", "r9"}}


def _headers(html: str) -> list[str]:
    head = html.split('<thead>', 1)[1].split("</thead>", 1)[0]
    cells = re.findall(r'<th scope="col"[^>]*>(.*?)</th>', head, re.S)
    return [re.sub(r"<[^>]+>", "", c).strip() for c in cells if "action-checkbox" not in c]


def _shown(page: Any, rows: AuditRows) -> set[str]:
    ids = {r.pk for r in page.context["cl"].result_list}
    return {name for name, row in rows.requests.items() if row.pk in ids}


@pytest.mark.parametrize("persona", sorted(PROBLEMS_SEEN))
def test_it_lists_problems_first_with_the_incident_columns_for_each_persona(
        persona: str, audit_rows: AuditRows, login: Login, request: pytest.FixtureRequest) -> None:
    """Default: problems only, in the column order of issue 16, outcomes coloured; all on request;
    never another tenant's rows."""
    client = login(request.getfixturevalue(persona))
    page = client.get(REQUESTS)
    html = page.content.decode()
    assert page.status_code == 200 and _headers(html) == COLUMNS
    assert _shown(page, audit_rows) == PROBLEMS_SEEN[persona]
    assert 'class="tr-pill tr-pill-' in html and "Problems only" in html and "All requests" in html
    everything = _shown(client.get(REQUESTS + "?show=all"), audit_rows)
    assert everything >= PROBLEMS_SEEN[persona] and ("r1" in everything) == (persona != "outsider_b")
    assert ("r9" in everything) == (persona in ("outsider_b", "superuser"))


def test_an_explicit_search_or_outcome_is_not_hidden_by_the_default(audit_rows: AuditRows, viewer_a: User,
                                                                    login: Login) -> None:
    """A clean request is found by its id, and ``outcome=clean`` lists clean requests."""
    client = login(viewer_a)
    clean = audit_rows.requests["r1"]
    assert [r.pk for r in client.get(REQUESTS + f"?q={clean.pk}").context["cl"].result_list] == [clean.pk]
    assert "r1" in _shown(client.get(REQUESTS + "?outcome__exact=clean"), audit_rows)


def test_the_short_id_the_lists_show_finds_the_request_and_its_findings(audit_rows: AuditRows, viewer_a: User,
                                                                        login: Login) -> None:
    """The 8 characters of the list's first column (any case, with or without what follows) find the request;
    another tenant's request is not found by its short id; a short non-hex text is a model name."""
    client = login(viewer_a)
    r4, r9 = audit_rows.requests["r4"], audit_rows.requests["r9"]
    short = str(r4.pk)[:8]
    assert short in client.get(REQUESTS + "?show=all").content.decode()
    for term in (short, short.upper(), str(r4.pk)[:13]):
        assert [r.pk for r in client.get(REQUESTS, {"q": term}).context["cl"].result_list] == [r4.pk], term
    findings = client.get(FINDINGS, {"q": short, "severity": "all"}).context["cl"].result_list
    assert findings and {f.request_id for f in findings} == {r4.pk}
    assert list(client.get(REQUESTS, {"q": str(r9.pk)[:8]}).context["cl"].result_list) == []
    assert list(client.get(REQUESTS, {"q": "zzzzzzzz"}).context["cl"].result_list) == []


def test_findings_number_attempts_from_one_as_the_timeline_does(audit_rows: AuditRows, viewer_a: User,
                                                                 login: Login) -> None:
    """r4's findings are on its attempts 1-3 (``Attempt.number`` 0-2): the list, the request page's
    findings and the timeline agree."""
    client = login(viewer_a)
    r4 = audit_rows.requests["r4"]
    listed = client.get(FINDINGS, {"q": str(r4.pk), "severity": "all"})
    numbers = re.findall(r'<td class="field-attempt_number">(\d+)</td>', listed.content.decode())
    assert sorted(numbers) == ["1", "2", "3"]
    page = client.get(reverse("admin:audit_proxyrequest_change", args=[r4.pk])).content.decode()
    inline = re.findall(r'<td class="field-attempt_number">\s*<p>(\d+)</p>', page)
    assert sorted(inline) == ["1", "2", "3"] and "attempt 3:" in page and "attempt 0" not in page
    first = Attempt.objects.get(request=r4, number=0)
    assert str(first).startswith("attempt 1 of ")  # the fragment page's title and breadcrumb name it so
    body = Fragment.objects.create(attempt=first, tenant_id_copy=r4.tenant_id, body="data: {}\n\n")
    fragment = client.get(reverse("admin:audit_fragment_change", args=[body.pk])).content.decode()
    assert "body of attempt 1 of " in fragment and "attempt 0" not in fragment


@pytest.mark.parametrize("persona", ["viewer_a", "superuser"])
def test_findings_default_to_warnings_and_errors_with_their_detail(
        persona: str, audit_rows: AuditRows, login: Login, request: pytest.FixtureRequest) -> None:
    """``info`` normalisations are one click away, not first; the detail column is shown."""
    client = login(request.getfixturevalue(persona))
    page = client.get(FINDINGS)
    severities = {f.severity for f in page.context["cl"].result_list}
    assert severities == {"warning", "error"} and "code-fence-prefix-in-arguments in r7" in page.content.decode()
    assert {f.severity for f in client.get(FINDINGS + "?severity=all").context["cl"].result_list} == {
        "info", "warning", "error"}
    assert {f.severity for f in client.get(FINDINGS + "?severity=info").context["cl"].result_list} == {"info"}


def _request_with_attempts(rows: AuditRows, **fields: Any) -> ProxyRequest:
    """Tenant A's request: a failed attempt without usage, then the answer with usage, 1,234.5678 ms."""
    request = ProxyRequest.objects.create(
        tenant=rows.upstream_a.tenant, upstream=rows.upstream_a, model="deepseek-chat", path="guarded",
        outcome="recovered-by-retry", attempts=2, status=200, ttft_ms=812.3456789, total_ms=1234.5678,
        prompt_tokens=900, completion_tokens=40, wasted_completion_tokens=0, wasted_ms=400.123456, **fields)
    Attempt.objects.create(request=request, number=0, upstream=rows.upstream_a, outcome="retry", upstream_status=200,
                           ttfb_ms=90.98765, duration_ms=400.123456, bytes_received=2048, frames=0,
                           abort_reason="arguments are not JSON")
    Attempt.objects.create(request=request, number=1, upstream=rows.upstream_a, outcome="clean", upstream_status=200,
                           ttfb_ms=80.5, duration_ms=700.25, bytes_received=4096, frames=37, prompt_tokens=900,
                           completion_tokens=40)
    Finding.objects.create(request=request, tenant_id_copy=request.tenant_id, kind="arguments-not-json",
                           severity="error", action="retry", detail="broken")
    return request


def test_the_request_page_reads_like_an_incident(audit_rows: AuditRows, viewer_a: User, login: Login) -> None:
    """Rounded units, real and missing frame counts, unknown usage, the timeline, the delivered turn,
    and how to keep whole bodies."""
    turn = Turn(choices=[ChoiceTurn(content="Looking.", finish_reason="tool_calls",
                                    tool_calls=[ToolCall("call_1", "read_file", '{"path": "a.py"}')])])
    row = _request_with_attempts(audit_rows, delivered=delivered_turn(turn))
    html = login(viewer_a).get(reverse("admin:audit_proxyrequest_change", args=[row.pk])).content.decode()
    for text in ("1.23 s", "812.3 ms", "400.1 ms", "91 ms", "700.2 ms", "not counted frames", "37 frames",
                 "tokens unknown in / unknown out", "tokens 900 in / 40 out", "arguments are not JSON",
                 'class="tr-tl-track"', "<rect x=", "read_file", "{&quot;path&quot;: &quot;a.py&quot;}", "Looking.",
                 "finish reason <code>tool_calls</code>", "set <em>Fragment storage</em> to <code>attempt</code>"):
        assert text in html, (text, html[html.find('class="tr-tl"'):][:3000])
    assert "1234.5678" not in html and "812.3456789" not in html
    assert html.count('class="tr-tl-row"') == 2


def test_wasted_tokens_say_unknown_when_a_failed_attempt_reported_no_usage(audit_rows: AuditRows, viewer_a: User,
                                                                            login: Login) -> None:
    """0 wasted tokens from an attempt without usage is "unknown" in the list and on the page."""
    row = _request_with_attempts(audit_rows)
    client = login(viewer_a)
    listed = next(r for r in client.get(REQUESTS).context["cl"].result_list if r.pk == row.pk)
    assert listed.usage_gap is True
    page = client.get(reverse("admin:audit_proxyrequest_change", args=[row.pk])).content.decode()
    assert re.search(r"<label>Wasted tokens:</label>\s*<div class=\"readonly\">unknown</div>", page)
    known = audit_rows.requests["r2"]
    assert next(r for r in client.get(REQUESTS).context["cl"].result_list if r.pk == known.pk).usage_gap is False


def test_the_exhaustion_answer_is_shown_as_delivered(audit_rows: AuditRows, viewer_a: User, login: Login) -> None:
    """An exhausted request shows the terminal message the client got."""
    message = "[toolrelay] The upstream model could not produce a valid answer: 3 attempt(s) failed."
    row = _request_with_attempts(audit_rows, delivered=delivered_exhaustion(message))
    ProxyRequest.objects.filter(pk=row.pk).update(outcome="exhausted")
    html = login(viewer_a).get(reverse("admin:audit_proxyrequest_change", args=[row.pk])).content.decode()
    assert "Retries ran out; the client got a terminal assistant message" in html and message in html


@pytest.mark.parametrize("persona", ["admin_a", "viewer_a", "outsider_b", "superuser"])
def test_the_index_is_branded_with_one_audit_section(persona: str, audit_rows: AuditRows, login: Login,
                                                     request: pytest.FixtureRequest) -> None:
    """"toolrelay admin" everywhere, the dashboard inside the Audit section, Celery beat's models hidden
    without a broker."""
    html = login(request.getfixturevalue(persona)).get(reverse("admin:index")).content.decode()
    assert "toolrelay admin" in html and "Django administration" not in html and "Django site admin" not in html
    assert html.count("<caption>") == html.count('class="app-') and html.count(">Audit</a>") == 1
    audit = html.split('class="app-audit', 1)[1].split("</table>", 1)[0]
    assert reverse("admin:audit_dashboard") in audit and "Proxy requests" in audit
    assert "Periodic tasks" not in html


def test_broker_only_models_show_when_a_broker_is_configured(audit_rows: AuditRows, superuser: User,
                                                             login: Login) -> None:
    """With a broker, superusers see Celery beat's periodic tasks again."""
    client = login(superuser)
    with override_settings(CELERY_BROKER_URL="redis://127.0.0.1:6379/11"):
        assert "Periodic tasks" in client.get(reverse("admin:index")).content.decode()
    assert "Periodic tasks" not in client.get(reverse("admin:index")).content.decode()


def test_report_pages_refresh_themselves_while_a_report_builds(audit_rows: AuditRows, viewer_a: User,
                                                               login: Login) -> None:
    """A running report makes the list and its page reload every few seconds; once done, no reload."""
    from audit.tasks import report_request
    from tests.audit.conftest import PERIOD

    report = report_request(since=PERIOD[0], until=PERIOD[1], format="json", tenants=[audit_rows.upstream_a.tenant],
                            enqueue=False)
    Report.objects.filter(pk=report.pk).update(status="running", progress=40)
    client = login(viewer_a)
    listing = client.get(reverse("admin:audit_report_changelist")).content.decode()
    page = client.get(reverse("admin:audit_report_change", args=[report.pk])).content.decode()
    assert '<meta http-equiv="refresh" content="3">' in listing and 'id="report-refresh"' in page
    Report.objects.filter(pk=report.pk).update(status="done", progress=100)
    assert "http-equiv" not in client.get(reverse("admin:audit_report_changelist")).content.decode()
    assert "http-equiv" not in client.get(reverse("admin:audit_report_change", args=[report.pk])).content.decode()
