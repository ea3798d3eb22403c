"""People of tenants A and B: ``dev_a`` (a ``member`` of A, not staff), ``dev_b`` (a member of B)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from tenants.models import Membership
from tests.conftest import TenantWorld


def make_member(world: TenantWorld, username: str, **fields: Any) -> Membership:
    """A non-staff user with a ``member`` membership of ``world``'s tenant."""
    user = User.objects.create_user(username=username, password="pw-long-enough-123")
    return Membership.objects.create(user=user, tenant=world.tenant, role=Membership.MEMBER, **fields)


@pytest.fixture
def dev_a(world_a: TenantWorld, world_b: TenantWorld) -> Membership:
    """A member of tenant A who may hold two keys, for ``tenant-a-model`` only."""
    return make_member(world_a, "dev-a", max_keys=2, allowed_models=["tenant-a-model"])


@pytest.fixture
def dev_b(world_b: TenantWorld) -> Membership:
    """A member of tenant B."""
    return make_member(world_b, "dev-b")
