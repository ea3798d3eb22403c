"""The usage page: per key, tenant, model and upstream, over a period, with charts and a CSV export; tenant-scoped.

Over the audit fixture set (``tests/audit/conftest.py``) plus: tenant A's key on some requests, input tokens on
a failed attempt, an ``agent-loop`` finding, and a request refused by a limit. Figures computed by hand.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from audit.models import Attempt, Finding, ProxyRequest
from tests.audit.conftest import T0, AuditRows
from tests.conftest import TenantWorld

Login = Callable[[User], Client]
PERIOD = {"start": "2026-01-01", "end": "2026-01-03"}


@pytest.fixture
def usage_rows(audit_rows: AuditRows, world_a: TenantWorld) -> AuditRows:
    r = audit_rows.requests
    ProxyRequest.objects.filter(pk__in=[r["r1"].pk, r["r2"].pk, r["r4"].pk]).update(api_key=world_a.api_key)
    Attempt.objects.filter(request=r["r2"], number=0).update(prompt_tokens=700)
    Finding.objects.create(request=r["r1"], attempt=None, tenant_id_copy=world_a.tenant.pk, kind="agent-loop",
                           severity="warning", action="ignored", detail="repeat: =HYPERLINK(x)", created=T0)
    ProxyRequest.objects.create(tenant=world_a.tenant, api_key=world_a.api_key, model="deepseek-chat", path="guarded",
                                outcome="rejected", status=429, created=T0 + timedelta(hours=1))
    return audit_rows


def _usage(client: Client, **query: Any) -> Any:
    return client.get(reverse("admin:audit_usage"), {**PERIOD, **query})


def test_it_shows_usage_per_model_with_the_wasted_tokens_loops_and_limits(usage_rows: AuditRows, viewer_a: User,
                                                                          login: Login) -> None:
    page = _usage(login(viewer_a), group="model")
    assert page.status_code == 200
    rows = {r["group"]: r for r in page.context["rows"]}
    assert set(rows) == {"deepseek-chat", "qwen-coder"}, "tenant B's model is not shown to A's viewer"
    deepseek = rows["deepseek-chat"]
    assert (deepseek["requests"], deepseek["prompt_tokens"], deepseek["completion_tokens"]) == (6, 5000, 650)
    assert (deepseek["wasted_prompt_tokens"], deepseek["wasted_completion_tokens"], deepseek["wasted_seconds"]) == (
        700, 130, 4.0)
    assert (deepseek["limits_hit"], deepseek["loops_broken"], deepseek["retry_budget_spent"]) == (1, 1, 0)
    qwen = rows["qwen-coder"]
    assert (qwen["requests"], qwen["completion_tokens"], qwen["wasted_completion_tokens"], qwen["loops_broken"]) == (
        2, 200, 120, 0)
    text = page.content.decode()
    assert text.count('role="img"') == 6 and "Agent loops broken" in text and "tenant-b-model" not in text


def test_it_groups_by_key_tenant_and_upstream(usage_rows: AuditRows, viewer_a: User, world_a: TenantWorld,
                                              login: Login) -> None:
    client = login(viewer_a)
    keys = {r["group"]: r["requests"] for r in _usage(client, group="key").context["rows"]}
    assert keys == {f"tenant-a / tr-{world_a.api_key.prefix} ({world_a.api_key.name})": 4, "(no key)": 4}
    tenants = {r["group"]: r["requests"] for r in _usage(client, group="tenant").context["rows"]}
    assert tenants == {"tenant-a": 8}
    upstreams = {r["group"]: r["requests"] for r in _usage(client, group="upstream").context["rows"]}
    assert upstreams == {"tenant-a / tenant-a-upstream": 5, "tenant-a / tenant-a-qwen": 2, "(no upstream)": 1}
    assert _usage(client).context["group"] == "key", "per key by default"


def test_a_superuser_sees_every_tenant_and_can_choose_one(usage_rows: AuditRows, superuser: User,
                                                          login: Login) -> None:
    client = login(superuser)
    every = {r["group"] for r in _usage(client, group="tenant").context["rows"]}
    assert every == {"tenant-a", "tenant-b"}
    only_b = _usage(client, group="tenant", tenant=usage_rows.upstream_b.tenant_id).context["rows"]
    assert [(r["group"], r["requests"]) for r in only_b] == [("tenant-b", 1)]


def test_another_tenant_is_refused_like_a_missing_one(usage_rows: AuditRows, viewer_a: User, login: Login) -> None:
    client = login(viewer_a)
    foreign = _usage(client, tenant=usage_rows.upstream_b.tenant_id)
    missing = _usage(client, tenant=10**9)
    assert foreign.status_code == missing.status_code == 200
    assert "rows" not in foreign.context and "rows" not in missing.context
    assert "Tenant B" not in foreign.content.decode()


def test_it_exports_the_table_as_safe_csv(usage_rows: AuditRows, viewer_a: User, login: Login) -> None:
    """The CSV has the page's rows; a cell that looks like a formula is defused (the model name comes from clients)."""
    ProxyRequest.objects.filter(pk=usage_rows.requests["r3"].pk).update(model="=cmd|' /C calc'!A0")
    response = _usage(login(viewer_a), group="model", format="csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    by_group = {r["group"]: r for r in rows}
    assert by_group["deepseek-chat"]["requests"] == "6" and by_group["deepseek-chat"]["loops_broken"] == "1"
    assert "'=cmd|' /C calc'!A0" in by_group
    assert list(rows[0]) == ["group", "requests", "prompt_tokens", "completion_tokens", "wasted_prompt_tokens",
                             "wasted_completion_tokens", "wasted_seconds", "limits_hit", "loops_broken",
                             "retry_budget_spent", "cost_usd", "wasted_usd", "unpriced"]


def test_it_is_for_audit_staff_only(usage_rows: AuditRows, login: Login, world_a: TenantWorld) -> None:
    from tests.conftest import _staff

    nobody = _staff("nobody")
    assert _usage(login(nobody)).status_code == 403


def test_the_dashboard_links_to_the_usage_of_its_period(usage_rows: AuditRows, viewer_a: User, login: Login) -> None:
    client = login(viewer_a)
    link = client.get(reverse("admin:audit_dashboard"), PERIOD).context["usage_link"]
    assert link.startswith(reverse("admin:audit_usage") + "?since=2026-01-01T00%3A00&until=2026-01-04T00%3A00")
    assert sum(r["requests"] for r in client.get(link).context["rows"]) == 8
