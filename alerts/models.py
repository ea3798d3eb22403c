"""Alert webhooks of a tenant and the log of what was sent to them.

An ``AlertWebhook`` has up to three rules, each off while its threshold is blank, evaluated over the
last ``window_minutes`` (``alerts.rules``): an upstream's request-level corruption rate (guarded
requests that needed a retry, recovered or exhausted, over guarded requests; at least
``min_requests`` of them), the count of exhausted requests, and the count of agent loops broken.
A rule that fires is not fired again for the same subject within the window. Every post, including
the admin's test, is an ``AlertDelivery`` row: pending until the receiver answers 2xx, retried with
backoff by Celery, failed when the retries run out.
"""

from __future__ import annotations

import secrets

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from infra.webhook import FORMATS
from tenants import crypto
from tenants.models import Tenant, validate_outbound_url


class AlertWebhook(models.Model):
    """Where a tenant's alerts go, in which body format, signed with its own secret, and when they fire."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="alert_webhooks")
    name = models.CharField(max_length=100)
    url = models.URLField(max_length=500, help_text="Receives a signed POST per alert (checked by the outbound "
                                                    "address policy, as upstreams are).")
    format = models.CharField(max_length=8, choices=[(f, f) for f in FORMATS], default="slack",
                              help_text="slack: {\"text\": ...} for Slack-compatible incoming webhooks; "
                                        "generic: the alert's fields as JSON.")
    secret_encrypted = models.TextField(editable=False)
    enabled = models.BooleanField(default=True)
    window_minutes = models.PositiveSmallIntegerField(default=15, validators=[MinValueValidator(1),
                                                                              MaxValueValidator(24 * 60)],
                                                      help_text="The rules look at this many past minutes.")
    corruption_rate = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Fire when an upstream's share of guarded requests that needed a retry reaches this "
                  "(0-1, e.g. 0.25). Blank: off.")
    min_requests = models.PositiveIntegerField(default=20, help_text="Guarded requests an upstream needs in the "
                                                                     "window before its rate counts.")
    exhausted_over = models.PositiveIntegerField(null=True, blank=True,
                                                 help_text="Fire when more requests than this ran out of retries "
                                                           "in the window. Blank: off.")
    loops_over = models.PositiveIntegerField(null=True, blank=True,
                                             help_text="Fire when more agent loops than this were broken in "
                                                       "the window. Blank: off.")
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["tenant__name", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="alert_webhook_unique_name")]

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant})"

    def clean(self) -> None:
        """The URL must pass the outbound address policy (no internal addresses unless the operator allows them)."""
        if self.url:
            try:
                validate_outbound_url(self.url)
            except ValidationError as exc:
                raise ValidationError({"url": exc.messages}) from None

    def new_secret(self) -> str:
        """Make, store (encrypted) and return a new signing secret."""
        raw = "whsec_" + secrets.token_urlsafe(32)
        self.secret_encrypted = crypto.encrypt(raw)
        return raw

    def secret(self) -> str:
        """The signing secret. Raises ``crypto.CredentialError`` when no configured key opens it."""
        return crypto.decrypt(self.secret_encrypted) if self.secret_encrypted else ""


class AlertDelivery(models.Model):
    """One alert posted (or being posted) to a webhook; ``payload`` is the alert (``infra.webhook``)."""

    class Rule(models.TextChoices):
        CORRUPTION = "corruption-rate"
        EXHAUSTED = "exhausted"
        LOOPS = "loops-broken"
        BUDGET = "money-budget"
        TEST = "test"

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    webhook = models.ForeignKey(AlertWebhook, on_delete=models.CASCADE, related_name="deliveries")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    rule = models.CharField(max_length=16, choices=Rule.choices)
    subject = models.CharField(max_length=200, blank=True, help_text="What fired: an upstream, or the tenant.")
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now, db_index=True)
    delivered = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        verbose_name_plural = "alert deliveries"
        indexes = [models.Index(fields=["webhook", "rule", "subject", "-created"], name="alert_delivery_cooldown"),
                   models.Index(fields=["tenant", "-created"], name="alert_delivery_tenant")]

    def __str__(self) -> str:
        return f"{self.rule} to {self.webhook.name}: {self.status}"
