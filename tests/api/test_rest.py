"""The management REST API (``/api/v1/``): one tenant per admin token, keys, members, usage, budgets."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from api.models import AdminToken
from api.tokens import admin_token_authenticate, admin_token_create, admin_token_revoke
from audit.models import ProxyRequest
from tenants.auth import api_key_authenticate, principal_for_key
from tenants.models import ApiKey, Membership
from tenants.services import api_key_create
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

NO_MONEY = {"daily_usd": None, "weekly_usd": None, "monthly_usd": None, "money_soft_percent": None,
            "daily_usd_soft_percent": None, "weekly_usd_soft_percent": None, "monthly_usd_soft_percent": None}


class Api:
    """The test client with a tenant's admin token."""

    def __init__(self, client: Client, raw: str) -> None:
        self.client, self.headers = client, {"Authorization": f"Bearer {raw}"}

    def get(self, path: str, **query: Any) -> Any:
        return self.client.get(f"/api/v1{path}", query, headers=self.headers)

    def send(self, method: str, path: str, body: dict[str, Any]) -> Any:
        return getattr(self.client, method)(f"/api/v1{path}", body, content_type="application/json",
                                            headers=self.headers)


@pytest.fixture
def api_a(client: Client, world_a: TenantWorld) -> Api:
    return Api(client, admin_token_create(tenant=world_a.tenant, name="ci")[1])


def test_no_token_or_a_wrong_one_is_401(client: Client, world_a: TenantWorld) -> None:
    """Every endpoint needs a valid admin token; an API key is not one."""
    assert client.get("/api/v1/keys").status_code == 401
    assert Api(client, "tra-nosuchprefix-xxxxxxxx").get("/keys").status_code == 401
    assert Api(client, world_a.raw_key).get("/keys").status_code == 401


def test_a_revoked_token_is_refused(client: Client, world_a: TenantWorld) -> None:
    """Revoked in the admin (or by the command): the next call is 401."""
    token, raw = admin_token_create(tenant=world_a.tenant)
    assert Api(client, raw).get("/keys").status_code == 200
    admin_token_revoke(token=token)
    assert Api(client, raw).get("/keys").status_code == 401


def test_the_token_is_stored_as_a_digest(world_a: TenantWorld) -> None:
    """Only the prefix and a digest are kept; the raw token authenticates."""
    token, raw = admin_token_create(tenant=world_a.tenant)
    assert raw not in (token.digest, token.prefix) and token.prefix in raw
    assert admin_token_authenticate(raw) == token
    assert admin_token_authenticate(raw[:-1] + ("A" if raw[-1] != "A" else "B")) is None


def test_keys_create_list_revoke(api_a: Api, world_a: TenantWorld, dev_a: Membership) -> None:
    """A member's key: created with its secret once, listed without it, revoked."""
    response = api_a.send("post", "/keys", {"name": "ci-runner", "member": "dev-a", "expires_days": 7})
    assert response.status_code == 201, response.content
    created = response.json()
    assert created["member"] == "dev-a" and created["secret"].startswith("tr-")
    principal = principal_for_key(created["secret"])
    assert principal is not None and principal.member_id == dev_a.pk
    listed = api_a.get("/keys", member="dev-a").json()
    assert [k["id"] for k in listed] == [created["id"]] and "secret" not in listed[0]
    assert {k["name"] for k in api_a.get("/keys").json()} == {"ci-runner", "tenant-a-key"}
    revoked = api_a.send("post", f"/keys/{created['id']}/revoke", {})
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    assert api_key_authenticate(created["secret"]) is None
    assert api_a.get("/keys", member="dev-a").json() == []


def test_a_members_max_keys_holds_through_the_api(api_a: Api, dev_a: Membership) -> None:
    """dev-a may hold two keys: the third is 422."""
    for n in range(2):
        assert api_a.send("post", "/keys", {"name": f"k{n}", "member": "dev-a"}).status_code == 201
    third = api_a.send("post", "/keys", {"name": "k3", "member": "dev-a"})
    assert third.status_code == 422 and "revoke one first" in third.json()["detail"]


def test_another_tenants_rows_are_404(api_a: Api, world_b: TenantWorld, dev_b: Membership) -> None:
    """Tenant B's key and member do not exist for tenant A's token."""
    key_b, _ = api_key_create(tenant=world_b.tenant, name="b", member=dev_b)
    assert api_a.send("post", f"/keys/{key_b.pk}/revoke", {}).status_code == 404
    assert api_a.send("post", f"/keys/{world_b.api_key.pk}/revoke", {}).status_code == 404
    assert api_a.send("post", "/keys", {"name": "x", "member": "dev-b"}).status_code == 404
    assert api_a.send("put", f"/budgets/keys/{key_b.pk}", {"rpm": 1}).status_code == 404
    assert api_a.send("put", "/budgets/members/dev-b", {"rpm": 1}).status_code == 404
    assert api_a.send("patch", "/members/dev-b", {"max_keys": 9}).status_code == 404
    assert "dev-b" not in api_a.get("/members").content.decode()
    assert world_b.api_key.prefix not in api_a.get("/keys", revoked="true").content.decode()
    key_b.refresh_from_db()
    assert key_b.revoked_at is None and key_b.rpm is None


def test_members_list_and_update(api_a: Api, dev_a: Membership) -> None:
    """A tenant admin sets a person's max keys and models; bad models are 422."""
    assert [m["username"] for m in api_a.get("/members").json()] == ["dev-a"]
    changed = api_a.send("patch", "/members/dev-a", {"max_keys": 5, "allowed_models": ["glm-*"]})
    assert changed.status_code == 200 and changed.json()["allowed_models"] == ["glm-*"]
    dev_a.refresh_from_db()
    assert (dev_a.max_keys, dev_a.allowed_models) == (5, ["glm-*"])
    assert api_a.send("patch", "/members/dev-a", {"allowed_models": [""]}).status_code == 422
    assert api_a.send("patch", "/members/dev-a", {"max_keys": -1}).status_code == 422


def test_budgets_set_token_limits_within_the_tenant(api_a: Api, world_a: TenantWorld, dev_a: Membership) -> None:
    """Tenant, key and member limits; only given fields change; above the tenant's is 422."""
    assert api_a.send("put", "/budgets/tenant", {"daily_tokens": 1000, "rpm": 60}).json()["limits"]["rpm"] == 60
    member = api_a.send("put", "/budgets/members/dev-a", {"daily_tokens": 500})
    assert member.status_code == 200 and member.json() == {
        "holder": "member dev-a", "limits": {"rpm": None, "tpm": None, "concurrency": None, "daily_tokens": 500,
                                             "monthly_tokens": None, **NO_MONEY}}
    assert api_a.send("put", "/budgets/members/dev-a", {"daily_tokens": 5000}).status_code == 422
    key = api_a.send("put", f"/budgets/keys/{world_a.api_key.pk}", {"rpm": 10})
    assert key.status_code == 200 and key.json()["holder"] == f"key tr-{world_a.api_key.prefix}"
    assert api_a.send("put", "/budgets/tenant", {"rpm": None}).json()["limits"] == {
        "rpm": None, "tpm": None, "concurrency": None, "daily_tokens": 1000, "monthly_tokens": None, **NO_MONEY}
    assert api_a.send("put", "/budgets/tenant", {"rpm": -5}).status_code == 422
    dev_a.refresh_from_db()
    assert dev_a.daily_tokens == 500
    shown = api_a.get("/budgets").json()
    assert shown["tenant"]["limits"]["daily_tokens"] == 1000
    assert {m["holder"]: m["limits"]["daily_tokens"] for m in shown["members"]} == {"member dev-a": 500}
    assert {k["holder"]: k["limits"]["rpm"] for k in shown["keys"]} == {f"key tr-{world_a.api_key.prefix}": 10}


def test_usage_by_member(api_a: Api, world_a: TenantWorld, world_b: TenantWorld, dev_a: Membership) -> None:
    """The tenant's requests split by member; tenant B's never counted."""
    now = timezone.now()
    for member, tokens in ((dev_a, 10), (None, 5)):
        ProxyRequest.objects.create(tenant=world_a.tenant, model="m", path="guarded", outcome="clean",
                                    prompt_tokens=tokens, completion_tokens=1, member=member,
                                    member_username=member.user.username if member else "", created=now)
    ProxyRequest.objects.create(tenant=world_b.tenant, model="m", path="guarded", prompt_tokens=999, created=now)
    body = api_a.get("/usage", since=(now - timedelta(hours=1)).isoformat(),
                     until=(now + timedelta(hours=1)).isoformat()).json()
    assert (body["tenant"], body["requests"], body["prompt_tokens"]) == ("tenant-a", 2, 15)
    by = {row["member"]: row["prompt_tokens"] for row in body["by_member"]}
    assert by == {"dev-a": 10, "(tenant keys)": 5}
    assert api_a.get("/usage", since="2026-01-02T00:00:00Z", until="2026-01-01T00:00:00Z").status_code == 422
    assert api_a.get("/usage", since="not a time").status_code == 422


def test_the_openapi_schema_and_docs_are_served(client: Client) -> None:
    """The schema lists every endpoint with bearer auth; the docs page renders."""
    schema = client.get("/api/v1/openapi.json").json()
    assert {"/api/v1/keys", "/api/v1/keys/{key_id}/revoke", "/api/v1/usage", "/api/v1/members",
            "/api/v1/budgets/tenant", "/api/v1/budgets/members/{username}"} <= set(schema["paths"])
    assert "AdminTokenAuth" in schema["components"]["securitySchemes"]
    assert client.get("/api/v1/docs").status_code == 200


def test_the_command_prints_a_token_once(world_a: TenantWorld) -> None:
    """``apitoken --tenant T --name N`` prints the raw token; ``--list`` never does; ``--revoke`` revokes."""
    out = StringIO()
    call_command("apitoken", "--tenant", "tenant-a", "--name", "ci", stdout=out, stderr=StringIO())
    raw = out.getvalue().strip()
    token = AdminToken.objects.get(tenant=world_a.tenant)
    assert admin_token_authenticate(raw) == token and token.name == "ci"
    listing = StringIO()
    call_command("apitoken", "--tenant", "tenant-a", "--list", stdout=listing)
    assert token.prefix in listing.getvalue() and raw not in listing.getvalue()
    call_command("apitoken", "--tenant", "tenant-a", "--revoke", token.display, stdout=StringIO())
    assert admin_token_authenticate(raw) is None


def test_tokens_are_revocable_in_the_admin(client: Client, admin_a: Any, world_a: TenantWorld,
                                           world_b: TenantWorld) -> None:
    """A tenant admin sees and revokes their tenant's tokens, not another tenant's."""
    mine, _ = admin_token_create(tenant=world_a.tenant, name="mine")
    theirs, _ = admin_token_create(tenant=world_b.tenant, name="theirs")
    client.force_login(admin_a)
    page = client.get("/admin/api/admintoken/").content.decode()
    assert mine.prefix in page and theirs.prefix not in page
    client.post("/admin/api/admintoken/", {"action": "revoke", "_selected_action": [mine.pk, theirs.pk]})
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.revoked_at is not None and theirs.revoked_at is None
    assert not ApiKey.objects.filter(name="x").exists()


def test_a_budget_window_has_its_own_soft_threshold_over_rest(client: Client, world_a: TenantWorld) -> None:
    api = Api(client, admin_token_create(tenant=world_a.tenant)[1])
    set_ = api.send("put", "/budgets/tenant", {"money_soft_percent": 70, "daily_usd_soft_percent": 90})
    assert set_.status_code == 200, set_.content
    limits = set_.json()["limits"]
    assert (limits["money_soft_percent"], limits["daily_usd_soft_percent"], limits["weekly_usd_soft_percent"]) == (
        70, 90, None)
    assert api.send("put", "/budgets/tenant", {"monthly_usd_soft_percent": 0}).status_code == 422
    assert api.send("put", "/budgets/tenant", {"daily_usd_soft_percent": None}).json()["limits"][
        "daily_usd_soft_percent"] is None
