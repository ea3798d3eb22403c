"""Services: key creation and revocation, upserts, provisioning and credential rotation."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ValidationError
from django.test import override_settings
from django.utils import timezone

from tenants import crypto
from tenants.models import ApiKey, ModelRoute, Tenant, Upstream
from tenants.services import (
    api_key_create,
    api_key_revoke,
    api_key_touch,
    provision,
    route_upsert,
    tenant_ensure,
    upstream_credentials_rotate,
    upstream_upsert,
)
from tests.conftest import CREDENTIAL_A, TenantWorld

pytestmark = pytest.mark.django_db

KEY_FORMAT = re.compile(r"^tr-[a-z0-9]{12}-[A-Za-z0-9_-]{43}$")


def test_it_creates_keys_in_a_recognisable_format(world_a: TenantWorld) -> None:
    """``tr-<12 alphanumerics>-<43 urlsafe>``, so leak scanners can spot them; every key is different."""
    raws = {api_key_create(tenant=world_a.tenant, name=f"k{i}")[1] for i in range(5)}
    assert len(raws) == 5 and all(KEY_FORMAT.match(raw) for raw in raws)


def test_it_revokes_a_key_once(world_a: TenantWorld) -> None:
    """Revoking sets ``revoked_at``; revoking again keeps the first time."""
    first = api_key_revoke(key=world_a.api_key).revoked_at
    again = api_key_revoke(key=ApiKey.objects.get(pk=world_a.api_key.pk)).revoked_at
    assert first is not None and again == first


def test_it_touches_last_used_at_most_once_per_window(world_a: TenantWorld) -> None:
    """A second touch within API_KEY_TOUCH_SECONDS writes nothing."""
    api_key_touch(key=world_a.api_key)
    stamped = ApiKey.objects.get(pk=world_a.api_key.pk).last_used
    api_key_touch(key=world_a.api_key)
    assert stamped is not None and ApiKey.objects.get(pk=world_a.api_key.pk).last_used == stamped
    world_a.api_key.last_used = timezone.now() - timedelta(hours=1)
    api_key_touch(key=world_a.api_key)
    later = ApiKey.objects.get(pk=world_a.api_key.pk).last_used
    assert later is not None and later > stamped


def test_it_keeps_the_stored_credential_when_none_is_given(world_a: TenantWorld) -> None:
    """``credential=None`` keeps the credential; a new value replaces it."""
    upstream_upsert(tenant=world_a.tenant, name=world_a.upstream.name, base_url="https://api.other.test/v1")
    assert Upstream.objects.get(pk=world_a.upstream.pk).credential() == CREDENTIAL_A
    upstream_upsert(tenant=world_a.tenant, name=world_a.upstream.name, base_url="https://api.other.test/v1",
                    credential="sk-replaced-0000")
    assert Upstream.objects.get(pk=world_a.upstream.pk).credential() == "sk-replaced-0000"


def test_it_refuses_a_route_to_another_tenants_upstream(world_a: TenantWorld, world_b: TenantWorld) -> None:
    """``route_upsert`` never links tenant A's route to tenant B's upstream."""
    with pytest.raises(ValueError, match="another tenant"):
        route_upsert(tenant=world_a.tenant, public_name="x", upstream=world_b.upstream)


def test_it_derives_unique_slugs(db: None) -> None:
    """Two names that slugify alike get distinct slugs; an existing name is found, not duplicated."""
    first, created = tenant_ensure(name="Acme Inc")
    second, _ = tenant_ensure(name="acme inc")
    again, created_again = tenant_ensure(name="Acme Inc")
    assert created and not created_again and again == first
    assert first.slug == "acme-inc" and second.slug == "acme-inc-2"


def test_it_provisions_idempotently(db: None) -> None:
    """Provisioning twice: one tenant, one upstream, routes updated in place, a new key each time."""
    first = provision(tenant_name="Acme", upstream_url="https://api.deepseek.com/v1", upstream_key="sk-one-1111",
                      routes={"gpt-4o": "deepseek-chat"})
    second = provision(tenant_name="Acme", upstream_url="https://api.deepseek.com/v1/",
                       routes={"gpt-4o": "deepseek-reasoner", "claude-*": "deepseek-chat"})
    assert first.created and not second.created
    assert Tenant.objects.count() == 1 and Upstream.objects.count() == 1
    routes = dict(ModelRoute.objects.values_list("public_name", "upstream_model"))
    assert routes == {"gpt-4o": "deepseek-reasoner", "claude-*": "deepseek-chat"}
    assert second.upstream.credential() == "sk-one-1111"
    assert second.raw_key != first.raw_key and ApiKey.objects.count() == 2
    assert sorted(ApiKey.objects.values_list("name", flat=True)) == ["provisioned", "provisioned-2"]


def test_it_provisions_a_key_only_for_a_tenant_without_one_when_asked_to_decide(db: None) -> None:
    """``new_key=None``: a key for a new tenant, none for one with a usable key; ``upstream_url`` None keeps it."""
    first = provision(tenant_name="Acme", upstream_url="https://api.deepseek.com/v1", new_key=None)
    again = provision(tenant_name="Acme", upstream_url=None, upstream_key="sk-two-2222", new_key=None)
    assert first.raw_key is not None and again.raw_key is None and again.api_key is None
    assert again.upstream.base_url == "https://api.deepseek.com/v1" and again.upstream.credential() == "sk-two-2222"
    with pytest.raises(ValidationError, match="no upstream yet"):
        provision(tenant_name="Nobody", upstream_url=None)
    assert not Tenant.objects.filter(name="Nobody").exists()


def test_it_rotates_every_secret_to_the_newest_key(db: None) -> None:
    """After rotation the old key can be dropped: everything decrypts with the new key alone."""
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    tenant = Tenant.objects.create(name="Rotating", slug="rotating")
    with override_settings(CREDENTIAL_KEYS=[old]):
        upstream = upstream_upsert(tenant=tenant, name="rotated", base_url="https://api.x.test/v1",
                                   credential="sk-rotate-me-9999", extra_headers={"X-A": "b"})
        upstream_upsert(tenant=tenant, name="keyless", base_url="https://api.y.test/v1")
    with override_settings(CREDENTIAL_KEYS=[new, old]):
        assert upstream_credentials_rotate() == 1  # the keyless upstream has nothing to re-encrypt
    with override_settings(CREDENTIAL_KEYS=[new]):
        fresh = Upstream.objects.get(pk=upstream.pk)
        assert fresh.credential() == "sk-rotate-me-9999" and fresh.extra_headers() == {"X-A": "b"}


def test_it_changes_nothing_when_a_secret_cannot_be_opened(world_a: TenantWorld) -> None:
    """Rotation is all or nothing: a row no configured key opens aborts it and no row is rewritten."""
    before = dict(Upstream.objects.values_list("pk", "credential_encrypted"))
    with override_settings(CREDENTIAL_KEYS=[Fernet.generate_key().decode()]), pytest.raises(crypto.CredentialError):
        upstream_credentials_rotate()
    assert dict(Upstream.objects.values_list("pk", "credential_encrypted")) == before
