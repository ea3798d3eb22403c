"""Admin tokens: create, authenticate, revoke (the only code that writes or reads ``AdminToken`` rows)."""

from __future__ import annotations

import secrets
import string
from datetime import timedelta

from django.utils import timezone

from api.models import ADMIN_TOKEN_PREFIX, AdminToken
from tenants.models import ApiKey, Tenant

_ALPHABET = string.ascii_lowercase + string.digits
#: ``last_used`` is written at most this often per token (seconds).
TOUCH_SECONDS = 60


def admin_token_create(*, tenant: Tenant, name: str = "api") -> tuple[AdminToken, str]:
    """A new token for ``tenant``; returns the row and the raw token (shown once, never stored)."""
    prefix = "".join(secrets.choice(_ALPHABET) for _ in range(12))
    raw = f"{ADMIN_TOKEN_PREFIX}-{prefix}-{secrets.token_urlsafe(32)}"
    token = AdminToken.objects.create(tenant=tenant, name=(name.strip() or "api")[:100], prefix=prefix,
                                      digest=ApiKey.compute_digest(raw))
    return token, raw


def admin_token_authenticate(raw: str) -> AdminToken | None:
    """The usable token of an active tenant for ``raw`` (``tra-<prefix>-<secret>``), else None; any input
    (bounded to 200 characters) is looked up at most once, by prefix, and compared in constant time."""
    parts = raw[:200].split("-", 2)
    if len(parts) != 3 or parts[0] != ADMIN_TOKEN_PREFIX or not parts[1] or not parts[2]:
        return None
    token = AdminToken.objects.select_related("tenant").filter(prefix=parts[1][:16]).first()
    if token is None or not token.matches(raw) or not token.is_usable() or not token.tenant.active:
        return None
    now = timezone.now()
    if token.last_used is None or now - token.last_used > timedelta(seconds=TOUCH_SECONDS):
        AdminToken.objects.filter(pk=token.pk).update(last_used=now)
        token.last_used = now
    return token


def admin_token_revoke(*, token: AdminToken) -> AdminToken:
    """Revoke ``token`` now (idempotent); the next call with it is refused (tokens are not cached)."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token
