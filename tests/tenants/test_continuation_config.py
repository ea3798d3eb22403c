"""The text continuation switches in the database (``Upstream.text_continuation``, ``ModelRoute.continue_text``):
carried by principals into their route plans, and by their last-good copy (docs/routing.md, "Cut text
streams continued")."""

from __future__ import annotations

import pytest

from tenants import last_good
from tenants.auth import principal_for_key
from tenants.models import ModelRoute
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def test_principals_carry_the_capability_and_the_opt_in(world_a: TenantWorld) -> None:
    up = world_a.upstream
    up.text_continuation = "continue-final-message"
    up.save()
    ModelRoute.objects.create(tenant=world_a.tenant, public_name="vllm-*", upstream=up, continue_text=True)
    ModelRoute.objects.create(tenant=world_a.tenant, public_name="plain", upstream=up)
    principal = principal_for_key(world_a.raw_key)
    assert principal is not None
    for copy in (principal, last_good.loads(last_good.dumps(principal))):
        on, off = copy.resolve("vllm-7b"), copy.resolve("plain")
        assert on is not None and off is not None
        assert on.continue_text and not off.continue_text
        assert on.target(0).continuation == "continue-final-message"


def test_off_by_default(world_a: TenantWorld) -> None:
    ModelRoute.objects.create(tenant=world_a.tenant, public_name="m", upstream=world_a.upstream)
    principal = principal_for_key(world_a.raw_key)
    assert principal is not None
    plan = principal.resolve("m")
    assert plan is not None and not plan.continue_text and plan.target(0).continuation == ""
