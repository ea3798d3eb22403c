"""A tenant admin adds people (issue 19 item 5, "within limits their tenant admin sets"): a new account with
the ``member`` role, how many keys, which models, their budget; from the admin (``/admin/tenants/membership/
add/``) and from the REST API (``POST /api/v1/members``). The person sets a password on the invitation link
and signs in; another tenant's admin neither sees nor touches them (admin pages, REST calls, keys)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from api.tokens import admin_token_create
from tenants.models import ApiKey, Membership
from tests.api.test_rest import Api
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

LINK = re.compile(r'value="(https?://[^"]+/account/invite/[^"]+/)"')
NEW_PASSWORD = "a-long-enough-password-42"  # noqa: S105 - a test account's


def _set_password(client: Client, link: str) -> Any:
    """Follow the invitation as a browser: GET (Django redirects to the set-password form), then POST."""
    path = link.split("://", 1)[1].split("/", 1)[1]
    form = client.get(f"/{path}", follow=True)
    assert form.status_code == 200 and "invite-form" in form.content.decode(), form.content.decode()[:500]
    return client.post(form.redirect_chain[-1][0], {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})


def test_a_tenant_admin_adds_a_person_in_the_admin_with_keys_models_and_budget(
        client: Client, admin_a: User, outsider_b: User, world_a: TenantWorld, world_b: TenantWorld,
        settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    world_a.tenant.daily_usd = 10
    world_a.tenant.save()
    client.force_login(admin_a)
    page = client.get("/admin/tenants/membership/add/")
    assert page.status_code == 200 and "Add a person" in page.content.decode()
    assert "Tenant B" not in page.content.decode()  # only tenants A's admin manages
    answer = client.post("/admin/tenants/membership/add/", {
        "username": "carol", "email": "carol@example.com", "tenant": world_a.tenant.pk, "max_keys": 2,
        "allowed_models": '["deepseek-*"]', "daily_usd": "1.5", "money_soft_percent": "90"})
    found = LINK.search(answer.content.decode())
    assert answer.status_code == 200 and found, answer.content.decode()[:2000]
    carol = Membership.objects.get(user__username="carol")
    assert (carol.tenant_id, carol.role, carol.max_keys, carol.allowed_models) == (
        world_a.tenant.pk, Membership.MEMBER, 2, ["deepseek-*"])
    assert carol.limits().daily_usd == 1.5 and carol.limits().money_soft_percent == 90
    assert not carol.user.is_staff and not carol.user.has_usable_password()

    over = client.post("/admin/tenants/membership/add/", {"username": "dave", "tenant": world_a.tenant.pk,
                                                          "max_keys": 1, "allowed_models": "[]", "daily_usd": "11"})
    assert "Above the tenant" in over.content.decode() and not User.objects.filter(username="dave").exists()
    taken = client.post("/admin/tenants/membership/add/", {"username": "outsider-b", "tenant": world_a.tenant.pk,
                                                           "max_keys": 1, "allowed_models": "[]"})
    assert "taken" in taken.content.decode()
    assert not Membership.objects.filter(user__username="outsider-b", tenant=world_a.tenant).exists()
    foreign = client.post("/admin/tenants/membership/add/", {"username": "erin", "tenant": world_b.tenant.pk,
                                                             "max_keys": 1, "allowed_models": "[]"})
    assert foreign.status_code == 200 and not User.objects.filter(username="erin").exists()

    client.logout()
    client.force_login(outsider_b)  # B's admin: carol's page is a missing row, the list does not name her
    assert client.get(f"/admin/tenants/membership/{carol.pk}/change/").status_code in (302, 404)
    assert "carol" not in client.get("/admin/tenants/membership/").content.decode()
    assert client.post(f"/admin/tenants/membership/{carol.pk}/delete/", {"post": "yes"}).status_code in (302, 404)
    assert Membership.objects.filter(pk=carol.pk).exists()

    client.logout()
    assert _set_password(client, found.group(1)).status_code == 302
    assert client.post("/account/login/", {"username": "carol", "password": NEW_PASSWORD}).status_code == 302
    assert "deepseek-*" in client.get("/account/keys/").content.decode()
    client.logout()
    again = client.get("/" + found.group(1).split("://", 1)[1].split("/", 1)[1], follow=True)
    assert "not valid" in again.content.decode()  # used once


def test_a_tenant_admin_removes_a_member_but_not_an_admin(client: Client, admin_a: User, world_a: TenantWorld,
                                                          viewer_a: User) -> None:
    from tenants.services import member_key_create
    from tests.api.conftest import make_member

    person = make_member(world_a, "leaver")
    key, _ = member_key_create(membership=person, name="laptop")
    client.force_login(admin_a)
    viewer = Membership.objects.get(user=viewer_a)
    assert client.post(f"/admin/tenants/membership/{viewer.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.post(f"/admin/tenants/membership/{person.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Membership.objects.filter(pk=person.pk).exists()
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    assert "delete_selected" not in client.get("/admin/tenants/membership/").content.decode()


def test_the_rest_api_adds_a_person_whom_the_other_tenant_cannot_see_or_touch(
        client: Client, world_a: TenantWorld, world_b: TenantWorld, settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    api_a = Api(client, admin_token_create(tenant=world_a.tenant)[1])
    api_b = Api(client, admin_token_create(tenant=world_b.tenant)[1])
    made = api_a.send("post", "/members", {"username": "frank", "max_keys": 1, "allowed_models": ["glm-*"],
                                           "limits": {"daily_usd": 0.5, "money_soft_percent": 75}})
    assert made.status_code == 201, made.content
    body = made.json()
    assert (body["username"], body["role"], body["max_keys"], body["allowed_models"]) == (
        "frank", "member", 1, ["glm-*"])
    assert body["limits"]["daily_usd"] == 0.5 and body["limits"]["money_soft_percent"] == 75
    assert "/account/invite/" in body["invite_url"]
    assert api_a.send("post", "/members", {"username": "frank"}).status_code == 422  # taken
    assert api_a.send("post", "/members", {"username": "x y"}).status_code == 422  # not a user name

    key = api_a.send("post", "/keys", {"name": "ci", "member": "frank"}).json()
    assert api_a.send("post", "/keys", {"name": "two", "member": "frank"}).status_code == 422  # max_keys
    assert "frank" not in {m["username"] for m in api_b.get("/members").json()}
    assert key["id"] not in {k["id"] for k in api_b.get("/keys", revoked="true").json()}
    assert api_b.send("post", f"/keys/{key['id']}/revoke", {}).status_code == 404
    assert api_b.send("patch", "/members/frank", {"max_keys": 9}).status_code == 404
    assert api_b.send("put", "/budgets/members/frank", {"daily_usd": 9}).status_code == 404
    assert api_b.send("delete", "/members/frank", {}).status_code == 404
    assert ApiKey.objects.get(pk=key["id"]).revoked_at is None

    budget = api_a.send("put", "/budgets/members/frank", {"weekly_usd": 2, "money_soft_percent": None})
    assert budget.status_code == 200 and budget.json()["limits"]["weekly_usd"] == 2
    assert budget.json()["limits"]["daily_usd"] == 0.5 and budget.json()["limits"]["money_soft_percent"] is None
    assert api_a.send("put", "/budgets/tenant", {"daily_usd": 1}).status_code == 200
    assert api_a.send("put", "/budgets/members/frank", {"daily_usd": 2}).status_code == 422  # above the tenant's
    assert api_a.send("put", "/budgets/tenant", {"money_soft_percent": 0}).status_code == 422

    assert _set_password(client, body["invite_url"]).status_code == 302
    assert api_a.send("delete", "/members/frank", {}).status_code == 204
    assert ApiKey.objects.get(pk=key["id"]).revoked_at is not None
    assert User.objects.filter(username="frank").exists()  # the account stays


def test_the_rest_usage_carries_money(client: Client, world_a: TenantWorld) -> None:
    from decimal import Decimal

    from audit.models import ProxyRequest

    ProxyRequest.objects.create(tenant=world_a.tenant, model="m", path="guarded", cost_usd=Decimal("0.000025"),
                                delivered_usd=Decimal("0.000020"), wasted_usd=Decimal("0.000005"))
    api_a = Api(client, admin_token_create(tenant=world_a.tenant)[1])
    money = api_a.get("/usage").json()["money"]
    assert money["requests"] == 1 and money["cost_usd"] == pytest.approx(25e-6)
    assert money["wasted_usd"] == pytest.approx(5e-6) and money["by_model"][0]["model"] == "m"
