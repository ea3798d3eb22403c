"""Audit rows: one ProxyRequest per client request, its Attempts upstream, their Findings and Fragments.

Written append-only through ``audit.services`` off the byte path; read through the read-only admin
and the reports. Finding kinds are ``proxy.guard.findings.FindingKind`` values, unchanged.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from proxy.guard.findings import Action, FindingKind, Severity


class ProxyRequest(models.Model):
    """One client request through the proxy. Times in milliseconds; usage summed over attempts."""

    class Path(models.TextChoices):
        PASS_THROUGH = "pass-through"
        GUARDED = "guarded"
        NON_STREAM = "non-stream"

    class Outcome(models.TextChoices):
        PENDING = "pending"
        CLEAN = "clean"
        NORMALIZED = "normalized"
        REPAIRED = "repaired"
        RECOVERED = "recovered-by-retry"
        EXHAUSTED = "exhausted"
        UPSTREAM_ERROR = "upstream-error"
        CLIENT_CANCELLED = "client-cancelled"
        REJECTED = "rejected"  # refused before any upstream call (bad request, unknown model)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False,
                          help_text="Also the x-request-id the client sees; generated before any write.")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey("tenants.ApiKey", null=True, on_delete=models.SET_NULL, related_name="+")
    route = models.ForeignKey("tenants.ModelRoute", null=True, on_delete=models.SET_NULL, related_name="+")
    upstream = models.ForeignKey("tenants.Upstream", null=True, on_delete=models.SET_NULL, related_name="+")
    client_protocol = models.CharField(max_length=24, default="openai-chat")
    client_user_agent = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200)
    upstream_model = models.CharField(max_length=200, blank=True)
    path = models.CharField(max_length=16, choices=Path.choices)
    outcome = models.CharField(max_length=24, choices=Outcome.choices, default=Outcome.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    status = models.PositiveSmallIntegerField(null=True)
    ttft_ms = models.FloatField(null=True)
    total_ms = models.FloatField(null=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    wasted_completion_tokens = models.PositiveIntegerField(default=0, help_text="Completion tokens of failed attempts.")
    wasted_ms = models.FloatField(default=0, help_text="Milliseconds spent on failed attempts.")
    error = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now, db_index=True)
    finished = models.DateTimeField(null=True)

    class Meta:
        ordering = ["-created"]
        indexes = [
            models.Index(fields=["tenant", "-created"], name="req_tenant_created"),
            models.Index(fields=["outcome", "-created"], name="req_outcome_created"),
            models.Index(fields=["upstream", "-created"], name="req_upstream_created"),
            models.Index(fields=["model", "-created"], name="req_model_created"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.model} {self.outcome}"


class Attempt(models.Model):
    """One upstream call of a request. ``number`` is 0-based; durations in milliseconds."""

    request = models.ForeignKey(ProxyRequest, on_delete=models.CASCADE, related_name="attempt_rows")
    number = models.PositiveSmallIntegerField()
    upstream = models.ForeignKey("tenants.Upstream", null=True, on_delete=models.SET_NULL, related_name="+")
    upstream_model = models.CharField(max_length=200, blank=True)
    upstream_status = models.PositiveSmallIntegerField(null=True)
    outcome = models.CharField(max_length=24)
    abort_reason = models.TextField(blank=True)
    ttfb_ms = models.FloatField(null=True)
    duration_ms = models.FloatField(null=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    bytes_received = models.PositiveIntegerField(default=0)
    frames = models.PositiveIntegerField(default=0)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["request_id", "number"]
        constraints = [models.UniqueConstraint(fields=["request", "number"], name="attempt_unique_number")]

    def __str__(self) -> str:
        return f"attempt {self.number} of #{self.request_id}: {self.outcome}"


class Finding(models.Model):
    """One anomaly absorbed, repaired or rejected by the guard (``proxy.guard.findings.Finding``)."""

    request = models.ForeignKey(ProxyRequest, on_delete=models.CASCADE, related_name="findings")
    attempt = models.ForeignKey(Attempt, null=True, on_delete=models.CASCADE, related_name="findings")
    tenant_id_copy = models.BigIntegerField(db_index=True, help_text="Denormalised tenant id for cheap filtering.")
    kind = models.CharField(max_length=64, choices=[(k.value, k.value) for k in FindingKind], db_index=True)
    severity = models.CharField(max_length=8, choices=[(s.value, s.value) for s in Severity])
    action = models.CharField(max_length=12, choices=[(a.value, a.value) for a in Action])
    choice = models.PositiveSmallIntegerField(null=True)
    slot = models.PositiveSmallIntegerField(null=True)
    frame = models.PositiveIntegerField(null=True)
    byte_offset = models.PositiveIntegerField(null=True)
    fragment = models.TextField(blank=True, help_text="The offending frame text (capped); purged after retention.")
    detail = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["request_id", "id"]
        indexes = [models.Index(fields=["kind", "-created"], name="finding_kind_created")]

    def __str__(self) -> str:
        return f"{self.kind} ({self.action})"


class Fragment(models.Model):
    """Raw upstream bytes kept per the tenant's policy (whole attempt body, capped), purged after retention."""

    attempt = models.OneToOneField(Attempt, on_delete=models.CASCADE, related_name="fragment")
    tenant_id_copy = models.BigIntegerField(db_index=True)
    body = models.TextField()
    truncated = models.BooleanField(default=False)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return f"body of {self.attempt}"
