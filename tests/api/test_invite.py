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
    carol = Membership.objects.get(user__username="carol@tenant-a")
    assert (carol.tenant_id, carol.role, carol.max_keys, carol.allowed_models) == (
        world_a.tenant.pk, Membership.MEMBER, 2, ["deepseek-*"])
    assert carol.limits().daily_usd == 1.5 and carol.limits().money_soft_percent == 90
    assert not carol.user.is_staff and not carol.user.has_usable_password()

    over = client.post("/admin/tenants/membership/add/", {"username": "dave", "tenant": world_a.tenant.pk,
                                                          "max_keys": 1, "allowed_models": "[]", "daily_usd": "11"})
    assert "Above the tenant" in over.content.decode() and not User.objects.filter(username__startswith="dave").exists()
    taken = client.post("/admin/tenants/membership/add/", {"username": "carol", "tenant": world_a.tenant.pk,
                                                           "max_keys": 1, "allowed_models": "[]"})
    assert "carol@tenant-a is taken" in taken.content.decode()  # this tenant's own name
    assert not Membership.objects.filter(user__username="outsider-b", tenant=world_a.tenant).exists()
    foreign = client.post("/admin/tenants/membership/add/", {"username": "erin", "tenant": world_b.tenant.pk,
                                                             "max_keys": 1, "allowed_models": "[]"})
    assert foreign.status_code == 200 and not User.objects.filter(username__startswith="erin").exists()

    client.logout()
    client.force_login(outsider_b)  # B's admin: carol's page is a missing row, the list does not name her
    assert client.get(f"/admin/tenants/membership/{carol.pk}/change/").status_code in (302, 404)
    assert "carol" not in client.get("/admin/tenants/membership/").content.decode()
    assert client.post(f"/admin/tenants/membership/{carol.pk}/delete/", {"post": "yes"}).status_code in (302, 404)
    assert Membership.objects.filter(pk=carol.pk).exists()

    client.logout()
    assert _set_password(client, found.group(1)).status_code == 302
    assert client.post("/account/login/", {"username": "carol@tenant-a", "password": NEW_PASSWORD}).status_code == 302
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
        "frank@tenant-a", "member", 1, ["glm-*"])
    assert body["limits"]["daily_usd"] == 0.5 and body["limits"]["money_soft_percent"] == 75
    assert "/account/invite/" in body["invite_url"]
    assert api_a.send("post", "/members", {"username": "frank"}).status_code == 422  # taken
    assert api_a.send("post", "/members", {"username": "x y"}).status_code == 422  # not a user name

    key = api_a.send("post", "/keys", {"name": "ci", "member": "frank"}).json()
    assert api_a.send("post", "/keys", {"name": "two", "member": "frank"}).status_code == 422  # max_keys
    assert not any("frank" in m["username"] for m in api_b.get("/members").json())
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
    assert User.objects.filter(username="frank@tenant-a").exists()  # the account stays


def test_the_rest_usage_carries_money(client: Client, world_a: TenantWorld) -> None:
    from decimal import Decimal

    from audit.models import ProxyRequest

    ProxyRequest.objects.create(tenant=world_a.tenant, model="m", path="guarded", cost_usd=Decimal("0.000025"),
                                delivered_usd=Decimal("0.000020"), wasted_usd=Decimal("0.000005"))
    api_a = Api(client, admin_token_create(tenant=world_a.tenant)[1])
    money = api_a.get("/usage").json()["money"]
    assert money["requests"] == 1 and money["cost_usd"] == pytest.approx(25e-6)
    assert money["wasted_usd"] == pytest.approx(5e-6) and money["by_model"][0]["model"] == "m"


def _path(link: str) -> str:
    return "/" + link.split("://", 1)[1].split("/", 1)[1]


def test_a_name_taken_in_another_tenant_is_neither_refused_nor_revealed(client: Client, world_a: TenantWorld,
                                                                       world_b: TenantWorld,
                                                                       outsider_b: User) -> None:
    """Accounts a tenant admin makes are named in the tenant's own namespace (``<name>@<tenant slug>``): a name
    another tenant's person has gets the same 201 as a free one, and an invalid name the same 422 whether or
    not an account of that name exists."""
    User.objects.create_user("grace")  # someone's account, elsewhere
    api_a = Api(client, admin_token_create(tenant=world_a.tenant)[1])
    taken, free = (api_a.send("post", "/members", {"username": name}) for name in ("grace", "heidi"))
    assert (taken.status_code, free.status_code) == (201, 201)
    assert (taken.json()["username"], free.json()["username"]) == ("grace@tenant-a", "heidi@tenant-a")
    assert set(taken.json()) == set(free.json())
    assert api_a.send("post", "/members", {"username": "outsider-b"}).json()["username"] == "outsider-b@tenant-a"
    assert not User.objects.get(username="outsider-b").memberships.filter(tenant=world_a.tenant).exists()
    assert api_a.send("post", "/members", {"username": "grace@tenant-a"}).status_code == 422  # this tenant's own
    User.objects.create_user("ivan@tenant-b")
    exists, missing = (api_a.send("post", "/members", {"username": n}) for n in ("ivan@tenant-b", "judy@tenant-b"))
    assert (exists.status_code, missing.status_code) == (422, 422)
    assert exists.json() == missing.json()
    # the handle names the member in paths
    assert api_a.send("patch", "/members/grace", {"max_keys": 2}).json()["max_keys"] == 2
    assert User.objects.get(username="grace").memberships.count() == 0


def test_the_invitation_is_e_mailed_when_the_person_has_an_address(client: Client, world_a: TenantWorld,
                                                                   admin_a: User) -> None:
    from django.core import mail

    api_a = Api(client, admin_token_create(tenant=world_a.tenant)[1])
    made = api_a.send("post", "/members", {"username": "kim", "email": "kim@example.com"}).json()
    assert made["emailed"] is True and len(mail.outbox) == 1
    sent = mail.outbox[0]
    assert sent.to == ["kim@example.com"] and "Tenant A" in sent.subject
    assert made["invite_url"] in sent.body and "kim@tenant-a" in sent.body
    assert api_a.send("post", "/members", {"username": "lee"}).json()["emailed"] is False
    assert len(mail.outbox) == 1

    client.force_login(admin_a)  # the admin's page: e-mailed too, and says so
    page = client.post("/admin/tenants/membership/add/", {"username": "mia", "email": "mia@example.com",
                                                          "tenant": world_a.tenant.pk, "max_keys": 1,
                                                          "allowed_models": "[]"}).content.decode()
    link = LINK.search(page)
    assert link and "e-mailed to mia@example.com" in page and 'id="copy-invite-link"' in page
    assert len(mail.outbox) == 2 and link.group(1) in mail.outbox[1].body


def test_a_failed_e_mail_still_gives_the_link(client: Client, world_a: TenantWorld,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import django.core.mail

    def refused(*args: Any, **kwargs: Any) -> int:
        raise OSError("connection refused")

    monkeypatch.setattr(django.core.mail, "send_mail", refused)
    api_a = Api(client, admin_token_create(tenant=world_a.tenant)[1])
    made = api_a.send("post", "/members", {"username": "ned", "email": "ned@example.com"})
    assert made.status_code == 201 and made.json()["emailed"] is False
    assert "/account/invite/" in made.json()["invite_url"]


def test_a_lost_invitation_is_sent_again_over_rest_and_the_old_link_stops_working(
        client: Client, world_a: TenantWorld, world_b: TenantWorld, settings: Any) -> None:
    from django.core import mail

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    api_a = Api(client, admin_token_create(tenant=world_a.tenant)[1])
    api_b = Api(client, admin_token_create(tenant=world_b.tenant)[1])
    first = api_a.send("post", "/members", {"username": "olga", "email": "olga@example.com"}).json()
    assert api_b.send("post", "/members/olga/invite", {}).status_code == 404  # another tenant's: missing
    again = api_a.send("post", "/members/olga/invite", {})
    assert again.status_code == 200, again.content
    second = again.json()
    assert second["username"] == "olga@tenant-a" and second["emailed"] is True
    assert second["invite_url"] != first["invite_url"] and second["invite_url"] in mail.outbox[-1].body
    stale = client.get(_path(first["invite_url"]), follow=True)
    assert "not valid" in stale.content.decode()  # the older link stopped working
    assert _set_password(client, second["invite_url"]).status_code == 302
    taken = api_a.send("post", "/members/olga@tenant-a/invite", {})
    assert taken.status_code == 422 and "already taken" in taken.json()["detail"]  # a password is set now
    assert "/api/v1/members/{username}/invite" in api_a.get("/openapi.json").json()["paths"]


def test_a_tenant_admin_sends_a_new_invitation_from_the_membership_page(
        client: Client, admin_a: User, outsider_b: User, world_a: TenantWorld) -> None:
    from tenants.services import member_invite

    first = member_invite(tenant=world_a.tenant, username="pat", email="pat@example.com")
    person = first.membership
    client.force_login(admin_a)
    change = client.get(f"/admin/tenants/membership/{person.pk}/change/").content.decode()
    assert f"/admin/tenants/membership/{person.pk}/invite/" in change
    ask = client.get(f"/admin/tenants/membership/{person.pk}/invite/")
    asked = ask.content.decode()
    assert ask.status_code == 200 and "every link sent" in asked and not LINK.search(asked)
    sent = client.post(f"/admin/tenants/membership/{person.pk}/invite/", {})
    page = sent.content.decode()
    link = LINK.search(page)
    assert sent.status_code == 200 and link and "no longer work" in page and "no-store" in sent["Cache-Control"]
    assert _path(link.group(1)) != first.invite_path
    assert "not valid" in client.get(first.invite_path, follow=True).content.decode()

    own = Membership.objects.get(user=admin_a)  # an admin's membership: not an open invitation
    refused = client.post(f"/admin/tenants/membership/{own.pk}/invite/", {}, follow=True)
    assert "member role" in refused.content.decode() and not LINK.search(refused.content.decode())
    client.logout()
    client.force_login(outsider_b)  # B's admin: the page is a missing one
    assert client.post(f"/admin/tenants/membership/{person.pk}/invite/", {}).status_code in (302, 404)
