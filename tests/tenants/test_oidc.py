"""Single sign-on (issue 24 item 7): matched on a stored subject, ``email_verified`` required, never a
superuser, never a stand-in for a superuser's second factor (``tenants.oidc``, ``tenants.admin_site``).

The identity provider is the seam: ``get_userinfo`` returns the claims it would (the state, nonce and
token checks of mozilla-django-oidc are its own and were found to hold)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings
from django_otp.plugins.otp_totp.models import TOTPDevice

from tenants.models import OidcIdentity
from tenants.oidc import ToolrelayOIDCBackend
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

OIDC = "tenants.oidc.ToolrelayOIDCBackend"
BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend", OIDC,
            "mozilla_django_oidc.auth.OIDCAuthenticationBackend"]


def _signed_in(claims: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    backend = ToolrelayOIDCBackend()
    monkeypatch.setattr(backend, "get_userinfo", lambda *args: claims)
    try:
        return backend.get_or_create_user("access", "id", {})
    except Exception as exc:  # noqa: BLE001 - authenticate() turns SuspiciousOperation into no login
        return exc


@pytest.fixture
def root(world_a: TenantWorld) -> User:
    return User.objects.create_superuser(username="root", email="root@example.test", password="pw")


def test_an_unverified_email_of_the_superuser_signs_nobody_in(root: User, monkeypatch: pytest.MonkeyPatch) -> None:
    """The review: an identity-provider user with an unverified root@ address landed in the admin as root."""
    for verified in (None, False, "true"):
        claims = {"sub": "idp-attacker", "email": "root@example.test", "email_verified": verified}
        assert not isinstance(_signed_in(claims, monkeypatch), User)
    assert User.objects.count() == 1


def test_a_verified_email_is_not_an_identity(root: User, monkeypatch: pytest.MonkeyPatch) -> None:
    user = _signed_in({"sub": "idp-other", "email": "root@example.test", "email_verified": True}, monkeypatch)
    assert isinstance(user, User) and user.pk != root.pk
    assert not user.is_staff and not user.is_superuser and user.oidc_identity.subject == "idp-other"
    again = _signed_in({"sub": "idp-other", "email": "new@example.test", "email_verified": True}, monkeypatch)
    assert again.pk == user.pk, "matched on the stored subject, whatever the e-mail says"


def test_a_linked_staff_user_signs_in_and_a_superuser_never(root: User, admin_a: User,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    call_command("oidc_link", "--user", admin_a.username, "--subject", "idp-admin-a")
    user = _signed_in({"sub": "idp-admin-a", "email": "x@example.test", "email_verified": True}, monkeypatch)
    assert isinstance(user, User) and user.pk == admin_a.pk
    with pytest.raises(CommandError, match="superusers never sign in"):
        call_command("oidc_link", "--user", "root", "--subject", "idp-root")
    OidcIdentity.objects.create(user=root, subject="idp-root")  # linked before it became a superuser
    assert _signed_in({"sub": "idp-root", "email": "root@example.test", "email_verified": True},
                      monkeypatch) is None


@override_settings(AUTHENTICATION_BACKENDS=BACKENDS)
@pytest.mark.parametrize("backend", [OIDC, "mozilla_django_oidc.auth.OIDCAuthenticationBackend"])
def test_a_single_sign_on_session_never_stands_in_for_a_superusers_second_factor(root: User, backend: str) -> None:
    TOTPDevice.objects.create(user=root, name="phone", confirmed=True)
    client = Client()
    client.force_login(root, backend=backend)
    response = client.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


@override_settings(AUTHENTICATION_BACKENDS=BACKENDS)
def test_a_staff_users_single_sign_on_session_is_let_in(admin_a: User) -> None:
    TOTPDevice.objects.create(user=admin_a, name="phone", confirmed=True)
    client = Client()
    client.force_login(admin_a, backend=OIDC)
    assert client.get("/admin/").status_code == 200
