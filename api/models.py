"""Admin tokens of the management REST API: one tenant each, stored as a prefix and a digest (never the secret).

Format ``tra-<prefix>-<secret>``: ``prefix`` 12 lowercase alphanumerics (the lookup key), ``secret`` 43
urlsafe characters (256 bits); ``digest`` = hex HMAC-SHA256 under the server's API key secret, as for
API keys (``tenants.models.ApiKey.compute_digest``). Created by ``manage.py apitoken --tenant T``,
revoked in the admin (or ``apitoken --revoke``).
"""

from __future__ import annotations

import hmac
from typing import Any

from django.db import models
from django.utils import timezone

from tenants.models import ApiKey

ADMIN_TOKEN_PREFIX = "tra"  # noqa: S105 - the visible start of a token, not a secret


class AdminToken(models.Model):
    """A management API credential: whoever holds it administers ``tenant`` (its keys, members' budgets,
    usage) through ``/api/v1/``, and nothing of any other tenant."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="admin_tokens")
    name = models.CharField(max_length=100, help_text="What uses it, e.g. 'ci'.")
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        verbose_name = "management API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.display})"

    @property
    def display(self) -> str:
        """What may be shown of the token: ``tra-<prefix>-…``."""
        return f"{ADMIN_TOKEN_PREFIX}-{self.prefix}-…"

    def matches(self, raw: str) -> bool:
        """Constant-time comparison of ``raw``'s digest with the stored one."""
        return hmac.compare_digest(self.digest, ApiKey.compute_digest(raw))

    def is_usable(self, now: Any = None) -> bool:
        """True until revoked."""
        return self.revoked_at is None
