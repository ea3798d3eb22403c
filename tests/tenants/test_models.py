"""Models: what is stored for keys and credentials, and the single-row invariants."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import override_settings

from tenants.models import ApiKey, ModelRoute, RouteFallback, Tenant, Upstream
from tenants.services import api_key_create, upstream_upsert
from tests.conftest import CREDENTIAL_A, HEADER_SECRET_A, TenantWorld

pytestmark = pytest.mark.django_db


def _raw_row(table: str, pk: int) -> dict[str, object]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table} WHERE id = %s", [pk])  # noqa: S608 - fixed table names
        names = [column[0] for column in cursor.description]
        return dict(zip(names, cursor.fetchone(), strict=True))


def test_it_stores_only_prefix_and_digest_for_a_new_key(world_a: TenantWorld) -> None:
    """The raw row holds the prefix and an HMAC digest; neither the key nor its secret part is anywhere in it."""
    key, raw = api_key_create(tenant=world_a.tenant, name="laptop")
    row = _raw_row("tenants_apikey", key.pk)
    secret = raw.split("-", 2)[2]
    assert row["prefix"] == raw.split("-")[1]
    assert row["digest"] == ApiKey.compute_digest(raw)
    assert all(raw not in str(value) and secret not in str(value) for value in row.values())


def test_it_keys_the_digest_with_the_server_secret(world_a: TenantWorld) -> None:
    """A plain SHA-256 of the key is not what is stored, and another server secret gives another digest."""
    key, raw = api_key_create(tenant=world_a.tenant, name="laptop")
    assert key.digest != hashlib.sha256(raw.encode()).hexdigest()
    with override_settings(API_KEY_SECRET="another-server-secret"):
        expected = hmac.new(b"another-server-secret", raw.encode(), hashlib.sha256).hexdigest()
        assert ApiKey.compute_digest(raw) == expected != key.digest


def test_it_keeps_the_upstream_credential_as_ciphertext(world_a: TenantWorld) -> None:
    """The credential and extra headers columns hold Fernet tokens; the clear values appear nowhere in the row."""
    row = _raw_row("tenants_upstream", world_a.upstream.pk)
    assert all(CREDENTIAL_A not in str(value) and HEADER_SECRET_A not in str(value) for value in row.values())
    assert str(row["credential_encrypted"]).startswith("gAAAA")  # Fernet token version byte, base64
    assert Upstream.objects.get(pk=world_a.upstream.pk).credential() == CREDENTIAL_A
    assert Upstream.objects.get(pk=world_a.upstream.pk).extra_headers() == {"X-Org": HEADER_SECRET_A}


def test_it_decrypts_old_rows_after_a_new_key_is_put_in_front(db: None) -> None:
    """Rotation step one: a new key in front of CREDENTIAL_KEYS; old rows still decrypt, new ones use the new key."""
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    tenant = Tenant.objects.create(name="Rotating", slug="rotating")
    with override_settings(CREDENTIAL_KEYS=[old]):
        upstream = upstream_upsert(tenant=tenant, name="u", base_url="https://api.example.test/v1",
                                   credential="sk-old-secret-1234")
    with override_settings(CREDENTIAL_KEYS=[new, old]):
        assert Upstream.objects.get(pk=upstream.pk).credential() == "sk-old-secret-1234"
        fresh = upstream_upsert(tenant=tenant, name="v", base_url="https://api.example.test/v1",
                                credential="sk-new-secret-5678")
    assert Fernet(new.encode()).decrypt(fresh.credential_encrypted.encode()) == b"sk-new-secret-5678"


def test_it_masks_the_credential_for_display(world_a: TenantWorld) -> None:
    """Only a masked hint is kept in clear: ``sk-…3f9a``."""
    assert world_a.upstream.credential_display == "sk-…3f9a"


def test_it_refuses_a_route_to_another_tenants_upstream(world_a: TenantWorld, world_b: TenantWorld) -> None:
    """A route, a fallback and a default upstream must stay within their tenant."""
    route = ModelRoute(tenant=world_a.tenant, public_name="x", upstream=world_b.upstream)
    fallback = RouteFallback(route=world_a.route, upstream=world_b.upstream)
    world_a.tenant.default_upstream = world_b.upstream
    for row in (route, fallback, world_a.tenant):
        with pytest.raises(ValidationError):
            row.full_clean()


def test_it_tells_usable_keys_from_revoked_and_expired_ones(world_a: TenantWorld) -> None:
    """``is_usable`` and ``ApiKey.objects.active()`` agree."""
    from datetime import timedelta

    from django.utils import timezone

    expired, _ = api_key_create(tenant=world_a.tenant, name="old", expires=timezone.now() - timedelta(seconds=1))
    revoked, _ = api_key_create(tenant=world_a.tenant, name="gone")
    revoked.revoked_at = timezone.now()
    revoked.save()
    assert not expired.is_usable() and not revoked.is_usable() and world_a.api_key.is_usable()
    assert set(ApiKey.objects.active().for_tenant(world_a.tenant)) == {world_a.api_key}
