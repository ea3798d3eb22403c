"""A person's self-service key over a real Daphne server (issue 19 item 5).

The member signs in on ``/account/login/`` with a password, creates a key on ``/account/keys/`` (forms and
CSRF as a browser would post them), and the openai SDK uses it: the model the tenant admin allowed is
served and audited under the member's name; any other model is a 403 ``model_not_allowed``
(``openai.PermissionDeniedError``, ``anthropic.PermissionDeniedError``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import ProxyServer, TenantFixture

ALLOWED = "gen:text=1:calls=0:frames=3:frame=10:corrupt=0"
PASSWORD = "a-long-enough-password-42"  # noqa: S105 - a test account's
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
KEY = re.compile(r'value="(tr-[a-z0-9]{12}-[A-Za-z0-9_-]{43})"')


def _member(django_db_blocker: Any, tenant: TenantFixture, settings: Any) -> Any:
    from django.contrib.auth.models import User

    from tenants.models import Membership

    # The server checks the password with its own hashers (the tests' MD5 one is not among them).
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    with django_db_blocker.unblock():
        user = User.objects.create_user(username=f"dev-{tenant.tenant.slug}", password=PASSWORD)
        return Membership.objects.create(user=user, tenant=tenant.tenant, role=Membership.MEMBER, max_keys=1,
                                         allowed_models=["gen:text=*"])


def _post(browser: httpx.Client, path: str, data: dict[str, Any]) -> httpx.Response:
    page = browser.get(path if path.endswith("/login/") else "/account/keys/")
    token = CSRF.search(page.text)
    assert token, page.text
    return browser.post(path, data={**data, "csrfmiddlewaretoken": token.group(1)})


def test_a_members_self_service_key_works_for_its_allowed_models_only(
        make_tenant: Callable[..., TenantFixture], proxy_server: ProxyServer, django_db_blocker: Any,
        settings: Any, audit_rows: Callable[..., Any]) -> None:
    tenant = make_tenant()
    member = _member(django_db_blocker, tenant, settings)
    with httpx.Client(base_url=proxy_server.url, timeout=30) as browser:
        signed_in = _post(browser, "/account/login/", {"username": member.user.username, "password": PASSWORD})
        assert signed_in.status_code == 302 and signed_in.headers["location"] == "/account/keys/"
        created = _post(browser, "/account/keys/create/", {"membership": member.pk, "name": "laptop"})
        assert created.status_code == 302, created.text
        found = KEY.search(browser.get("/account/keys/").text)
        assert found
        raw = found.group(1)
        assert raw not in browser.get("/account/keys/").text  # shown once
        refused = _post(browser, "/account/keys/create/", {"membership": member.pk, "name": "second"})
        assert refused.status_code == 400  # max_keys=1

    with openai.OpenAI(base_url=proxy_server.v1, api_key=raw, max_retries=0, timeout=30) as client:
        served = client.chat.completions.with_raw_response.create(
            model=ALLOWED, messages=[{"role": "user", "content": "hello"}])
        assert served.status_code == 200 and served.parse().choices[0].message.content
        with pytest.raises(openai.PermissionDeniedError) as denied:
            client.chat.completions.create(model="other-model", messages=[{"role": "user", "content": "hello"}])
    assert denied.value.status_code == 403 and denied.value.code == "model_not_allowed"
    assert "gen:text=*" in denied.value.message
    with anthropic.Anthropic(base_url=proxy_server.url, api_key=raw, max_retries=0, timeout=30) as claude:
        with pytest.raises(anthropic.PermissionDeniedError) as refused_claude:
            claude.messages.create(model="not-allowed-model", max_tokens=16,
                                   messages=[{"role": "user", "content": "hello"}])
    assert refused_claude.value.status_code == 403
    assert refused_claude.value.body["error"]["type"] == "permission_error"  # type: ignore[index]

    row = audit_rows(served.headers["x-request-id"])
    assert (row.member_id, row.member_username) == (member.pk, member.user.username)
