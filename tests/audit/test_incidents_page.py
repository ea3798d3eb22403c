"""The live incidents page in the admin: rendered for each persona with their tenants' recent incidents only, its
script allowed by the page's CSP nonce, the WebSocket allowed by connect-src, listed in the Audit section."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tests.audit.conftest import add_request

Login = Callable[[User], Client]
PAGE = reverse("admin:audit_incidents")
SEEN = {"admin_a": {"a-exhausted", "a-retried"}, "viewer_a": {"a-exhausted", "a-retried"},
        "outsider_b": {"b-exhausted"}, "superuser": {"a-exhausted", "a-retried", "b-exhausted"}}


@pytest.fixture
def recent(world_a: Any, world_b: Any) -> dict[str, str]:
    """Request ids by name: A's exhausted and retried requests, a clean one, and B's exhausted one."""
    now = timezone.now() - timedelta(minutes=5)
    rows = {"a-exhausted": add_request(world_a.tenant, world_a.upstream, "a1", at=now, model="m", outcome="exhausted",
                                       attempts=3),
            "a-retried": add_request(world_a.tenant, world_a.upstream, "a2", at=now, model="m",
                                     outcome="recovered-by-retry", attempts=2),
            "a-clean": add_request(world_a.tenant, world_a.upstream, "a3", at=now, model="m"),
            "b-exhausted": add_request(world_b.tenant, world_b.upstream, "b1", at=now, model="m",
                                       outcome="exhausted", attempts=3)}
    return {name: str(row.pk) for name, row in rows.items()}


@pytest.mark.parametrize("persona", sorted(SEEN))
def test_it_starts_with_the_recent_incidents_of_the_users_tenants(persona: str, recent: dict[str, str],
                                                                  login: Login, request: pytest.FixtureRequest
                                                                  ) -> None:
    page = login(request.getfixturevalue(persona)).get(PAGE)
    html = page.content.decode()
    assert page.status_code == 200 and "Live incidents" in html
    shown = json.loads(html.split('<script id="tr-recent" type="application/json">', 1)[1].split("</script>")[0])
    ids = {item["request_id"] for item in shown}
    assert ids == {recent[name] for name in SEEN[persona]}
    names = json.loads(html.split('<script id="tr-names" type="application/json">', 1)[1].split("</script>")[0])
    assert ("Tenant B" in names["tenants"].values()) == (persona in ("outsider_b", "superuser"))
    assert ("Tenant A" in names["tenants"].values()) == (persona != "outsider_b")


def test_its_script_carries_the_csp_nonce_and_the_socket_is_allowed(recent: dict[str, str], viewer_a: User,
                                                                     login: Login) -> None:
    page = login(viewer_a).get(PAGE)
    policy = page["Content-Security-Policy"]
    nonce = re.search(r"'nonce-([^']+)'", policy)
    assert nonce is not None
    scripts = re.findall(r'<script nonce="([^"]+)">', page.content.decode())
    assert scripts and all(found == nonce.group(1) for found in scripts)
    connect = next(d for d in policy.split(";") if d.strip().startswith("connect-src"))
    assert "'self'" in connect and "ws://127.0.0.1:8000" in connect


def test_it_is_refused_to_staff_without_a_tenant_and_listed_in_the_audit_section(
        recent: dict[str, str], viewer_a: User, login: Login, django_user_model: Any) -> None:
    lonely = django_user_model.objects.create_user("lonely", password="pw", is_staff=True)
    assert login(lonely).get(PAGE).status_code == 403
    index = login(viewer_a).get(reverse("admin:index")).content.decode()
    audit = index.split('class="app-audit', 1)[1].split("</table>", 1)[0]
    assert PAGE in audit and audit.index(reverse("admin:audit_dashboard")) < audit.index(PAGE)
