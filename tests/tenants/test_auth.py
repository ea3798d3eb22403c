"""The proxy path's auth door: an API key -> a frozen, ORM-free ``Principal`` (``tenants.auth``)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from infra.background import drain_background
from tenants.auth import KeyRefused, api_key_authenticate, authorize, principal_for_key
from tenants.key_cache import key_cache
from tenants.models import ModelRoute, Tenant
from tenants.services import api_key_create, api_key_revoke
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_finds_a_key_by_its_raw_value(world_a: TenantWorld) -> None:
    """The raw key authenticates and resolves to its tenant."""
    assert api_key_authenticate(world_a.raw_key) == world_a.api_key
    principal = principal_for_key(world_a.raw_key)
    assert principal is not None and principal.tenant_id == world_a.tenant.pk


def test_it_refuses_a_wrong_secret(world_a: TenantWorld) -> None:
    """Right prefix, wrong secret: refused."""
    prefix = world_a.raw_key.split("-")[1]
    forged = f"tr-{prefix}-{'A' * 43}"
    assert api_key_authenticate(forged) is None
    assert principal_for_key(forged) is None


def test_it_refuses_a_revoked_key(world_a: TenantWorld) -> None:
    """A revoked key is refused."""
    api_key_revoke(key=world_a.api_key)
    assert api_key_authenticate(world_a.raw_key) is None
    assert principal_for_key(world_a.raw_key) is None


def test_it_refuses_an_expired_key(world_a: TenantWorld) -> None:
    """A key past its expiry is refused."""
    _, raw = api_key_create(tenant=world_a.tenant, name="old", expires=timezone.now() - timedelta(minutes=1))
    assert api_key_authenticate(raw) is None
    assert principal_for_key(raw) is None


@pytest.mark.parametrize("raw", ["", "Bearer", "tr-", "tr--x", "sk-abc-def", "tr-nosuchprefix-secret"])
def test_it_refuses_malformed_and_unknown_keys(world_a: TenantWorld, raw: str) -> None:
    """Anything that is not a known key gives None, never an error."""
    assert api_key_authenticate(raw) is None
    assert principal_for_key(raw) is None


def test_it_touches_last_used_when_a_key_authenticates(world_a: TenantWorld) -> None:
    """Authentication records use (throttled by API_KEY_TOUCH_SECONDS)."""
    principal_for_key(world_a.raw_key)
    world_a.api_key.refresh_from_db()
    assert world_a.api_key.last_used is not None


def test_it_never_routes_to_another_tenants_upstream(world_a: TenantWorld, world_b: TenantWorld) -> None:
    """Even a route row that points across tenants (written around the services) is not followed."""
    ModelRoute.objects.create(tenant=world_a.tenant, public_name="stolen", upstream=world_b.upstream)
    principal = principal_for_key(world_a.raw_key)
    assert principal is not None
    plan = principal.resolve("stolen")
    assert plan is not None
    assert {target.upstream_id for target in plan.targets} == {world_a.upstream.pk}


def test_it_resolves_routes_globs_and_the_default_upstream(world_a: TenantWorld) -> None:
    """Exact route first, then the default upstream with the model name unchanged."""
    principal = principal_for_key(world_a.raw_key)
    assert principal is not None
    routed = principal.resolve("tenant-a-model")
    unrouted = principal.resolve("anything-else")
    assert routed is not None and routed.target(0).model == "tenant-a-upstream-model"
    assert unrouted is not None and unrouted.target(0).model == "anything-else"


async def _revoke_silently(world: TenantWorld) -> None:
    """Revoke the world's key in the database only (no broadcast: as a sibling process that missed it)."""
    from django.utils import timezone

    from tenants.models import ApiKey

    await ApiKey.objects.filter(pk=world.api_key.pk).aupdate(revoked_at=timezone.now())


async def test_it_authorizes_from_the_cache_without_the_database(world_a: TenantWorld) -> None:
    """A key answered once is served from the cache: a revocation written behind the services' back (no
    broadcast) is not seen within the cache lifetime (the documented bound); one through
    ``api_key_revoke`` is seen at once (its broadcast drops the cached answer); a malformed key is
    refused at once."""
    principal = await authorize(world_a.raw_key)
    assert principal.tenant_id == world_a.tenant.pk
    await _revoke_silently(world_a)
    assert await authorize(world_a.raw_key) == principal
    await sync_to_async(api_key_revoke)(key=world_a.api_key)
    with pytest.raises(KeyRefused):
        await authorize(world_a.raw_key)
    with pytest.raises(KeyRefused) as refused:
        await authorize("sk-not-ours")
    assert refused.value.reason == "invalid"
    await sync_to_async(connections.close_all)()


async def test_it_refreshes_ahead_once_past_half_the_lifetime(world_a: TenantWorld, settings: Any) -> None:
    """Past half its lifetime a cached key is still served, one background refresh reads the database,
    and a key revoked meanwhile is refused from then on."""
    settings.AUTH_CACHE_SECONDS = 60
    principal = await authorize(world_a.raw_key)
    digest = world_a.api_key.compute_digest(world_a.raw_key)
    key_cache._entries[digest] = (time.monotonic() + 20, principal)  # 40 of 60 s gone
    await _revoke_silently(world_a)
    assert await authorize(world_a.raw_key) == principal, "served while the refresh runs"
    await drain_background()
    with pytest.raises(KeyRefused) as refused:
        await authorize(world_a.raw_key)
    assert refused.value.reason == "invalid"
    await sync_to_async(connections.close_all)()


async def test_it_refuses_a_disabled_tenants_key_apart_from_an_unknown_one(world_a: TenantWorld) -> None:
    """A known key of a disabled tenant is refused as ``disabled``."""
    await sync_to_async(Tenant.objects.filter(pk=world_a.tenant.pk).update)(active=False)
    with pytest.raises(KeyRefused) as refused:
        await authorize(world_a.raw_key)
    assert refused.value.reason == "disabled"
    await sync_to_async(connections.close_all)()


def test_it_builds_a_principal_free_of_model_instances(world_a: TenantWorld) -> None:
    """Nothing in a principal is an ORM instance: it is safe to use on the event loop."""
    from django.db.models import Model

    principal = principal_for_key(world_a.raw_key)
    assert principal is not None
    seen: list[Any] = [principal]
    while seen:
        value = seen.pop()
        assert not isinstance(value, Model)
        if isinstance(value, tuple | list):
            seen.extend(value)
        elif hasattr(value, "__slots__") and not isinstance(value, str):
            seen.extend(getattr(value, name) for name in value.__slots__)
