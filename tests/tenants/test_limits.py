"""Limits of tenants and keys: ``manage.py limits``, ``limits_set``, the principal, and the revocation broadcast."""

from __future__ import annotations

import asyncio
import json
from io import StringIO
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

from infra.shared_state import MemoryState, reset_state
from tenants import last_good, revocation
from tenants.auth import KeyRefused, authorize, principal_for_key
from tenants.key_cache import key_cache
from tenants.limits import Limits
from tenants.models import ApiKey
from tenants.services import api_key_create, api_key_revoke, limits_set
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def _show(tenant: str) -> dict[str, Any]:
    return json.loads(_run("limits", "show", "--tenant", tenant, "--json"))  # type: ignore[no-any-return]


def test_it_sets_and_shows_limits_by_tenant_name_or_slug(world_a: TenantWorld) -> None:
    _run("limits", "set", "--tenant", "Tenant A", "--rpm", "100", "--tpm", "50000", "--daily-tokens", "0")
    prefix = f"tr-{world_a.api_key.prefix}"
    out = _run("limits", "set", "--tenant", "tenant-a", "--key", prefix, "--rpm", "10", "--concurrency", "2")
    assert out.startswith(f"Limits of key {prefix}: rpm=10, tpm=none, concurrency=2")
    money = {"daily_usd": None, "weekly_usd": None, "monthly_usd": None, "money_soft_percent": None,
             "daily_usd_soft_percent": None, "weekly_usd_soft_percent": None, "monthly_usd_soft_percent": None}
    assert _show("tenant-a") == {
        "tenant": "Tenant A",
        "limits": {"rpm": 100, "tpm": 50000, "concurrency": None, "daily_tokens": 0, "monthly_tokens": None,
                   **money},
        "keys": [{"key": prefix, "limits": {"rpm": 10, "tpm": None, "concurrency": 2, "daily_tokens": None,
                                            "monthly_tokens": None, **money}}],
        "members": [],
    }


def test_money_budgets_on_tenant_key_and_member(world_a: TenantWorld) -> None:
    from django.contrib.auth.models import User

    from tenants.models import Membership

    user = User.objects.create_user("dev1")
    Membership.objects.create(user=user, tenant=world_a.tenant)
    _run("limits", "set", "--tenant", "tenant-a", "--daily-usd", "10", "--weekly-usd", "50", "--monthly-usd", "150")
    prefix = f"tr-{world_a.api_key.prefix}"
    _run("limits", "set", "--tenant", "tenant-a", "--key", prefix, "--daily-usd", "2.5")
    out = _run("limits", "set", "--tenant", "tenant-a", "--member", "dev1", "--daily-usd", "1", "--monthly-usd", "20")
    assert out.startswith("Limits of member dev1: rpm=none")
    assert "daily_usd=1.0, weekly_usd=none, monthly_usd=20.0, money_soft_percent=none" in out
    assert "money_soft_percent=90" in _run("limits", "set", "--tenant", "tenant-a", "--soft-percent", "90")
    assert _show("tenant-a")["limits"]["money_soft_percent"] == 90
    for bad in ("0", "101", "half"):
        with pytest.raises(CommandError):
            _run("limits", "set", "--tenant", "tenant-a", "--soft-percent", bad)
    _run("limits", "set", "--tenant", "tenant-a", "--money-soft-percent", "none")
    shown = _show("tenant-a")
    assert shown["limits"]["daily_usd"] == 10.0 and shown["limits"]["weekly_usd"] == 50.0
    assert shown["keys"][0]["limits"]["daily_usd"] == 2.5
    assert shown["members"] == [{"member": "dev1", "limits": {"rpm": None, "tpm": None, "concurrency": None,
                                                              "daily_tokens": None, "monthly_tokens": None,
                                                              "daily_usd": 1.0, "weekly_usd": None,
                                                              "monthly_usd": 20.0, "money_soft_percent": None,
                                                              "daily_usd_soft_percent": None,
                                                              "weekly_usd_soft_percent": None,
                                                              "monthly_usd_soft_percent": None}}]
    with pytest.raises(CommandError, match="(?i)above the tenant"):
        _run("limits", "set", "--tenant", "tenant-a", "--member", "dev1", "--daily-usd", "11")
    with pytest.raises(CommandError, match="not a member"):
        _run("limits", "set", "--tenant", "tenant-a", "--member", "nobody", "--daily-usd", "1")
    _run("limits", "set", "--tenant", "tenant-a", "--daily-usd", "none")
    assert _show("tenant-a")["limits"]["daily_usd"] is None


def test_none_removes_a_limit_and_other_limits_stay(world_a: TenantWorld) -> None:
    _run("limits", "set", "--tenant", "tenant-a", "--rpm", "5", "--tpm", "7")
    _run("limits", "set", "--tenant", "tenant-a", "--rpm", "none")
    assert _show("tenant-a")["limits"]["rpm"] is None and _show("tenant-a")["limits"]["tpm"] == 7


def test_a_key_limit_above_its_tenants_is_refused(world_a: TenantWorld) -> None:
    _run("limits", "set", "--tenant", "tenant-a", "--rpm", "10")
    with pytest.raises(CommandError, match="--rpm: Above the tenant's limit"):
        _run("limits", "set", "--tenant", "tenant-a", "--key", world_a.api_key.prefix, "--rpm", "11")
    assert ApiKey.objects.get(pk=world_a.api_key.pk).rpm is None
    _run("limits", "set", "--tenant", "tenant-a", "--key", world_a.api_key.prefix, "--rpm", "10")  # equal is fine


@pytest.mark.parametrize("args", [("--rpm", "-1"), ("--rpm", "lots"), ()])
def test_it_refuses_bad_values_and_nothing_to_set(world_a: TenantWorld, args: tuple[str, ...]) -> None:
    with pytest.raises(CommandError):
        _run("limits", "set", "--tenant", "tenant-a", *args)


def test_another_tenants_key_is_not_found(world_a: TenantWorld, world_b: TenantWorld) -> None:
    with pytest.raises(CommandError, match="has no API key"):
        _run("limits", "set", "--tenant", "tenant-a", "--key", world_b.api_key.prefix, "--rpm", "1")


def test_limits_set_refuses_unknown_names_and_foreign_keys(world_a: TenantWorld, world_b: TenantWorld) -> None:
    with pytest.raises(ValidationError):
        limits_set(tenant=world_a.tenant, values={"rpd": 1})
    with pytest.raises(ValidationError):
        limits_set(tenant=world_a.tenant, key=world_b.api_key, values={"rpm": 1})


def test_the_principal_carries_the_limits_and_last_good_keeps_them(world_a: TenantWorld) -> None:
    limits_set(tenant=world_a.tenant, values={"rpm": 60, "monthly_tokens": 10**10})
    limits_set(tenant=world_a.tenant, key=world_a.api_key, values={"concurrency": 3})
    principal = principal_for_key(world_a.raw_key)
    assert principal is not None
    assert principal.limits == Limits(rpm=60, monthly_tokens=10**10)
    assert principal.key_limits == Limits(concurrency=3)
    again = last_good.loads(last_good.dumps(principal))
    assert again == principal


def test_an_old_last_good_principal_without_limits_still_loads(world_a: TenantWorld) -> None:
    principal = principal_for_key(world_a.raw_key)
    data = json.loads(last_good.dumps(principal))
    del data["limits"], data["key_limits"]
    assert last_good.loads(json.dumps(data)).limits == Limits()


async def _in_thread(function: Any, **kwargs: Any) -> Any:
    """``function(**kwargs)`` in a thread whose database connection is closed afterwards (the test database
    is dropped at the end)."""
    def run() -> Any:
        try:
            return function(**kwargs)
        finally:
            connections.close_all()
    return await asyncio.to_thread(run)


@pytest.fixture
def memory_state() -> Any:
    state = MemoryState()
    reset_state(state)
    yield state
    reset_state(None)


@pytest.mark.django_db(transaction=True)  # the auth threads read what the test wrote
async def test_a_revocation_drops_the_cached_key_at_once(world_a: TenantWorld, memory_state: MemoryState,
                                                         settings: Any) -> None:
    settings.AUTH_CACHE_SECONDS = 3600.0  # without the broadcast the cached key would live an hour
    assert (await authorize(world_a.raw_key)).api_key_id == world_a.api_key.pk
    await _in_thread(api_key_revoke, key=world_a.api_key)
    assert key_cache.get(ApiKey.compute_digest(world_a.raw_key)) == (False, None)
    with pytest.raises(KeyRefused):
        await authorize(world_a.raw_key)


@pytest.mark.django_db(transaction=True)
async def test_a_tenant_change_drops_its_principals(world_a: TenantWorld, memory_state: MemoryState,
                                                    settings: Any) -> None:
    settings.AUTH_CACHE_SECONDS = 3600.0
    _, raw = await _in_thread(api_key_create, tenant=world_a.tenant, name="second")
    await authorize(world_a.raw_key)
    await authorize(raw)
    revocation.listen()
    await _in_thread(limits_set, tenant=world_a.tenant, values={"rpm": 1})
    assert key_cache.get(ApiKey.compute_digest(raw))[0] is False
    assert (await authorize(raw)).limits.rpm == 1


# ----- admin -----

def test_the_admin_sets_limits_and_refuses_a_key_limit_above_its_tenants(login: Any, admin_a: Any, superuser: Any,
                                                                         world_a: TenantWorld) -> None:
    """Superusers set a tenant's limits, its admins only see them; a tenant admin sets its keys' limits, and
    one above the tenant's is a form error."""
    from django.urls import reverse

    client = login(superuser)
    tenant_url = reverse("admin:tenants_tenant_change", args=[world_a.tenant.pk])
    form = {"name": world_a.tenant.name, "slug": world_a.tenant.slug, "active": "on",
            "default_upstream": world_a.upstream.pk, "api_keys-TOTAL_FORMS": "0", "api_keys-INITIAL_FORMS": "0",
            "allowed_repairs": ["inherit"], "rpm": "20", "tpm": "", "concurrency": "4", "daily_tokens": "",
            "monthly_tokens": "0", "_save": "Save"}
    assert "tokens per month" in client.get(tenant_url).content.decode().lower()
    assert client.post(tenant_url, form).status_code == 302
    world_a.tenant.refresh_from_db()
    assert world_a.tenant.limits() == Limits(rpm=20, concurrency=4, monthly_tokens=0)
    client = login(admin_a)
    assert client.post(tenant_url, {**form, "rpm": "100000"}).status_code == 302
    world_a.tenant.refresh_from_db()
    assert world_a.tenant.rpm == 20  # read-only for the tenant's own admins
    key_url = reverse("admin:tenants_apikey_change", args=[world_a.api_key.pk])
    key_form = {"name": world_a.api_key.name, "expires": "", "rpm": "21", "_save": "Save"}
    refused = client.post(key_url, key_form)
    assert refused.status_code == 200 and "Above the tenant&#x27;s limit (20)." in refused.content.decode()
    assert client.post(key_url, {**key_form, "rpm": "5"}).status_code == 302
    assert ApiKey.objects.get(pk=world_a.api_key.pk).limits() == Limits(rpm=5)


def test_soft_threshold_per_budget_window(world_a: TenantWorld) -> None:
    """``--soft-percent daily=P`` (weekly, monthly) sets one budget's own threshold beside the holder's
    ``--soft-percent P``, the default of the budgets without their own; ``none`` removes either."""
    from django.contrib.auth.models import User

    from tenants.models import Membership

    Membership.objects.create(user=User.objects.create_user("dev2"), tenant=world_a.tenant)
    out = _run("limits", "set", "--tenant", "tenant-a", "--soft-percent", "70", "--soft-percent", "daily=90",
               "--soft-percent", "monthly_usd=50")
    assert "money_soft_percent=70, daily_usd_soft_percent=90, weekly_usd_soft_percent=none, " \
           "monthly_usd_soft_percent=50" in out
    tenant = world_a.tenant.__class__.objects.get(pk=world_a.tenant.pk).limits()
    assert [tenant.soft_percent(n) for n in ("daily_usd", "weekly_usd", "monthly_usd")] == [90, 70, 50]
    _run("limits", "set", "--tenant", "tenant-a", "--member", "dev2", "--soft-percent", "weekly=95")
    assert _show("tenant-a")["members"][0]["limits"]["weekly_usd_soft_percent"] == 95
    _run("limits", "set", "--tenant", "tenant-a", "--soft-percent", "daily=none")
    assert _show("tenant-a")["limits"]["daily_usd_soft_percent"] is None
    assert _show("tenant-a")["limits"]["money_soft_percent"] == 70  # the others stay
    for bad in ("hourly=50", "daily=0", "daily=101", "daily="):
        with pytest.raises(CommandError):
            _run("limits", "set", "--tenant", "tenant-a", "--soft-percent", bad)
