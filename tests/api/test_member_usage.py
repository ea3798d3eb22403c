"""Spend, waste and incidents per member (``audit.people``) in the usage page and the reports."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from api.tokens import admin_token_create
from audit.models import Attempt, Finding, ProxyRequest, Report
from audit.people import member_rows
from audit.report_services import report_build
from audit.reports import Scope
from tenants.models import Membership
from tests.api.test_rest import Api
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _request(world: TenantWorld, member: Membership | None, *, outcome: str = "clean", wasted: int = 0,
             loop: bool = False) -> ProxyRequest:
    row = ProxyRequest.objects.create(
        tenant=world.tenant, model="m", path="guarded", outcome=outcome, attempts=2 if wasted else 1, status=200,
        prompt_tokens=100, completion_tokens=10, wasted_completion_tokens=wasted, member=member,
        member_username=member.user.username if member else "", created=timezone.now() - timedelta(minutes=5))
    if wasted:
        Attempt.objects.create(request=row, number=0, outcome="retry", prompt_tokens=40)
    if loop:
        Finding.objects.create(request=row, tenant_id_copy=world.tenant.pk, kind="agent-loop", severity="warning",
                               action="repaired")
    return row


@pytest.fixture
def traffic(world_a: TenantWorld, world_b: TenantWorld, dev_a: Membership, dev_b: Membership) -> None:
    """dev-a: a clean request, one recovered by a retry (waste), one exhausted with a loop broken; a tenant key's
    request; dev-b (tenant B): one request."""
    _request(world_a, dev_a)
    _request(world_a, dev_a, outcome="recovered-by-retry", wasted=7)
    _request(world_a, dev_a, outcome="exhausted", loop=True)
    _request(world_a, None)
    _request(world_b, dev_b)


def _by_member(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["member"]: row for row in rows}


@pytest.mark.usefixtures("traffic")
def test_member_rows_split_spend_waste_and_incidents(world_a: TenantWorld) -> None:
    """Per member of tenant A: tokens, waste (input of the failed attempt, output counted by the relay), incidents."""
    now = timezone.now()
    rows = _by_member(member_rows(Scope(now - timedelta(hours=1), now, tenant_ids=(world_a.tenant.pk,))))
    assert set(rows) == {"dev-a", "(tenant keys)"}
    dev = rows["dev-a"]
    assert (dev["requests"], dev["prompt_tokens"], dev["completion_tokens"]) == (3, 300, 30)
    assert (dev["wasted_prompt_tokens"], dev["wasted_completion_tokens"]) == (40, 7)
    assert (dev["exhausted"], dev["recovered"], dev["loops_broken"], dev["incidents"]) == (1, 1, 1, 3)
    assert rows["(tenant keys)"]["requests"] == 1 and rows["(tenant keys)"]["incidents"] == 0


@pytest.mark.usefixtures("traffic")
def test_the_usage_page_per_member_shows_only_the_viewers_tenants(login: Any, admin_a: Any, outsider_b: Any) -> None:
    """Tenant A's admin sees dev-a; tenant B's admin sees dev-b and never dev-a; the CSV has incidents."""
    client: Client = login(admin_a)
    page = client.get("/admin/audit/proxyrequest/usage/", {"group": "member"}).content.decode()
    assert "tenant-a / dev-a" in page and "dev-b" not in page and "<th>incidents</th>" in page
    csv = client.get("/admin/audit/proxyrequest/usage/", {"group": "member", "format": "csv"}).content.decode()
    assert csv.splitlines()[0].endswith('"incidents"') and "dev-a" in csv
    client.logout()
    client = login(outsider_b)
    page = client.get("/admin/audit/proxyrequest/usage/", {"group": "member"}).content.decode()
    assert "tenant-b / dev-b" in page and "dev-a" not in page


@pytest.mark.usefixtures("traffic")
@pytest.mark.parametrize("format", ["json", "html"])
def test_a_built_report_has_by_member(world_a: TenantWorld, format: str) -> None:
    """A built report of tenant A: ``by_member`` in its figures (valid against the schema) and on its HTML page."""
    import json

    import jsonschema

    from audit.schema import SUMMARY_SCHEMA

    now = timezone.now()
    report = Report.objects.create(since=now - timedelta(hours=1), until=now + timedelta(minutes=1), format=format)
    report.tenants.set([world_a.tenant])
    report = report_build(report_id=report.pk)
    assert report.figures is not None
    rows = _by_member(report.figures["by_member"])
    assert set(rows) == {"dev-a", "(tenant keys)"} and rows["dev-a"]["incidents"] == 3
    with report.file.open("rb") as stored:
        text = stored.read().decode()
    if format == "json":
        jsonschema.validate(json.loads(text), SUMMARY_SCHEMA)
    else:
        assert "By member" in text and "tenant-a / dev-a" in text and "dev-b" not in text
    report.file.delete(save=False)


def test_a_members_unknown_waste_reads_unknown_on_every_per_member_view(
        world_a: TenantWorld, dev_a: Membership, login: Any, admin_a: Any, client: Client) -> None:
    """dev-a's only request was retried after an attempt that answered 200 without usage: its wasted tokens are
    unknown on the request page, and so on the usage page and CSV per member, in a built report's ``by_member``,
    on dev-a's own account page and in the management API (a count to read the numbers by), never 0."""
    row = _request(world_a, dev_a, outcome="recovered-by-retry")
    ProxyRequest.objects.filter(pk=row.pk).update(attempts=2)
    Attempt.objects.create(request=row, number=0, outcome="retry", upstream_status=200)  # no usage reported
    Attempt.objects.create(request=row, number=1, outcome="clean", upstream_status=200, prompt_tokens=100)
    now = timezone.now()
    rows = _by_member(member_rows(Scope(now - timedelta(hours=1), now + timedelta(minutes=1))))
    assert rows["dev-a"]["wasted_unknown_requests"] == 1

    admin = login(admin_a)
    request_page = admin.get(f"/admin/audit/proxyrequest/{row.pk}/change/").content.decode()
    assert re.search(r'<label>Wasted tokens:</label>\s*<div class="readonly">unknown</div>', request_page)
    page = admin.get("/admin/audit/proxyrequest/usage/", {"group": "member"}).content.decode()
    cells = page.split("tenant-a / dev-a</td>", 1)[1].split("</tr>", 1)[0]
    assert cells.count('<td class="num">unknown</td>') == 2  # wasted tokens in and out
    exported = admin.get("/admin/audit/proxyrequest/usage/", {"group": "member", "format": "csv"}).content.decode()
    by_group = {r["group"]: r for r in csv.DictReader(io.StringIO(exported))}
    dev = by_group["tenant-a / dev-a"]
    assert (dev["wasted_prompt_tokens"], dev["wasted_completion_tokens"]) == ("unknown", "unknown")

    report = Report.objects.create(since=now - timedelta(hours=1), until=now + timedelta(minutes=1), format="html")
    report.tenants.set([world_a.tenant])
    report = report_build(report_id=report.pk)
    assert report.figures is not None
    assert _by_member(report.figures["by_member"])["dev-a"]["wasted_unknown_requests"] == 1
    with report.file.open("rb") as stored:
        html = stored.read().decode()
    assert html.split("tenant-a / dev-a</td>", 1)[1].split("</tr>", 1)[0].count("<td>unknown</td>") == 2
    admin.logout()

    own = login(dev_a.user).get("/account/keys/").content.decode()
    assert "unknown wasted on broken" in own
    body = Api(client, admin_token_create(tenant=world_a.tenant, name="ci")[1]).get("/usage").json()
    assert body["wasted_unknown_requests"] == 1
    assert {r["member"]: r["wasted_unknown_requests"] for r in body["by_member"]} == {"dev-a": 1}
