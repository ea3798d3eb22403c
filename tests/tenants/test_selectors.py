"""Selectors: API key lookup, and tenant scoping where "missing" and "not yours" look the same."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from tenants.models import ModelRoute
from tenants.selectors import (
    NotFound,
    api_key_authenticate,
    api_key_for_tenant,
    api_keys_for_tenant,
    cached_tenant_for_key,
    key_cache,
    route_for_tenant,
    routes_for_tenant,
    tenant_for_key,
    tenant_for_user,
    tenants_for_user,
    upstream_for_tenant,
    upstreams_for_tenant,
)
from tenants.services import api_key_create, api_key_revoke
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

MISSING = 987654321


def test_it_finds_a_key_by_its_raw_value(world_a: TenantWorld) -> None:
    """The raw key authenticates and resolves to its tenant."""
    assert api_key_authenticate(world_a.raw_key) == world_a.api_key
    snapshot = tenant_for_key(world_a.raw_key)
    assert snapshot is not None and snapshot.tenant_id == world_a.tenant.pk


def test_it_refuses_a_wrong_secret(world_a: TenantWorld) -> None:
    """Right prefix, wrong secret: refused."""
    prefix = world_a.raw_key.split("-")[1]
    forged = f"tr-{prefix}-{'A' * 43}"
    assert api_key_authenticate(forged) is None
    assert tenant_for_key(forged) is None


def test_it_refuses_a_revoked_key(world_a: TenantWorld) -> None:
    """A revoked key is refused."""
    api_key_revoke(key=world_a.api_key)
    assert api_key_authenticate(world_a.raw_key) is None
    assert tenant_for_key(world_a.raw_key) is None


def test_it_refuses_an_expired_key(world_a: TenantWorld) -> None:
    """A key past its expiry is refused."""
    _, raw = api_key_create(tenant=world_a.tenant, name="old", expires=timezone.now() - timedelta(minutes=1))
    assert api_key_authenticate(raw) is None
    assert tenant_for_key(raw) is None


@pytest.mark.parametrize("raw", ["", "Bearer", "tr-", "tr--x", "sk-abc-def", "tr-nosuchprefix-secret"])
def test_it_refuses_malformed_and_unknown_keys(world_a: TenantWorld, raw: str) -> None:
    """Anything that is not a known key gives None, never an error."""
    assert api_key_authenticate(raw) is None
    assert tenant_for_key(raw) is None


def test_it_answers_from_the_cache_only_what_it_already_knows(world_a: TenantWorld,
                                                              django_assert_num_queries: Any) -> None:
    """``cached_tenant_for_key`` never queries: unknown until ``tenant_for_key`` filled the cache, then the
    same snapshot; a malformed key is answered (None) at once."""
    with django_assert_num_queries(0):
        assert cached_tenant_for_key(world_a.raw_key) == (False, None, False)
        assert cached_tenant_for_key("sk-not-ours") == (True, None, False)
    snapshot = tenant_for_key(world_a.raw_key)
    with django_assert_num_queries(0):
        assert cached_tenant_for_key(world_a.raw_key) == (True, snapshot, False)


def test_it_asks_once_for_a_refresh_past_half_the_lifetime(world_a: TenantWorld, settings: Any) -> None:
    """Past half its lifetime a cached key is still served, one caller is told to refresh it, and the
    refresh reads the database: a key revoked meanwhile is refused from then on."""
    settings.AUTH_CACHE_SECONDS = 60
    snapshot = tenant_for_key(world_a.raw_key)
    digest = world_a.api_key.compute_digest(world_a.raw_key)
    key_cache._entries[digest] = (time.monotonic() + 20, snapshot)  # 40 of 60 s gone
    assert cached_tenant_for_key(world_a.raw_key) == (True, snapshot, True)
    assert cached_tenant_for_key(world_a.raw_key) == (True, snapshot, False)  # claimed once
    api_key_revoke(key=world_a.api_key)
    assert tenant_for_key(world_a.raw_key, refresh=True) is None
    assert cached_tenant_for_key(world_a.raw_key) == (True, None, False)


def test_it_touches_last_used_when_a_key_authenticates(world_a: TenantWorld) -> None:
    """Authentication records use (throttled by API_KEY_TOUCH_SECONDS)."""
    tenant_for_key(world_a.raw_key)
    world_a.api_key.refresh_from_db()
    assert world_a.api_key.last_used is not None


def test_it_returns_only_the_tenants_own_rows(world_a: TenantWorld, world_b: TenantWorld) -> None:
    """No ``*_for_tenant`` list selector returns another tenant's rows."""
    assert list(upstreams_for_tenant(world_a.tenant)) == [world_a.upstream]
    assert list(routes_for_tenant(world_a.tenant)) == [world_a.route]
    assert list(api_keys_for_tenant(world_a.tenant)) == [world_a.api_key]
    assert list(upstreams_for_tenant(world_b.tenant)) == [world_b.upstream]


@pytest.mark.parametrize("getter, attribute", [
    (upstream_for_tenant, "upstream"),
    (route_for_tenant, "route"),
    (api_key_for_tenant, "api_key"),
])
def test_it_answers_not_yours_like_missing(world_a: TenantWorld, world_b: TenantWorld, getter: Any,
                                           attribute: str) -> None:
    """Another tenant's row and a missing row raise the same NotFound with the same message."""
    assert getter(world_a.tenant, getattr(world_a, attribute).pk) == getattr(world_a, attribute)
    with pytest.raises(NotFound) as not_yours:
        getter(world_a.tenant, getattr(world_b, attribute).pk)
    with pytest.raises(NotFound) as missing:
        getter(world_a.tenant, MISSING)
    assert str(not_yours.value) == str(missing.value)


def test_it_scopes_tenants_to_the_users_memberships(admin_a: User, viewer_a: User, outsider_b: User,
                                                    superuser: User, world_a: TenantWorld,
                                                    world_b: TenantWorld) -> None:
    """Members see their tenants, superusers all, non-staff none."""
    assert list(tenants_for_user(admin_a)) == [world_a.tenant]
    assert list(tenants_for_user(viewer_a)) == [world_a.tenant]
    assert list(tenants_for_user(outsider_b)) == [world_b.tenant]
    assert set(tenants_for_user(superuser)) == {world_a.tenant, world_b.tenant}
    admin_a.is_staff = False
    assert list(tenants_for_user(admin_a)) == []


@pytest.mark.parametrize("persona", ["admin_a", "viewer_a"])
def test_it_answers_another_tenant_like_a_missing_one(request: pytest.FixtureRequest, persona: str,
                                                      world_a: TenantWorld, world_b: TenantWorld) -> None:
    """``tenant_for_user`` raises the same NotFound for tenant B as for a tenant that does not exist."""
    user = request.getfixturevalue(persona)
    assert tenant_for_user(user, world_a.tenant.pk) == world_a.tenant
    with pytest.raises(NotFound) as not_yours:
        tenant_for_user(user, world_b.tenant.pk)
    with pytest.raises(NotFound) as missing:
        tenant_for_user(user, MISSING)
    assert str(not_yours.value) == str(missing.value)


def test_it_never_routes_to_another_tenants_upstream(world_a: TenantWorld, world_b: TenantWorld) -> None:
    """Even a route row that points across tenants (written around the services) is not followed."""
    ModelRoute.objects.create(tenant=world_a.tenant, public_name="stolen", upstream=world_b.upstream)
    snapshot = tenant_for_key(world_a.raw_key)
    assert snapshot is not None
    plan = snapshot.resolve("stolen")
    assert plan is not None
    assert {target.upstream_id for target in plan.targets} == {world_a.upstream.pk}


def test_it_resolves_routes_globs_and_the_default_upstream(world_a: TenantWorld) -> None:
    """Exact route first, then the default upstream with the model name unchanged."""
    snapshot = tenant_for_key(world_a.raw_key)
    assert snapshot is not None
    routed = snapshot.resolve("tenant-a-model")
    unrouted = snapshot.resolve("anything-else")
    assert routed is not None and routed.target(0).model == "tenant-a-upstream-model"
    assert unrouted is not None and unrouted.target(0).model == "anything-else"
