"""The audit admin: read-only, tenant-scoped, cheap on big tables; reports with downloads."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from audit.models import Attempt, Finding, Fragment, Report
from audit.report_services import report_build
from audit.tasks import report_request
from tests.audit.conftest import PERIOD, AuditRows

Login = Callable[[User], Client]


def _change(model: str, pk: Any) -> str:
    return reverse(f"admin:audit_{model}_change", args=[pk])


def _body_fragment(rows: AuditRows) -> Fragment:
    """A stored attempt body for r2's first attempt, whose frame 3 is the broken one."""
    attempt = Attempt.objects.get(request=rows.requests["r2"], number=0)
    frames = ['data: {"id":"c1","choices":[{"delta":{"role":"assistant"}}]}',
              "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"<b>hi</b>\"}}]}",
              ': keep-alive\ndata: {"id":"c1","choices":[]}',
              'data: {"id":"c1","choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"p\\": "}}',
              "data: [DONE]"]
    return Fragment.objects.create(attempt=attempt, tenant_id_copy=attempt.request.tenant_id,
                                   body="\n\n".join(frames) + "\n\n")


@pytest.fixture
def report_b(audit_rows: AuditRows) -> Report:
    """A built report of tenant B only."""
    report = report_request(since=PERIOD[0], until=PERIOD[1], format="json",
                            tenants=[audit_rows.upstream_b.tenant], enqueue=False)
    return report_build(report_id=report.pk)


# ----- the pages load for staff, and only for them -----

def test_it_lists_only_the_members_tenant_requests(audit_rows: AuditRows, viewer_a: User, login: Login) -> None:
    """A viewer of A sees A's requests in the list (all of them with ``show=all``), never B's."""
    page = login(viewer_a).get(reverse("admin:audit_proxyrequest_changelist") + "?show=all")
    assert page.status_code == 200
    text = page.content.decode()
    assert str(audit_rows.requests["r1"].pk)[:8] in text
    assert str(audit_rows.requests["r9"].pk)[:8] not in text
    assert "Tenant B" not in text


def test_it_lists_every_tenant_for_superusers(audit_rows: AuditRows, superuser: User, login: Login) -> None:
    """A superuser sees both tenants' requests."""
    text = login(superuser).get(reverse("admin:audit_proxyrequest_changelist") + "?show=all").content.decode()
    assert str(audit_rows.requests["r1"].pk)[:8] in text and str(audit_rows.requests["r9"].pk)[:8] in text


@pytest.mark.parametrize("query", ["?outcome=exhausted", "?path=guarded", "?model=qwen-coder", "?protocol=openai-chat",
                                   "?created__gte=2026-01-02T00:00:00%2B00:00", "?q=deepseek-chat", "?upstream={qwen}",
                                   "?tenant={tenant}"])
def test_it_filters_requests(audit_rows: AuditRows, viewer_a: User, login: Login, query: str) -> None:
    """Every filter answers 200 and narrows the list."""
    url = reverse("admin:audit_proxyrequest_changelist") + query.format(
        qwen=audit_rows.qwen_a.pk, tenant=audit_rows.upstream_a.tenant_id)
    page = login(viewer_a).get(url)
    assert page.status_code == 200
    assert page.context["cl"].result_count <= 9


def test_it_finds_a_request_by_its_id(audit_rows: AuditRows, viewer_a: User, login: Login) -> None:
    """Searching an x-request-id lists exactly that request."""
    pk = audit_rows.requests["r4"].pk
    page = login(viewer_a).get(reverse("admin:audit_proxyrequest_changelist") + f"?q={pk}")
    assert [row.pk for row in page.context["cl"].result_list] == [pk]


def test_it_never_counts_a_whole_audit_table(audit_rows: AuditRows, superuser: User, login: Login) -> None:
    """List counts are capped subqueries (LIMIT), and no second, unfiltered count runs."""
    client = login(superuser)
    for model in ("proxyrequest", "finding", "fragment"):
        with CaptureQueriesContext(connection) as queries:
            assert client.get(reverse(f"admin:audit_{model}_changelist")).status_code == 200
        counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and f"audit_{model}" in q["sql"]]
        assert counts and all("LIMIT" in sql.upper() for sql in counts), counts


def test_it_shows_a_request_with_its_attempts_and_findings(audit_rows: AuditRows, viewer_a: User,
                                                           login: Login) -> None:
    """The request page is read-only and carries the attempts and findings inline."""
    page = login(viewer_a).get(_change("proxyrequest", audit_rows.requests["r4"].pk))
    text = page.content.decode()
    assert page.status_code == 200
    assert text.count("schema-violation") >= 2 and "mid-stream-error-chunk" in text and "edit_file" in text
    assert 'name="_save"' not in text
    assert {type(f).__name__ for f in page.context["inline_admin_formsets"]} == {"InlineAdminFormSet"}


def test_it_shows_the_offending_frame_pretty_printed_and_marked(audit_rows: AuditRows, viewer_a: User,
                                                                login: Login) -> None:
    """A finding's page shows its frame indented, with frame number and byte offset, and its body context."""
    _body_fragment(audit_rows)
    finding = Finding.objects.get(request=audit_rows.requests["r2"])
    text = login(viewer_a).get(_change("finding", finding.pk)).content.decode()
    assert "frame 3 · byte offset 120" in text
    assert "&quot;name&quot;: &quot;r2&quot;" in text  # json.dumps(indent=2) of the stored fragment
    assert "tr-frame-marked" in text and "audit/fragments.css" in text  # the marked frame, styled
    assert "<mark" in text and "not JSON" in text  # frame 3 of the body does not parse: the spot is marked


def test_it_shows_a_stored_body_frame_by_frame_with_findings_marked(audit_rows: AuditRows, viewer_a: User,
                                                                    login: Login) -> None:
    """The fragment page numbers every frame like the guard, marks frame 3, escapes payloads."""
    fragment = _body_fragment(audit_rows)
    text = login(viewer_a).get(_change("fragment", fragment.pk)).content.decode()
    assert "5 frames" in text and "frame 4 · byte offset" in text
    assert "arguments-not-json" in text and "1 comment line(s) before it" in text
    assert "&lt;b&gt;hi&lt;/b&gt;" in text and "<b>hi</b>" not in text


@pytest.mark.parametrize("query", ["?kind=arguments-not-json", "?severity=error", "?action=retry",
                                   "?q=read_file", "?tenant={tenant}"])
def test_it_filters_findings(audit_rows: AuditRows, viewer_a: User, login: Login, query: str) -> None:
    """Findings filter by kind, severity, action, tool and tenant, within the user's tenants."""
    url = reverse("admin:audit_finding_changelist") + query.format(tenant=audit_rows.upstream_a.tenant_id)
    page = login(viewer_a).get(url)
    assert page.status_code == 200
    shown = list(page.context["cl"].result_list)
    assert shown and all(f.tenant_id_copy == audit_rows.upstream_a.tenant_id for f in shown)


@pytest.mark.parametrize("url", ["admin:audit_proxyrequest_changelist", "admin:audit_finding_changelist",
                                 "admin:audit_fragment_changelist", "admin:audit_report_changelist",
                                 "admin:audit_report_add", "admin:audit_dashboard"])
def test_it_refuses_users_who_are_not_audit_staff(audit_rows: AuditRows, login: Login, client: Client,
                                                  url: str) -> None:
    """Anonymous and non-staff users go to the login page; staff without a tenant get 403."""
    assert client.get(reverse(url)).status_code == 302
    plain = User.objects.create_user("plain", password="pw")
    assert login(plain).get(reverse(url)).status_code == 302
    lonely = User.objects.create_user("lonely", password="pw", is_staff=True)
    assert login(lonely).get(reverse(url)).status_code == 403


def test_it_refuses_to_add_change_or_delete_audit_rows(audit_rows: AuditRows, superuser: User,
                                                       login: Login) -> None:
    """Even a superuser gets 403 on add, change (POST) and delete of audit rows."""
    client = login(superuser)
    pk = audit_rows.requests["r1"].pk
    assert client.get(reverse("admin:audit_proxyrequest_add")).status_code == 403
    assert client.post(_change("proxyrequest", pk), {"model": "x"}).status_code == 403
    assert client.get(reverse("admin:audit_proxyrequest_delete", args=[pk])).status_code == 403
    finding = Finding.objects.filter(request_id=pk).first() or Finding.objects.first()
    assert client.get(reverse("admin:audit_finding_delete", args=[finding.pk])).status_code == 403


# ----- another tenant's rows look exactly like missing ones -----

def _same(client: Client, foreign: str, missing: str) -> None:
    a, b = client.get(foreign), client.get(missing)
    assert a.status_code == b.status_code
    assert a.get("Location") == b.get("Location")


def test_it_answers_another_tenants_rows_like_missing_ones(audit_rows: AuditRows, viewer_a: User,
                                                           login: Login) -> None:
    """A's viewer asking for B's request, finding or body gets what a missing pk gets."""
    client = login(viewer_a)
    r9 = audit_rows.requests["r9"]
    _same(client, _change("proxyrequest", r9.pk), _change("proxyrequest", uuid.uuid4()))
    finding = Finding.objects.get(request=r9)
    _same(client, _change("finding", finding.pk), _change("finding", 10**9))
    body = Fragment.objects.create(attempt=Attempt.objects.get(request=r9, number=0), tenant_id_copy=r9.tenant_id,
                                   body="data: {}\n\n")
    _same(client, _change("fragment", body.pk), _change("fragment", 10**9))
    page = client.get(_change("proxyrequest", r9.pk), follow=True)
    assert "Tenant B" not in page.content.decode() and "tenant-b-model" not in page.content.decode()


def test_it_answers_another_tenants_reports_like_missing_ones(report_b: Report, viewer_a: User, outsider_b: User,
                                                              login: Login) -> None:
    """B's report: invisible to A (page and download answer like a missing one), downloadable by B."""
    client = login(viewer_a)
    _same(client, _change("report", report_b.pk), _change("report", 10**9))
    download = reverse("admin:audit_report_download", args=[report_b.pk, "file"])
    missing = reverse("admin:audit_report_download", args=[10**9, "file"])
    assert client.get(download).status_code == client.get(missing).status_code == 404
    assert report_b.pk not in [r.pk for r in client.get(reverse("admin:audit_report_changelist")).context["cl"]
                               .result_list]
    response = login(outsider_b).get(download)
    assert response.status_code == 200
    assert b'"schema_version": 1' in b"".join(response.streaming_content)
    response.close()


# ----- reports -----

def test_it_requests_a_report_from_the_admin_for_the_members_tenants(
        audit_rows: AuditRows, admin_a: User, login: Login, django_capture_on_commit_callbacks: Any) -> None:
    """The add form queues a report (built on commit); no tenant chosen = the tenant admin's tenants."""
    form = {"since": "2026-01-01T00:00", "until": "2026-01-04T00:00", "format": "csv"}
    with django_capture_on_commit_callbacks() as callbacks:
        response = login(admin_a).post(reverse("admin:audit_report_add"), form)
    assert response.status_code == 302
    report = Report.objects.get()
    assert (report.status, report.requested_by, report.origin) == ("queued", admin_a, "admin")
    assert [t.slug for t in report.tenants.all()] == ["tenant-a"]
    assert len(callbacks) == 1


def test_it_offers_only_the_members_tenants_in_the_report_form(audit_rows: AuditRows, admin_a: User,
                                                               login: Login) -> None:
    """Choosing tenant B (or B's upstream) is an invalid choice for A's admin."""
    client = login(admin_a)
    form = {"since": "2026-01-01T00:00", "until": "2026-01-04T00:00", "format": "json"}
    page = client.post(reverse("admin:audit_report_add"), {**form, "tenants": [audit_rows.upstream_b.tenant_id]})
    assert page.status_code == 200 and "Select a valid choice" in page.content.decode()
    page = client.post(reverse("admin:audit_report_add"), {**form, "upstreams": [audit_rows.upstream_b.pk]})
    assert page.status_code == 200 and "Select a valid choice" in page.content.decode()
    assert not Report.objects.exists()


def test_it_shows_status_progress_errors_and_download_links(audit_rows: AuditRows, superuser: User,
                                                            login: Login) -> None:
    """The list shows a running report's progress, a failed one's error and a done one's links."""
    kwargs = {"since": PERIOD[0], "until": PERIOD[1], "format": "csv", "enqueue": False}
    done = report_build(report_id=report_request(**kwargs).pk)
    Report.objects.filter(pk=report_request(**kwargs).pk).update(status="running", progress=42)
    Report.objects.filter(pk=report_request(**kwargs).pk).update(status="failed", error="Boom: no disk")
    text = login(superuser).get(reverse("admin:audit_report_changelist")).content.decode()
    assert '<progress max="100" value="42">' in text
    assert "Boom: no disk" in text
    assert f"report-{done.pk}-requests.csv" in text and f"report-{done.pk}-findings.csv" in text
    response = login(superuser).get(reverse("admin:audit_report_download", args=[done.pk, "findings"]))
    assert b"".join(response.streaming_content).startswith(b'"id","request_id","attempt",')
    response.close()


def test_it_links_the_dashboard_from_the_admin_index(audit_rows: AuditRows, viewer_a: User, login: Login) -> None:
    """The admin index offers the dashboard to users who see the audit app."""
    text = login(viewer_a).get(reverse("admin:index")).content.decode()
    assert reverse("admin:audit_dashboard") in text


def _wrapping_columns(html: str) -> set[str]:
    """The list columns (``field-NAME``) the page's styles let wrap (``white-space: normal``)."""
    found = set()
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", html):
        if re.search(r"white-space:\s*normal", body):
            found.update(re.findall(r"#result_list td\.field-([a-z_]+)", selectors))
    return found


def test_the_long_columns_of_the_findings_and_reports_lists_wrap_instead_of_overflowing(
        audit_rows: AuditRows, superuser: User, login: Login) -> None:
    """Every cell of a list is kept on one line, which pushed the findings' detail and a report's second
    download past 1400 px: the long columns wrap (the findings' kind, tool, tenant and detail; a report's
    period, tenants and format) and a report's downloads stand one per line, each whole. Headless Chromium
    measures the result (``make test-browser``, scripts/browser_check.py); this checks the markup it needs."""
    client = login(superuser)
    done = report_build(report_id=report_request(since=PERIOD[0], until=PERIOD[1], format="csv", enqueue=False).pk)
    findings = client.get(reverse("admin:audit_finding_changelist") + "?severity=all").content.decode()
    reports = client.get(reverse("admin:audit_report_changelist")).content.decode()
    assert 'class="field-detail_short"' in findings
    assert {"detail_short", "kind", "tool_name", "tenant"} <= _wrapping_columns(findings)
    assert {"period", "tenant_list", "format"} <= _wrapping_columns(reports)
    cell = reports.split('<td class="field-downloads">', 1)[1].split("</td>", 1)[0]
    links = re.findall(r'<a class="tr-download" href="[^"]+">([^<]+)</a>', cell)
    assert links == [f"report-{done.pk}-requests.csv", f"report-{done.pk}-findings.csv"]
    assert re.search(r"td\.field-downloads a\.tr-download\s*\{[^}]*display:\s*block", reports)
    period = reports.split('<td class="field-period">', 1)[1].split("</td>", 1)[0]
    assert period.count('<span class="tr-nowrap">') == 2 and " UTC</span>" in period
