"""Writes to tenant-owned rows: keyword-only, typed, named ``<entity>_<action>`` (STYLE.md rule 7)."""

from __future__ import annotations

import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from tenants import crypto, revocation
from tenants.limits import LIMIT_NAMES, Limits
from tenants.models import (
    API_KEY_PREFIX,
    ApiKey,
    ModelRoute,
    Tenant,
    Upstream,
    UpstreamLearnedLimit,
    validate_extra_headers,
    validate_header_value,
)

_PREFIX_ALPHABET = string.ascii_lowercase + string.digits


def new_raw_api_key() -> tuple[str, str]:
    """A fresh ``(prefix, raw_key)``: ``tr-<12 lowercase alphanumerics>-<43 urlsafe chars>``."""
    prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(12))
    return prefix, f"{API_KEY_PREFIX}-{prefix}-{secrets.token_urlsafe(32)}"


def api_key_create(*, tenant: Tenant, name: str, expires: datetime | None = None) -> tuple[ApiKey, str]:
    """Create a key for ``tenant``; return the row and the raw key (shown once, never stored)."""
    prefix, raw = new_raw_api_key()
    key = ApiKey.objects.create(tenant=tenant, name=name, prefix=prefix, digest=ApiKey.compute_digest(raw),
                                expires=expires)
    return key, raw


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke ``key`` now (idempotent). Every running process is told at once (``tenants.revocation``:
    Redis pub/sub when ``REDIS_URL`` is set); without the broadcast they refuse it within
    ``AUTH_CACHE_SECONDS``."""
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    revocation.key_revoked(key.digest)
    return key


def limits_set(*, tenant: Tenant, key: ApiKey | None = None, values: Mapping[str, int | None]) -> Limits:
    """Set some of the limits of ``tenant`` (``key`` None) or of its ``key``; return the holder's limits.

    ``values`` maps names of ``LIMIT_NAMES`` to a whole number (0 blocks) or None (no limit); names not
    given are left as they are. ``ValidationError`` for an unknown name, a negative number, or a key
    limit above its tenant's. Running processes see the change at once (``tenants.revocation``).
    """
    unknown = sorted(set(values) - set(LIMIT_NAMES))
    if unknown:
        raise ValidationError(f"unknown limit(s): {', '.join(unknown)}")
    if any(v is not None and v < 0 for v in values.values()):
        raise ValidationError("a limit is a whole number >= 0 (0 blocks) or none")
    row: Tenant | ApiKey = tenant if key is None else key
    if key is not None and key.tenant_id != tenant.pk:
        raise ValidationError("no such key in this tenant")
    for name, value in values.items():
        setattr(row, name, value)
    if isinstance(row, ApiKey):
        row.clean()
    with transaction.atomic():
        row.save(update_fields=list(values) or None)
        revocation.tenant_changed(tenant.pk)
    return row.limits()


def api_key_touch(*, key: ApiKey) -> None:
    """Record use of ``key`` at most once per ``API_KEY_TOUCH_SECONDS`` (one UPDATE, no read-modify-write)."""
    now = timezone.now()
    if key.last_used is None or now - key.last_used > timedelta(seconds=settings.API_KEY_TOUCH_SECONDS):
        ApiKey.objects.filter(pk=key.pk).update(last_used=now)
        key.last_used = now


def learned_limit_save(*, limit: UpstreamLearnedLimit) -> UpstreamLearnedLimit:
    """Save an operator's edit of a learned limit, stamped now so it wins over what proxy processes
    learned before it; with ``REDIS_URL`` it reaches every process within ``UPSTREAM_LEARNED_SYNC_SECONDS``,
    else with their next key lookup (``AUTH_CACHE_SECONDS``)."""
    from tenants.learned import publish_now

    limit.learned_at = timezone.now()
    limit.save()
    if settings.REDIS_URL:
        publish_now(limit.fact(), settings.REDIS_URL)
    return limit


def learned_limit_forget(*, limit: UpstreamLearnedLimit) -> UpstreamLearnedLimit:
    """Expire a learned limit now: the next request sends the parameter as the client asked (and learns it
    again if the upstream still refuses it)."""
    limit.expires_at = timezone.now()
    return learned_limit_save(limit=limit)


def tenant_ensure(*, name: str) -> tuple[Tenant, bool]:
    """The tenant called ``name`` (slug derived), created if missing; returns ``(tenant, created)``."""
    tenant = Tenant.objects.filter(name=name).first()
    if tenant is not None:
        return tenant, False
    slug = slugify(name) or "tenant"
    base, n = slug, 1
    while Tenant.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return Tenant.objects.create(name=name, slug=slug), True


def upstream_upsert(*, tenant: Tenant, name: str, base_url: str, credential: str | None = None,
                    extra_headers: dict[str, str] | None = None) -> Upstream:
    """Create or update the tenant's upstream ``name``; ``credential`` None keeps the stored one.

    Raises ``ValidationError`` when the base URL fails the outbound address policy (an internal
    address, ``user:pass@``) or a secret cannot be a header value (CR, LF, NUL, surrounding spaces).
    """
    if credential:
        validate_header_value(credential, what="The credential")
    if extra_headers:
        validate_extra_headers(extra_headers)
    upstream = Upstream.objects.filter(tenant=tenant, name=name).first() or Upstream(tenant=tenant, name=name)
    upstream.base_url = base_url.rstrip("/")
    if credential is not None:
        upstream.set_credential(credential)
    if extra_headers is not None:
        upstream.set_extra_headers(extra_headers)
    upstream.full_clean()
    upstream.save()
    return upstream


def route_upsert(*, tenant: Tenant, public_name: str, upstream: Upstream, upstream_model: str = "",
                 max_output_tokens: int | None = None) -> ModelRoute:
    """Create or update the tenant's route for ``public_name``."""
    if upstream.tenant_id != tenant.pk:
        raise ValueError("the upstream belongs to another tenant")
    route, _ = ModelRoute.objects.update_or_create(
        tenant=tenant, public_name=public_name,
        defaults={"upstream": upstream, "upstream_model": upstream_model, "max_output_tokens": max_output_tokens},
    )
    return route


@dataclass(frozen=True, slots=True)
class Provisioned:
    """What ``provision`` did: the tenant, its default upstream, whether it was new, and a new key."""

    tenant: Tenant
    upstream: Upstream
    created: bool
    api_key: ApiKey | None
    raw_key: str | None


@transaction.atomic
def provision(*, tenant_name: str, upstream_url: str, upstream_key: str | None = None,
              routes: dict[str, str] | None = None, new_key: bool = True) -> Provisioned:
    """Create or update a tenant, its ``default`` upstream and routes, idempotently.

    ``routes`` maps public model names to upstream model names. When ``new_key`` a fresh API key
    is created and returned (raw, once).
    """
    tenant, created = tenant_ensure(name=tenant_name)
    upstream = upstream_upsert(tenant=tenant, name="default", base_url=upstream_url, credential=upstream_key)
    if tenant.default_upstream_id != upstream.pk:
        tenant.default_upstream = upstream
        tenant.save(update_fields=["default_upstream"])
    for public, target in (routes or {}).items():
        route_upsert(tenant=tenant, public_name=public, upstream=upstream, upstream_model=target)
    key, raw = api_key_create(tenant=tenant, name="provisioned") if new_key else (None, None)
    return Provisioned(tenant, upstream, created, key, raw)


@transaction.atomic
def upstream_credentials_rotate() -> int:
    """Re-encrypt every stored credential and extra-headers blob under the newest ``CREDENTIAL_KEYS`` key.

    All or nothing: a row no configured key opens raises ``crypto.CredentialError`` and nothing is
    changed. Returns the number of upstreams rewritten.
    """
    count = 0
    for upstream in Upstream.objects.select_for_update().exclude(credential_encrypted="", extra_headers_encrypted=""):
        if upstream.credential_encrypted:
            upstream.credential_encrypted = crypto.rotate(upstream.credential_encrypted)
        if upstream.extra_headers_encrypted:
            upstream.extra_headers_encrypted = crypto.rotate(upstream.extra_headers_encrypted)
        upstream.save(update_fields=["credential_encrypted", "extra_headers_encrypted"])
        count += 1
    return count
