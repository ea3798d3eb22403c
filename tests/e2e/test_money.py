"""Money through the running proxy (issue 19 Acceptance), over real sockets with the openai SDK.

A price of $1 input / $2 output per million tokens on ``*``, a simulator that reports 11 prompt and 7
completion tokens per answer, a daily tenant budget of $0.0001 held by two Daphne processes on one
private Redis: the first requests succeed, then every request gets 429 ``insufficient_quota`` with the
reset time; ``manage.py usage --json`` shows 25 micro-dollars per delivered request, and a request
retried once shows wasted money.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from django.core.management import call_command

from tests.e2e.conftest import TenantFixture, running_proxy
from tests.e2e.test_limits import private_redis  # noqa: F401 - the fixture

MODEL = "gen:text=1:calls=0:frames=3:frame=10:corrupt=0:usage=11/7"
RETRIED = "gen:calls=1:broken=1:kinds=mid-stream-error-chunk:usage=11/7"
MESSAGES = [{"role": "user", "content": "hello"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
EACH = 25e-6  # 11 * $1 + 7 * $2 per million

_CLIENTS: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _clients_closed() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def _client(tenant: TenantFixture, base_url: str) -> openai.OpenAI:
    client = openai.OpenAI(base_url=base_url, api_key=tenant.api_key, max_retries=0, timeout=30)
    _CLIENTS.append(client)
    return client


def _next_midnight() -> str:
    from datetime import UTC, datetime, timedelta

    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (today + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _usage(django_db_blocker: Any, tenant: TenantFixture) -> dict[str, Any]:
    out = io.StringIO()
    with django_db_blocker.unblock():
        call_command("usage", "--tenant", tenant.tenant.slug, "--json", stdout=out)
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


def test_acceptance_price_budget_two_processes_usage(
        e2e_database_url: str, tmp_path: Path, make_tenant: Callable[..., TenantFixture],
        private_redis: tuple[str, subprocess.Popen[bytes]], django_db_blocker: Any,  # noqa: F811
        audit_rows: Any) -> None:
    from billing.models import ModelPrice
    from tenants.services import limits_set

    budgeted, free = make_tenant(), make_tenant()
    with django_db_blocker.unblock():
        ModelPrice.objects.create(model="*", input_usd=1, output_usd=2)
        limits_set(tenant=budgeted.tenant, values={"daily_usd": 0.0001})
    env = {"REDIS_URL": private_redis[0], "LIMITS_KEY_PREFIX": f"e2e:{uuid.uuid4().hex}:",
           "LIMITS_REDIS_TIMEOUT_SECONDS": "0.5"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with running_proxy(e2e_database_url, tmp_path / "a" / "serve.log", **env) as one, \
            running_proxy(e2e_database_url, tmp_path / "b" / "serve.log", **env) as two:
        outcomes: list[str] = []
        for i in range(8):  # alternating processes: one budget in Redis
            server = (one, two)[i % 2]
            try:
                raw = _client(budgeted, server.v1).chat.completions.with_raw_response.create(
                    model=MODEL, messages=MESSAGES, max_tokens=7)
            except openai.RateLimitError as exc:
                assert exc.code == "insufficient_quota" and exc.type == "insufficient_quota"
                assert exc.response.headers["x-should-retry"] == "false"
                message = exc.body["message"] if isinstance(exc.body, dict) else str(exc)
                assert "daily budget is $0.0001 per day (UTC)" in message
                assert f"resets at {_next_midnight()}" in message  # the reset time: the next UTC midnight
                outcomes.append("refused")
                continue
            audit_rows(raw.headers["x-request-id"])
            outcomes.append("served")
        served = outcomes.count("served")
        assert 3 <= served <= 4, outcomes  # the 4th brings it to exactly $0.0001; none goes past it
        assert outcomes == ["served"] * served + ["refused"] * (8 - served)

        with _client(free, one.v1).chat.completions.with_streaming_response.create(
                model=RETRIED, messages=MESSAGES, tools=TOOLS, stream=True) as retried:
            assert "get_weather" in "".join(retried.iter_lines())
            row = audit_rows(retried.headers["x-request-id"])
        assert row.attempts == 2

    spent = _usage(django_db_blocker, budgeted)
    assert spent["requests"] == served and spent["unpriced_requests"] == 0 and spent["estimated_requests"] == 0
    assert spent["cost_usd"] == pytest.approx(served * EACH, rel=0.01)
    assert spent["delivered_usd"] == pytest.approx(served * EACH, rel=0.01) and spent["wasted_usd"] == 0
    assert spent["by_model"] == [{"model": MODEL, "requests": served, "cost_usd": pytest.approx(served * EACH,
                                                                                                rel=0.01),
                                  "wasted_usd": 0.0}]
    wasted = _usage(django_db_blocker, free)
    assert wasted["requests"] == 1 and wasted["wasted_usd"] > 0
    assert wasted["delivered_usd"] == pytest.approx(EACH, rel=0.01)
    assert wasted["cost_usd"] == pytest.approx(wasted["delivered_usd"] + wasted["wasted_usd"])


def _browser_form(browser: Any, path: str, data: dict[str, Any]) -> Any:
    """GET ``path`` (following redirects) and POST ``data`` with the page's CSRF token, as a browser would."""
    from tests.e2e.test_people import CSRF

    page = browser.get(path, follow_redirects=True)
    token = CSRF.search(page.text)
    assert token, page.text[:500]
    return browser.post(str(page.url), data={**data, "csrfmiddlewaretoken": token.group(1)})


def test_a_members_self_service_key_is_held_by_the_members_budget_and_hidden_from_other_tenants(
        e2e_database_url: str, tmp_path: Path, make_tenant: Callable[..., TenantFixture], django_db_blocker: Any,
        settings: Any, audit_rows: Any) -> None:
    """The Acceptance's last sentence, as people would do it: the tenant's admin adds a person with a daily
    budget of two answers (``POST /api/v1/members``), the person sets a password on the invitation link,
    signs in and makes a key on ``/account/keys/``; that key is refused once the member's budget is spent
    (the tenant's has room) with "your personal daily budget"; ``usage --member`` shows that member's spend
    only. The admin of another tenant sees neither the person nor the key (REST API and admin pages)."""
    import httpx
    from django.contrib.auth.models import User
    from django.test import Client

    from api.tokens import admin_token_create
    from billing.models import ModelPrice
    from tenants.models import ApiKey, Membership
    from tenants.services import limits_set
    from tests.e2e.test_people import KEY, PASSWORD, _post

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    tenant, other = make_tenant(), make_tenant()
    with django_db_blocker.unblock():
        ModelPrice.objects.create(model="*", input_usd=1, output_usd=2)
        limits_set(tenant=tenant.tenant, values={"daily_usd": 1})
        mine, theirs = (admin_token_create(tenant=t.tenant)[1] for t in (tenant, other))
        outsider = User.objects.create_user(f"admin-{other.tenant.slug}", password=PASSWORD, is_staff=True)
        Membership.objects.create(user=outsider, tenant=other.tenant, role=Membership.ADMIN)
    username = f"dev-{tenant.tenant.slug}"
    with running_proxy(e2e_database_url, tmp_path / "serve.log") as server, \
            httpx.Client(base_url=server.url, timeout=30) as browser:
        added = browser.post("/api/v1/members", headers={"Authorization": f"Bearer {mine}"}, json={
            "username": username, "max_keys": 1, "allowed_models": ["gen:text=*"],
            "limits": {"daily_usd": 0.00005}})  # two answers' worth
        assert added.status_code == 201, added.text
        invite = added.json()["invite_url"]
        assert invite.startswith(server.url)
        assert _browser_form(browser, invite, {"new_password1": PASSWORD, "new_password2": PASSWORD}
                             ).status_code == 302
        assert added.json()["username"] == f"{username}@{tenant.tenant.slug}"  # the tenant's own namespace
        username = added.json()["username"]
        assert _browser_form(browser, "/account/login/", {"username": username, "password": PASSWORD}
                             ).status_code == 302
        assert _post(browser, "/account/keys/create/", {"membership": added.json()["id"], "name": "laptop"}
                     ).status_code == 302
        found = KEY.search(browser.get("/account/keys/").text)
        assert found
        own = TenantFixture(tenant.tenant, found.group(1), server.v1, tenant.upstream)
        outcomes = []
        for _ in range(4):
            try:
                raw = _client(own, server.v1).chat.completions.with_raw_response.create(
                    model=MODEL, messages=MESSAGES, max_tokens=7)
                audit_rows(raw.headers["x-request-id"])
                outcomes.append("served")
            except openai.RateLimitError as exc:
                assert exc.code == "insufficient_quota" and "your personal daily budget" in str(exc.body)
                assert exc.response.headers["x-should-retry"] == "false"
                outcomes.append("refused")
        assert outcomes[0] == "served" and outcomes[-1] == "refused"
        assert outcomes == ["served"] * outcomes.count("served") + ["refused"] * outcomes.count("refused")
        assert tenant.api_key and _client(tenant, server.v1).chat.completions.create(  # the tenant's key: served
            model=MODEL, messages=MESSAGES, max_tokens=7).choices

        foreign = {"Authorization": f"Bearer {theirs}"}  # the other tenant's admin, over the same API
        with django_db_blocker.unblock():
            key = ApiKey.objects.get(prefix=found.group(1).split("-")[1])
        assert username not in browser.get("/api/v1/members", headers=foreign).text
        assert key.prefix not in browser.get("/api/v1/keys?revoked=true", headers=foreign).text
        assert browser.post(f"/api/v1/keys/{key.pk}/revoke", headers=foreign).status_code == 404
        assert browser.put(f"/api/v1/budgets/members/{username}", headers=foreign,
                           json={"daily_usd": 9}).status_code == 404
        assert browser.get(f"/api/v1/keys?member={username}", headers=foreign).status_code == 404
    with django_db_blocker.unblock():
        assert ApiKey.objects.get(pk=key.pk).revoked_at is None
        admin_pages = Client()  # and in the admin: B's admin gets what a missing row gets
        admin_pages.force_login(outsider)
        assert admin_pages.get(f"/admin/tenants/apikey/{key.pk}/change/").status_code in (302, 404)
        assert key.prefix not in admin_pages.get("/admin/tenants/apikey/").content.decode()
        assert username not in admin_pages.get("/admin/tenants/membership/").content.decode()
        member_pk = Membership.objects.get(user__username=username).pk
        assert admin_pages.get(f"/admin/tenants/membership/{member_pk}/change/").status_code in (302, 404)
    out = io.StringIO()
    with django_db_blocker.unblock():
        call_command("usage", "--tenant", tenant.tenant.slug, "--member", username, "--json", stdout=out)
    spent = json.loads(out.getvalue())
    assert spent["requests"] == outcomes.count("served")
    assert spent["cost_usd"] == pytest.approx(outcomes.count("served") * EACH, rel=0.01)
    assert spent["by_member"] == [{"member": username, "requests": spent["requests"],
                                   "cost_usd": spent["cost_usd"], "wasted_usd": 0.0}]
    assert _usage(django_db_blocker, tenant)["requests"] == spent["requests"] + 1


def test_a_budget_past_its_soft_threshold_fires_the_tenants_webhook_and_an_incident_once(
        make_tenant: Callable[..., TenantFixture], e2e_database_url: str, tmp_path: Path,
        request: pytest.FixtureRequest, django_db_blocker: Any, settings: Any, audit_rows: Any) -> None:
    """Issue 19 item 4's soft threshold, set per budget (``limits set --soft-percent 50``): the request that
    takes the tenant's daily budget past half of it carries a ``money-budget-threshold`` finding, the live
    feed shows a ``money-budget`` incident, and the alert evaluation posts once to the tenant's webhook (a
    real HTTP receiver on loopback, the signed body checked); the next requests and evaluations add none."""
    import http.server
    import threading

    from alerts.models import AlertDelivery, AlertWebhook
    from alerts.tasks import alerts_evaluate
    from audit.models import Finding
    from billing.models import ModelPrice
    from infra import webhook
    from tests.alerts.test_alerts import SECRET, Receiver, _encrypt, settled
    from tests.e2e.test_incident_feed import PATH, WebSocket, _admin_cookie

    Receiver.answers, Receiver.seen = [], []
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    tenant = make_tenant()
    with django_db_blocker.unblock():
        ModelPrice.objects.create(model="*", input_usd=1, output_usd=2)
        call_command("limits", "set", "--tenant", tenant.tenant.slug, "--daily-usd", "0.0001",
                     "--soft-percent", "50", stdout=io.StringIO())
        hook = AlertWebhook(tenant=tenant.tenant, name="ops", url=f"http://127.0.0.1:{receiver.server_address[1]}/a",
                            format="generic")
        hook.secret_encrypted = _encrypt(SECRET)
        hook.full_clean()
        hook.save()
    # A server of its own: the shared one read its price map before this test's price existed (it
    # refreshes every BILLING_REFRESH_SECONDS), so its requests would be unpriced.
    stack = contextlib.ExitStack()
    request.addfinalizer(stack.close)
    proxy_server = stack.enter_context(running_proxy(e2e_database_url, tmp_path / "serve.log"))
    feed = WebSocket(proxy_server.port, PATH, cookie=_admin_cookie(django_db_blocker), origin=proxy_server.url)
    try:
        assert feed.status == 101
        ids = []
        for _ in range(3):  # 25 micro-dollars each (and a reservation in flight): past 50% within three
            raw = _client(tenant, proxy_server.v1).chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=7)
            ids.append(raw.headers["x-request-id"])
            audit_rows(ids[-1])
        while True:
            opcode, payload = feed.frame()
            item = json.loads(payload)["incident"]
            if item["kind"] == "money-budget" and item["tenant_id"] == tenant.tenant.pk:
                break
    finally:
        feed.close()
    assert "the tenant's daily budget passed 50%" in item["detail"] and item["request_id"] in ids
    with django_db_blocker.unblock():
        found = list(Finding.objects.filter(request_id__in=ids, kind="money-budget-threshold"))
        assert len(found) == 1 and str(found[0].request_id) == item["request_id"]
        created = [pk for pk in alerts_evaluate() if AlertDelivery.objects.get(pk=pk).webhook_id == hook.pk]
        assert len(created) == 1 and settled(created[0]).status == "delivered"
        assert not AlertDelivery.objects.filter(pk__in=alerts_evaluate(), webhook=hook).exists()  # once per window
    try:
        ((head, body),) = Receiver.seen
        alert = json.loads(body)
        assert alert["rule"] == "money-budget" and alert["subject"] == "the tenant's daily budget"
        assert "passed 50%" in alert["summary"] and webhook.verify(SECRET, body, head["X-Toolrelay-Signature"])
    finally:
        receiver.shutdown()
        receiver.server_close()
