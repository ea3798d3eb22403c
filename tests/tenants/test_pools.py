"""Credential pools in the database: added once, carried by principals (and their last-good copy), shown
by ``upstreams status`` in the issue's shape."""

from __future__ import annotations

import asyncio
import json
from io import StringIO
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError

from infra.routing_health import Circuit, KeyState, circuit_name, key_name
from infra.shared_state import get_state
from proxy.upstreams.client import secrets_of
from tenants import last_good
from tenants.auth import principal_for_key
from tenants.models import UpstreamCredential
from tenants.services import upstream_key_add
from tests.conftest import CREDENTIAL_A, TenantWorld

pytestmark = pytest.mark.django_db


def test_keys_are_added_once_and_principals_carry_the_pool(world_a: TenantWorld) -> None:
    up = world_a.upstream
    assert upstream_key_add(upstream=up, raw=CREDENTIAL_A) == ("0", False)  # its own credential
    seven, added = upstream_key_add(upstream=up, raw="sk-pool-second-key", weight=3)
    assert added and upstream_key_add(upstream=up, raw="sk-pool-second-key") == (seven, False)
    with pytest.raises(ValidationError):
        upstream_key_add(upstream=up, raw="sk-bad\nkey")
    off, _ = upstream_key_add(upstream=up, raw="sk-pool-switched-off")
    UpstreamCredential.objects.filter(pk=int(off)).update(enabled=False)
    principal = principal_for_key(world_a.raw_key)
    assert principal is not None and principal.default_target is not None
    target = principal.default_target
    assert [(k[0], k[2]) for k in target.keys] == [("0", 1), (seven, 3)]
    assert target.key_id == "0"
    assert {CREDENTIAL_A, "sk-pool-second-key"} <= secrets_of(target)  # every key is redacted
    again = last_good.loads(last_good.dumps(principal))
    assert again.default_target.keys == target.keys


def test_status_prints_the_circuit_and_every_keys_state(world_a: TenantWorld) -> None:
    up = world_a.upstream
    seven, _ = upstream_key_add(upstream=up, raw="sk-pool-second-key")
    state = get_state()
    asyncio.run(state.remember(key_name(up.pk, seven), KeyState(until=4e9, failed_at=1).dumps(), 60))
    asyncio.run(state.remember(circuit_name(up.pk), Circuit(3, 4e9, 1).dumps(), 60))
    out = StringIO()
    call_command("upstreams", "status", "--tenant", world_a.tenant.name, "--json", stdout=out)
    (shown,) = json.loads(out.getvalue())["upstreams"]
    assert shown["name"] == up.name and shown["circuit"] == "open" and shown["broken_rate"] == {}
    assert [(k["id"], k["state"], k["until"] is not None) for k in shown["keys"]] == [
        ("0", "ok", False), (seven, "cooling", True)]


def test_status_gives_the_broken_rate_of_every_model_the_upstream_served(world_a: TenantWorld, settings: Any) -> None:
    """Issue 21 item 6: ``broken_rate`` covers the models an upstream served in the window, not only those its
    routes name (a glob route's client models, the default upstream's pass-through): the relay's count notes
    them in real Redis (``proxy.routing.quality.count``), the command reads them back."""
    import uuid

    from infra.shared_state import RedisState
    from proxy.routing import quality
    from tenants.principal import UpstreamTarget

    settings.REDIS_URL, settings.LIMITS_KEY_PREFIX = "redis://127.0.0.1:6379/3", f"test:{uuid.uuid4().hex}:"
    up = world_a.upstream
    target = UpstreamTarget(upstream_id=up.pk, name=up.name, base_url=up.base_url, model="glm-unrouted",
                            credential_encrypted="", extra_headers_encrypted="", connect_timeout=1,
                            first_byte_timeout=1, idle_timeout=1)

    async def turns() -> None:
        state = RedisState(settings.REDIS_URL, prefix=settings.LIMITS_KEY_PREFIX, timeout=1.0)
        for broken in (True, False, False, False):
            await quality.count(state, target, broken=broken)
        await state.close()

    asyncio.run(turns())
    out = StringIO()
    call_command("upstreams", "status", "--tenant", world_a.tenant.name, "--json", stdout=out)
    (shown,) = json.loads(out.getvalue())["upstreams"]
    assert shown["broken_rate"] == {"glm-unrouted": 0.25}
    assert world_a.route.public_name not in shown["broken_rate"]  # routed, but no turn in the window


def test_routes_set_turns_text_continuation_on_and_off(world_a: TenantWorld) -> None:
    """Issue 21 item 6: ``routes set ... --continue-text on|off``; left out, the route keeps what it had."""
    from tenants.models import ModelRoute

    def routes_set(*extra: str) -> str:
        out = StringIO()
        call_command("routes", "set", "--tenant", world_a.tenant.name, "--model", "writer-*",
                     "--targets", world_a.upstream.name, *extra, stdout=out)
        return out.getvalue()

    assert "continue text off" in routes_set()
    assert "continue text on" in routes_set("--continue-text", "on")
    assert ModelRoute.objects.get(tenant=world_a.tenant, public_name="writer-*").continue_text is True
    assert "continue text on" in routes_set("--prefer", "quality")  # unchanged
    routes_set("--continue-text", "off")
    assert ModelRoute.objects.get(tenant=world_a.tenant, public_name="writer-*").continue_text is False
    with pytest.raises(CommandError):
        routes_set("--continue-text", "maybe")
