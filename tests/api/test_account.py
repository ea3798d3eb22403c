"""The self-service key page (``/account/keys/``): a person's own keys, within what their tenant allows."""

from __future__ import annotations

import re

import pytest
from django.test import Client, override_settings

from tenants.auth import principal_for_key
from tenants.models import ApiKey, Membership
from tenants.services import api_key_create
from tests.api.conftest import make_member
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

KEY = re.compile(r'value="(tr-[a-z0-9]{12}-[A-Za-z0-9_-]{43})"')


def _signed_in(client: Client, member: Membership) -> Client:
    client.force_login(member.user)
    return client


def _create(client: Client, member: Membership, name: str = "laptop") -> str:
    """Create a key on the page; the raw key from the page that shows it once."""
    response = client.post("/account/keys/create/", {"membership": member.pk, "name": name})
    assert response.status_code == 302 and response["Location"] == "/account/keys/"
    page = client.get("/account/keys/").content.decode()
    found = KEY.search(page)
    assert found, page
    return found.group(1)


def test_the_page_asks_to_sign_in(client: Client) -> None:
    """Anonymous: redirected to the account's own login page (not the admin's)."""
    response = client.get("/account/keys/")
    assert response.status_code == 302 and response["Location"].startswith("/account/login/")


def test_a_member_signs_in_with_a_password(client: Client, dev_a: Membership) -> None:
    """A person who is not staff signs in on /account/login/ and lands on their keys."""
    response = client.post("/account/login/", {"username": "dev-a", "password": "pw-long-enough-123"})
    assert response.status_code == 302 and response["Location"] == "/account/keys/"
    assert client.get("/account/keys/").status_code == 200
    assert client.get("/admin/").status_code == 302  # still no admin


def test_a_member_creates_a_key_shown_once_that_works_and_is_theirs(client: Client, dev_a: Membership) -> None:
    """Create: the key is shown on the next load only; it authenticates and carries the member."""
    _signed_in(client, dev_a)
    raw = _create(client, dev_a)
    assert raw not in client.get("/account/keys/").content.decode()  # shown once
    key = ApiKey.objects.get(prefix=raw.split("-")[1])
    assert key.member == dev_a and key.tenant_id == dev_a.tenant_id and key.name == "laptop"
    principal = principal_for_key(raw)
    assert principal is not None and principal.member_id == dev_a.pk
    assert principal.allows("tenant-a-model") and not principal.allows("other-model")


def test_max_keys_is_enforced_and_revoking_frees_a_place(client: Client, dev_a: Membership) -> None:
    """Two keys allowed: the third is refused until one is revoked."""
    _signed_in(client, dev_a)
    _create(client, dev_a, "one")
    _create(client, dev_a, "two")
    response = client.post("/account/keys/create/", {"membership": dev_a.pk, "name": "three"})
    assert response.status_code == 400 and "revoke one first" in response.content.decode()
    first = ApiKey.objects.get(member=dev_a, name="one")
    response = client.post(f"/account/keys/{dev_a.pk}/{first.pk}/revoke/")
    assert response.status_code == 302
    first.refresh_from_db()
    assert first.revoked_at is not None
    _create(client, dev_a, "three")


def test_a_member_never_sees_or_revokes_another_tenants_keys(client: Client, dev_a: Membership,
                                                             dev_b: Membership, world_b: TenantWorld) -> None:
    """Tenant B's member key and B's own key: not listed for A's member, not revocable, not creatable into."""
    key_b, _ = api_key_create(tenant=world_b.tenant, name="b-secret-name", member=dev_b)
    _signed_in(client, dev_a)
    page = client.get("/account/keys/").content.decode()
    assert "b-secret-name" not in page and key_b.prefix not in page and world_b.api_key.prefix not in page
    assert "Tenant B" not in page
    assert client.post(f"/account/keys/{dev_b.pk}/{key_b.pk}/revoke/").status_code == 404
    assert client.post(f"/account/keys/{dev_a.pk}/{key_b.pk}/revoke/").status_code == 404
    assert client.post("/account/keys/create/", {"membership": dev_b.pk, "name": "x"}).status_code == 404
    key_b.refresh_from_db()
    assert key_b.revoked_at is None and not ApiKey.objects.filter(name="x").exists()


def test_a_member_does_not_see_a_colleagues_keys(client: Client, dev_a: Membership, world_a: TenantWorld) -> None:
    """Same tenant, another person: their keys and the tenant's own keys are not on the page."""
    colleague = make_member(world_a, "colleague")
    other, _ = api_key_create(tenant=world_a.tenant, name="colleague-key", member=colleague)
    _signed_in(client, dev_a)
    page = client.get("/account/keys/").content.decode()
    assert other.prefix not in page and world_a.api_key.prefix not in page
    assert client.post(f"/account/keys/{dev_a.pk}/{other.pk}/revoke/").status_code == 404


def test_forms_need_csrf(dev_a: Membership) -> None:
    """Create and revoke are POSTs under CSRF protection."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(dev_a.user)
    assert client.post("/account/keys/create/", {"membership": dev_a.pk, "name": "x"}).status_code == 403
    assert client.get("/account/keys/create/").status_code == 405


def test_bad_input_is_a_form_error(client: Client, dev_a: Membership) -> None:
    """Empty name, a huge expiry, a non-number membership: 400/404, never a crash."""
    _signed_in(client, dev_a)
    assert client.post("/account/keys/create/", {"membership": dev_a.pk, "name": ""}).status_code == 400
    assert client.post("/account/keys/create/", {"membership": dev_a.pk, "name": "n",
                                                  "days": "99999999"}).status_code == 400
    assert client.post("/account/keys/create/", {"membership": "abc", "name": "n"}).status_code == 400
    assert client.post("/account/keys/create/", {"membership": "999999", "name": "n"}).status_code == 404
    assert not ApiKey.objects.filter(member=dev_a).exists()


def test_a_user_without_membership_sees_an_empty_page(client: Client, world_a: TenantWorld) -> None:
    """Signed in, belonging to no tenant: told so."""
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user(username="nobody", password="pw"))
    assert "belongs to no tenant" in client.get("/account/keys/").content.decode()


@override_settings(ROOT_URLCONF="tests.tenants.oidc_urls", OIDC_ENABLED=True, OIDC_RP_CLIENT_ID="toolrelay-admin",
                   OIDC_OP_AUTHORIZATION_ENDPOINT="https://idp.example.test/authorize",
                   OIDC_OP_TOKEN_ENDPOINT="https://idp.example.test/token")
def test_the_sign_in_page_offers_single_sign_on_back_to_the_keys(client: Client) -> None:
    """With OIDC configured, people sign in through the identity provider and come back to their keys."""
    page = client.get("/account/login/").content.decode()
    assert "Sign in with single sign-on" in page and "next=/account/keys/" in page


def test_a_wrong_password_is_refused_and_counted(client: Client, dev_a: Membership) -> None:
    """The page uses the admin's throttled login: a wrong password is a form error, not a session."""
    response = client.post("/account/login/", {"username": "dev-a", "password": "wrong"})
    assert response.status_code == 200 and "_auth_user_id" not in client.session
    from axes.models import AccessAttempt

    assert AccessAttempt.objects.filter(username="dev-a").exists()


def test_deleting_the_user_revokes_their_keys(dev_a: Membership) -> None:
    """User deleted -> membership deleted -> keys revoked and kept."""
    key, raw = api_key_create(tenant=dev_a.tenant, name="laptop", member=dev_a)
    dev_a.user.delete()
    key.refresh_from_db()
    assert key.revoked_at is not None and key.member_id is None
