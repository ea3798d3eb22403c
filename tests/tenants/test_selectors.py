"""Selectors: tenant scoping where "missing" and "not yours" look the same (the key door: test_auth.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tenants.selectors import (
    NotFound,
    api_key_for_tenant,
    api_keys_for_tenant,
    route_for_tenant,
    routes_for_tenant,
    upstream_for_tenant,
    upstreams_for_tenant,
)
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

MISSING = 987654321


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
