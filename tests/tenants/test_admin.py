"""Admin: secrets never rendered, a new key shown once, and tenant scoping for every persona."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.test import Client
from django.urls import reverse

from tenants.auth import principal_for_key
from tenants.models import ApiKey, Membership, ModelRoute, Tenant, Upstream
from tests.conftest import CREDENTIAL_A, CREDENTIAL_B, HEADER_SECRET_A, TenantWorld

pytestmark = pytest.mark.django_db

Login = Callable[[User], Client]
RAW_KEY = re.compile(r"tr-[a-z0-9]{12}-[A-Za-z0-9_-]{43}")
MISSING = 987654321


def _url(model: str, view: str, *args: Any) -> str:
    return reverse(f"admin:tenants_{model}_{view}", args=args)


def _html(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


# ----- secrets -----

@pytest.mark.parametrize("persona", ["superuser", "admin_a", "viewer_a"])
def test_it_never_renders_the_credential(request: pytest.FixtureRequest, login: Login, persona: str,
                                         world_a: TenantWorld) -> None:
    """Upstream list and change pages show the masked hint, never the credential, headers or ciphertext."""
    client = login(request.getfixturevalue(persona))
    ciphertext = Upstream.objects.get(pk=world_a.upstream.pk).credential_encrypted
    urls = (_url("upstream", "changelist"), _url("upstream", "change", world_a.upstream.pk),
            _url("tenant", "change", world_a.tenant.pk), _url("modelroute", "change", world_a.route.pk))
    pages = [_html(client, url) for url in urls]
    for html in pages:
        assert CREDENTIAL_A not in html and HEADER_SECRET_A not in html and ciphertext not in html
    assert "sk-…3f9a" in pages[0] and "sk-…3f9a" in pages[1]


def test_it_keeps_a_credential_written_through_the_admin_out_of_every_page(login: Login, admin_a: User,
                                                                           world_a: TenantWorld) -> None:
    """Setting a credential stores it encrypted; the page after saving, the history and the form never echo it."""
    client = login(admin_a)
    change = _url("upstream", "change", world_a.upstream.pk)
    response = client.post(change, {**_upstream_form(world_a), "new_credential": "sk-typed-in-admin-81c4"},
                           follow=True)
    assert response.status_code == 200
    assert Upstream.objects.get(pk=world_a.upstream.pk).credential() == "sk-typed-in-admin-81c4"
    for html in (response.content.decode(), _html(client, change), _html(client, _url("upstream", "history",
                                                                                            world_a.upstream.pk))):
        assert "sk-typed-in-admin-81c4" not in html
    assert "sk-…81c4" in _html(client, change)


def test_it_asks_for_the_secrets_again_when_the_upstream_moves_to_another_host(login: Login, admin_a: User,
                                                                                world_a: TenantWorld) -> None:
    """Stored secrets are bound to their host: a new host with blank secret fields is refused, so an
    upstream's editor cannot send its credential elsewhere; re-entering them is accepted."""
    client = login(admin_a)
    change = _url("upstream", "change", world_a.upstream.pk)
    moved = {**_upstream_form(world_a), "base_url": "https://attacker.example/v1"}
    refused = client.post(change, moved)
    assert refused.status_code == 200 and "The host changed" in refused.content.decode()
    assert Upstream.objects.get(pk=world_a.upstream.pk).base_url == world_a.upstream.base_url
    client.post(change, {**moved, "new_credential": "sk-new-host-1234", "clear_extra_headers": "on"})
    saved = Upstream.objects.get(pk=world_a.upstream.pk)
    assert saved.base_url == "https://attacker.example/v1" and saved.credential() == "sk-new-host-1234"
    same_host = {**_upstream_form(world_a), "base_url": "https://attacker.example/v2", "idle_timeout": "31"}
    client.post(change, same_host)
    assert Upstream.objects.get(pk=world_a.upstream.pk).idle_timeout == 31, "a new path on the same host is fine"


def test_it_keeps_the_stored_secrets_when_the_fields_are_blank(login: Login, admin_a: User,
                                                               world_a: TenantWorld) -> None:
    """Blank write-only fields keep credential and headers; the clear boxes remove them."""
    client = login(admin_a)
    change = _url("upstream", "change", world_a.upstream.pk)
    client.post(change, {**_upstream_form(world_a), "idle_timeout": "33"})
    kept = Upstream.objects.get(pk=world_a.upstream.pk)
    assert kept.idle_timeout == 33 and kept.credential() == CREDENTIAL_A and kept.extra_headers()
    client.post(change, {**_upstream_form(world_a), "clear_credential": "on", "clear_extra_headers": "on"})
    cleared = Upstream.objects.get(pk=world_a.upstream.pk)
    assert cleared.credential() == "" and cleared.extra_headers() == {} and cleared.credential_display == ""


def test_it_rejects_extra_headers_that_are_not_a_json_object_without_echoing_them(login: Login, admin_a: User,
                                                                                  world_a: TenantWorld) -> None:
    """Invalid headers are refused, and the refused input is not rendered back."""
    client = login(admin_a)
    response = client.post(_url("upstream", "change", world_a.upstream.pk),
                           {**_upstream_form(world_a), "new_extra_headers": '["typed-secret-ab12"]'})
    assert response.status_code == 200 and "Expected a JSON object" in response.content.decode()
    assert "typed-secret-ab12" not in response.content.decode()


def _upstream_form(world: TenantWorld) -> dict[str, str]:
    up = world.upstream
    return {"name": up.name, "base_url": up.base_url, "enabled": "on", "connect_timeout": str(up.connect_timeout),
            "first_byte_timeout": str(up.first_byte_timeout), "idle_timeout": str(up.idle_timeout), "_save": "Save",
            # the pool keys inline (none changed)
            "credentials-TOTAL_FORMS": "0", "credentials-INITIAL_FORMS": "0"}


def test_it_adds_pool_keys_write_only_and_shows_their_state(login: Login, admin_a: User, world_a: TenantWorld) -> None:
    """Pool keys typed in the admin are stored once, encrypted, never rendered; the page shows each key's state
    and the circuit (from the shared state), and a pool key blocks a host change until removed."""
    from infra.routing_health import KeyState, key_name
    from infra.shared_state import get_state
    from tenants.models import UpstreamCredential

    client = login(admin_a)
    change = _url("upstream", "change", world_a.upstream.pk)
    typed = "sk-pool-typed-in-admin-77aa\nsk-pool-typed-in-admin-88bb\nsk-pool-typed-in-admin-77aa"
    response = client.post(change, {**_upstream_form(world_a), "new_pool_keys": typed}, follow=True)
    assert response.status_code == 200
    rows = list(UpstreamCredential.objects.filter(upstream=world_a.upstream).order_by("pk"))
    assert [r.hint for r in rows] == ["sk-…77aa", "sk-…88bb"]
    asyncio.run(get_state().remember(key_name(world_a.upstream.pk, rows[1].key_id),
                                     KeyState(until=4e9, failed_at=1.0).dumps(), 60))
    html = _html(client, change)
    assert "sk-pool-typed-in-admin" not in html and "sk-…77aa" in html
    assert "circuit: <b>closed</b>" in html and "<b>cooling</b> until 2096" in html
    moved = client.post(change, {**_upstream_form(world_a), "base_url": "https://elsewhere.example/v1",
                                 "new_credential": "sk-new-host-1234", "clear_extra_headers": "on"})
    assert "delete the pool keys first" in moved.content.decode()


# ----- a new key, once -----

def test_it_shows_a_new_key_once_and_never_again(login: Login, admin_a: User, world_a: TenantWorld) -> None:
    """The POST that creates a key redirects to the page that shows it once (with a copy button); a
    reload shows no key and makes no second one; no other page, session row or log entry holds it."""
    client = login(admin_a)
    posted = client.post(_url("apikey", "add"), {"tenant": world_a.tenant.pk, "name": "ci-bot", "expires": ""})
    assert posted.status_code == 302 and not RAW_KEY.search(posted.content.decode())
    response = client.get(posted["Location"])
    assert response.status_code == 200 and 'id="copy-api-key"' in response.content.decode()
    assert "no-store" in response["Cache-Control"]
    reloaded = client.get(posted["Location"]).content.decode()
    assert not RAW_KEY.search(reloaded) and "is not shown again" in reloaded
    assert ApiKey.objects.filter(name="ci-bot").count() == 1
    found = RAW_KEY.findall(response.content.decode())
    assert found and len(set(found)) == 1
    raw = found[0]
    principal = principal_for_key(raw)
    assert principal is not None and principal.tenant_id == world_a.tenant.pk
    key = ApiKey.objects.get(name="ci-bot")
    for url in (_url("apikey", "add"), _url("apikey", "changelist"), _url("apikey", "change", key.pk),
                posted["Location"],
                _url("tenant", "change", world_a.tenant.pk), _url("apikey", "history", key.pk), reverse("admin:index")):
        html = _html(client, url)
        assert raw not in html and raw.split("-", 2)[2] not in html
    assert key.display in _html(client, _url("apikey", "changelist"))
    assert all(raw not in str(session.get_decoded()) for session in Session.objects.all())
    assert all(raw not in str(entry.__dict__) for entry in LogEntry.objects.all())
    assert raw not in str(response.cookies)


def test_it_offers_key_creation_from_the_tenant_page(login: Login, admin_a: User, world_a: TenantWorld) -> None:
    """The tenant page links to the one-time key page with the tenant preselected."""
    html = _html(login(admin_a), _url("tenant", "change", world_a.tenant.pk))
    assert f'{_url("apikey", "add")}?tenant={world_a.tenant.pk}' in html


def test_it_creates_keys_only_for_managed_tenants(login: Login, admin_a: User, world_b: TenantWorld) -> None:
    """Tenant B is not a choice for A's admin: the form is refused and no key is made."""
    response = login(admin_a).post(_url("apikey", "add"), {"tenant": world_b.tenant.pk, "name": "sneaky"})
    assert response.status_code == 200 and not RAW_KEY.search(response.content.decode())
    assert not ApiKey.objects.filter(name="sneaky").exists()


def test_it_revokes_keys_through_the_action(login: Login, admin_a: User, world_a: TenantWorld,
                                            world_b: TenantWorld) -> None:
    """The revoke action revokes the admin's own tenant's key; B's key in the same POST is untouched."""
    login(admin_a).post(_url("apikey", "changelist"),
                        {"action": "revoke", "_selected_action": [world_a.api_key.pk, world_b.api_key.pk]})
    assert ApiKey.objects.get(pk=world_a.api_key.pk).revoked_at is not None
    assert ApiKey.objects.get(pk=world_b.api_key.pk).revoked_at is None
    assert principal_for_key(world_a.raw_key) is None


# ----- scoping -----

def _rows(world: TenantWorld) -> dict[str, int]:
    membership = Membership.objects.filter(tenant=world.tenant).first()
    return {"tenant": world.tenant.pk, "apikey": world.api_key.pk, "upstream": world.upstream.pk,
            "modelroute": world.route.pk, "membership": membership.pk if membership else MISSING}


def _refusal(client: Client, url: str, pk: int) -> tuple[int, str, list[str]]:
    """Status, redirect target and the messages shown after it, with the asked-for pk blanked out."""
    response = client.get(url)
    location = response.get("Location", "")
    texts: list[str] = []
    if location:
        shown = client.get(location)
        texts = [str(message).replace(str(pk), "<pk>") for message in shown.context["messages"]]
    return response.status_code, location, texts


@pytest.mark.parametrize("persona", ["admin_a", "viewer_a"])
@pytest.mark.parametrize("model", ["tenant", "apikey", "upstream", "modelroute", "membership"])
@pytest.mark.parametrize("view", ["change", "history", "delete"])
def test_it_refuses_another_tenants_rows_like_missing_ones(request: pytest.FixtureRequest, login: Login,
                                                           persona: str, model: str, view: str,
                                                           outsider_b: User, world_b: TenantWorld) -> None:
    """Tenant B's row and a missing pk give the same status, redirect and message."""
    client = login(request.getfixturevalue(persona))
    other = _rows(world_b)[model]
    not_yours = _refusal(client, _url(model, view, other), other)
    missing = _refusal(client, _url(model, view, MISSING), MISSING)
    assert not_yours == missing
    assert not_yours[0] in (302, 403)  # 403: the persona may not delete such rows at all


@pytest.mark.parametrize("model, own, other", [
    ("tenant", "Tenant A", "Tenant B"),
    ("apikey", "tenant-a-key", "tenant-b-key"),
    ("upstream", "tenant-a-upstream", "tenant-b-upstream"),
    ("modelroute", "tenant-a-model", "tenant-b-model"),
    ("membership", "viewer-a", "outsider-b"),
])
def test_it_lists_only_the_users_tenants_rows(login: Login, admin_a: User, viewer_a: User, outsider_b: User,
                                               model: str, own: str, other: str, world_b: TenantWorld) -> None:
    """List pages (and their tenant filter, even when asked for B) never show tenant B's rows."""
    client = login(viewer_a)
    html = _html(client, _url(model, "changelist"))
    assert own in html and other not in html and "Tenant B" not in html
    filtered = client.get(_url(model, "changelist"), {"tenant": world_b.tenant.pk})
    assert other not in filtered.content.decode()


def test_it_shows_superusers_every_tenant(login: Login, superuser: User) -> None:
    """Superusers are not scoped."""
    html = _html(login(superuser), _url("upstream", "changelist"))
    assert "tenant-a-upstream" in html and "tenant-b-upstream" in html and CREDENTIAL_B not in html


def test_it_lets_a_viewer_look_but_not_change(login: Login, viewer_a: User, world_a: TenantWorld) -> None:
    """Viewers get read-only pages; writes, adds and deletes are forbidden."""
    client = login(viewer_a)
    html = _html(client, _url("upstream", "change", world_a.upstream.pk))
    assert 'name="_save"' not in html and 'name="new_credential"' not in html
    assert client.post(_url("upstream", "change", world_a.upstream.pk), _upstream_form(world_a)).status_code == 403
    assert client.get(_url("upstream", "add")).status_code == 403
    assert client.get(_url("apikey", "add")).status_code == 403
    assert client.post(_url("apikey", "add"), {"tenant": world_a.tenant.pk, "name": "x"}).status_code == 403
    client.post(_url("apikey", "changelist"), {"action": "revoke", "_selected_action": [world_a.api_key.pk]})
    assert ApiKey.objects.get(pk=world_a.api_key.pk).revoked_at is None


def test_it_limits_foreign_key_choices_to_managed_tenants(login: Login, admin_a: User, world_b: TenantWorld) -> None:
    """Add forms offer only A's tenant and upstreams."""
    client = login(admin_a)
    for model in ("modelroute", "upstream", "apikey"):
        html = _html(client, _url(model, "add"))
        assert "Tenant A" in html and "Tenant B" not in html and "tenant-b-upstream" not in html


def test_it_refuses_a_route_to_another_tenants_upstream(login: Login, superuser: User, world_a: TenantWorld,
                                                        world_b: TenantWorld) -> None:
    """Even a superuser cannot point tenant A's route (or fallback) at tenant B's upstream."""
    management = {f"fallbacks-{name}": value for name, value in
                  (("TOTAL_FORMS", "1"), ("INITIAL_FORMS", "0"), ("MIN_NUM_FORMS", "0"), ("MAX_NUM_FORMS", "1000"))}
    data = {"tenant": world_a.tenant.pk, "public_name": "cross", "upstream": world_b.upstream.pk, **management,
            "fallbacks-0-position": "1", "fallbacks-0-upstream": world_b.upstream.pk, "fallbacks-0-model": ""}
    response = login(superuser).post(_url("modelroute", "add"), data)
    assert response.status_code == 200
    assert response.content.decode().count("Choose an upstream of the route&#x27;s tenant.") == 2
    assert not ModelRoute.objects.filter(public_name="cross").exists()


def test_it_shows_nothing_without_staff_status(login: Login, world_a: TenantWorld) -> None:
    """A non-staff user is sent to the login page; a staff user without membership gets no tenant pages."""
    member = User.objects.create_user(username="member", password="pw")
    Membership.objects.create(user=member, tenant=world_a.tenant, role="admin")
    client = login(member)
    upstream = _url("upstream", "change", world_a.upstream.pk)
    for url in (reverse("admin:index"), _url("upstream", "changelist"), upstream):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
    loner = User.objects.create_user(username="loner", password="pw", is_staff=True)
    client = login(loner)
    assert "Tenants" not in _html(client, reverse("admin:index"))
    assert client.get(_url("upstream", "changelist")).status_code == 403


def test_a_new_key_page_is_only_for_the_keys_tenant(login: Login, admin_a: User, outsider_b: User,
                                                    world_a: TenantWorld) -> None:
    """Another tenant's admin asking for the page of A's new key gets a 404, and the key stays pending
    for nobody else: the session entry belongs to the session that created it."""
    posted = login(admin_a).post(_url("apikey", "add"), {"tenant": world_a.tenant.pk, "name": "mine"})
    other = Client()
    other.force_login(outsider_b)
    assert other.get(posted["Location"]).status_code == 404


@pytest.mark.parametrize("model, tenant_default", [("tenant", True), ("modelroute", False)])
def test_policy_fields_say_what_inherit_means(model: str, tenant_default: bool, login: Login, admin_a: User,
                                              viewer_a: User, world_a: TenantWorld) -> None:
    """Editable: "inherit (default: …)" choices, no "Unknown", no null text box; the tenant's values
    flow into its routes' defaults. View-only: one table in the same words."""
    world_a.tenant.max_retries, world_a.tenant.early_abort = 5, False
    world_a.tenant.save()
    pk = world_a.tenant.pk if model == "tenant" else world_a.route.pk
    html = _html(login(admin_a), _url(model, "change", pk))
    assert "Unknown" not in html and ">null<" not in html and 'value="null"' not in html
    assert "inherit (default: yes)" in html and "inherit (default: all 8 repairs)" in html
    assert "inherit (default: fail)" in html and "inherit (default: offending)" in html
    if not tenant_default:
        assert 'placeholder="inherit (default: 5)"' in html and "inherit (default: no)" in html
    view = _html(login(viewer_a), _url(model, "change", pk))
    assert "Unknown" not in view and "null" not in view.split('id="content"', 1)[1].split("</form>", 1)[0]
    assert "inherit (default: all 8 repairs)" in view


def test_policy_fields_save_inherit_and_explicit_values(login: Login, superuser: User, world_a: TenantWorld) -> None:
    """Posting "inherit" stores None / blank; ticked repairs store a list; none ticked stores []."""
    client = login(superuser)
    base = {"name": world_a.tenant.name, "slug": world_a.tenant.slug, "active": "on",
            "default_upstream": world_a.upstream.pk, "api_keys-TOTAL_FORMS": "0", "api_keys-INITIAL_FORMS": "0",
            "_save": "Save"}
    explicit = {**base, "max_retries": "3", "stream_text": "False", "early_abort": "", "exhaustion": "error",
                "allowed_repairs": ["code-fence", "name-prefix"], "fragment_storage": "attempt", "retention_days": ""}
    assert client.post(_url("tenant", "change", world_a.tenant.pk), explicit).status_code == 302
    tenant = Tenant.objects.get(pk=world_a.tenant.pk)
    assert (tenant.max_retries, tenant.stream_text, tenant.early_abort, tenant.exhaustion) == (3, False, None, "error")
    assert tenant.allowed_repairs == ["code-fence", "name-prefix"] and tenant.fragment_storage == "attempt"
    shown = _html(client, _url("tenant", "change", world_a.tenant.pk))
    assert '<option value="False" selected>no</option>' in shown and '<option value="error" selected>' in shown
    assert re.search(r'value="code-fence"[^>]*checked', shown) and not re.search(r'value="inherit"[^>]*checked', shown)
    inherit = {**base, "max_retries": "", "stream_text": "", "exhaustion": "", "allowed_repairs": ["inherit"],
               "fragment_storage": "", "retention_days": ""}
    assert client.post(_url("tenant", "change", world_a.tenant.pk), inherit).status_code == 302
    tenant = Tenant.objects.get(pk=world_a.tenant.pk)
    assert tenant.policy_overrides() == {}
    assert client.post(_url("tenant", "change", world_a.tenant.pk), base).status_code == 302
    assert Tenant.objects.get(pk=world_a.tenant.pk).allowed_repairs == []
    mixed = {**base, "allowed_repairs": ["inherit", "code-fence"]}
    assert "Untick" in client.post(_url("tenant", "change", world_a.tenant.pk), mixed).content.decode()


def test_loop_breaker_and_retry_budget_fields_save_and_reach_the_policy(login: Login, superuser: User,
                                                                       world_a: TenantWorld) -> None:
    """The loop breaker's thresholds and exempt tools and the retry budget are policy fields like the others: set
    on the tenant, overridden on a route, carried by the principal and by its last-good copy."""
    from tenants import last_good
    from tenants.auth import principal_for_key

    client = login(superuser)
    base = {"name": world_a.tenant.name, "slug": world_a.tenant.slug, "active": "on",
            "default_upstream": world_a.upstream.pk, "api_keys-TOTAL_FORMS": "0", "api_keys-INITIAL_FORMS": "0",
            "_save": "Save"}
    shown = _html(client, _url("tenant", "change", world_a.tenant.pk))
    assert 'placeholder="inherit (default: 4)"' in shown and 'placeholder="inherit (default: 50)"' in shown
    posted = {**base, "loop_breaker": "True", "loop_repeats": "6", "loop_exempt_tools": "poll_ci, job_status poll_ci",
              "retry_budget_percent": "20"}
    assert client.post(_url("tenant", "change", world_a.tenant.pk), posted).status_code == 302
    tenant = Tenant.objects.get(pk=world_a.tenant.pk)
    assert tenant.loop_exempt_tools == ["job_status", "poll_ci"] and tenant.loop_repeats == 6
    policy = tenant.policy()
    assert (policy.loop_breaker, policy.loop_repeats, policy.loop_cycle_repeats, policy.retry_budget_percent) == (
        True, 6, 3, 20)
    assert policy.loop_exempt_tools == frozenset({"job_status", "poll_ci"})
    assert tenant.policy({"loop_breaker": False, "loop_exempt_tools": []}).loop_exempt_tools == frozenset()
    principal = principal_for_key(world_a.raw_key)
    assert principal is not None
    assert last_good.loads(last_good.dumps(principal)).policy == principal.policy == policy
    assert client.post(_url("tenant", "change", world_a.tenant.pk), {**base, "loop_exempt_tools": "-"}).status_code \
        == 302
    assert Tenant.objects.get(pk=world_a.tenant.pk).loop_exempt_tools == []
