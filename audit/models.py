"""Audit rows: one ProxyRequest per client request, its Attempts upstream, their Findings and Fragments.

Written append-only through ``audit.services`` off the byte path; read through the read-only admin
and the reports. Finding kinds are ``proxy.guard.findings.FindingKind`` values, unchanged.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from proxy.guard.findings import Action, FindingKind, Severity


class ProxyRequest(models.Model):
    """One client request through the proxy. Times in milliseconds; usage summed over attempts."""

    class Path(models.TextChoices):
        PASS_THROUGH = "pass-through"  # noqa: S105 - a path name, not a password
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
        INTERRUPTED = "interrupted"  # its proxy process stopped before the request ended (journal start, no end)
        REJECTED = "rejected"  # refused before any upstream call (bad request, unknown model)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False,
                          help_text="Also the x-request-id the client sees; generated before any write.")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey("tenants.ApiKey", null=True, on_delete=models.SET_NULL, related_name="+")
    member = models.ForeignKey("tenants.Membership", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+",
                               help_text="The person whose key made the request (blank: a tenant key).")
    member_username = models.CharField(max_length=150, blank=True, default="",
                                       help_text="The member's user name when the request was made (kept after "
                                                 "the membership is gone).")
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
    cache_read_tokens = models.PositiveIntegerField(default=0, help_text="Input tokens read from the prompt cache.")
    cache_write_tokens = models.PositiveIntegerField(default=0, help_text="Input tokens written to the prompt cache.")
    reasoning_tokens = models.PositiveIntegerField(default=0, help_text="Output tokens spent reasoning.")
    usage_estimated = models.BooleanField(default=False, help_text="Some attempt's usage was estimated (the "
                                                                    "upstream sent none, or nonsense).")
    cost_usd = models.DecimalField(max_digits=20, decimal_places=10, default=0,
                                   help_text="USD of every attempt (delivered + wasted), at the prices in force.")
    delivered_usd = models.DecimalField(max_digits=20, decimal_places=10, default=0,
                                        help_text="USD of the attempt the client got.")
    wasted_usd = models.DecimalField(max_digits=20, decimal_places=10, default=0,
                                     help_text="USD of attempts discarded as broken, cut or refused.")
    unpriced = models.BooleanField(default=False, help_text="Some attempt's model has no price: its cost is not "
                                                            "in cost_usd (never counted as $0).")
    error = models.TextField(blank=True)
    delivered = models.JSONField(
        null=True, blank=True,
        help_text="What the client received at the end: the canonical turn (capped), the exhaustion answer or "
                  "the error (shapes in audit/delivered.py); null when not recorded.")
    created = models.DateTimeField(default=timezone.now, db_index=True)
    finished = models.DateTimeField(null=True)

    class Meta:
        ordering = ["-created"]
        indexes = [
            models.Index(fields=["tenant", "-created"], name="req_tenant_created"),
            models.Index(fields=["member", "-created"], name="req_member_created"),
            models.Index(fields=["outcome", "-created"], name="req_outcome_created"),
            models.Index(fields=["upstream", "-created"], name="req_upstream_created"),
            models.Index(fields=["model", "-created"], name="req_model_created"),
            # The audit admin's other filters, each with the changelist's order.
            models.Index(fields=["path", "-created"], name="req_path_created"),
            models.Index(fields=["client_protocol", "-created"], name="req_protocol_created"),
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
    cache_read_tokens = models.PositiveIntegerField(default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0)
    reasoning_tokens = models.PositiveIntegerField(default=0)
    usage_estimated = models.BooleanField(default=False)
    cost_usd = models.DecimalField(max_digits=20, decimal_places=10, null=True, blank=True,
                                   help_text="USD at the price in force; blank: unpriced (no price for its model).")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["request_id", "number"]
        constraints = [models.UniqueConstraint(fields=["request", "number"], name="attempt_unique_number")]

    def __str__(self) -> str:
        # 1-based like everywhere a person reads it (``audit.display.attempt_ordinal``); ``number`` is 0-based.
        return f"attempt {self.number + 1} of #{self.request_id}: {self.outcome}"


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
    tool_name = models.CharField(max_length=200, blank=True, default="",
                                 help_text="The tool call's name when the relay knows it (blank otherwise).")
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["request_id", "id"]
        indexes = [
            models.Index(fields=["kind", "-created"], name="finding_kind_created"),
            # Tenant-scoped admin lists and the retention purge; severity / action admin filters.
            models.Index(fields=["tenant_id_copy", "-created"], name="finding_tenant_created"),
            models.Index(fields=["severity", "-created"], name="finding_severity_created"),
            models.Index(fields=["action", "-created"], name="finding_action_created"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} ({self.action})"


class Fragment(models.Model):
    """Raw upstream bytes kept per the tenant's policy (whole attempt body, capped), purged after retention."""

    attempt = models.OneToOneField(Attempt, on_delete=models.CASCADE, related_name="fragment")
    tenant_id_copy = models.BigIntegerField(db_index=True)
    body = models.TextField()
    truncated = models.BooleanField(default=False)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["tenant_id_copy", "created"], name="fragment_tenant_created")]

    def __str__(self) -> str:
        return f"body of {self.attempt}"


class Report(models.Model):
    """An analysis report of a period over some tenants and upstreams, built by a Celery task.

    The period is half-open, ``[since, until)``. No tenants means every tenant (only superusers
    may ask for that); no upstreams means every upstream of the chosen tenants. ``progress`` is a
    percentage, meaningful while ``running``. ``figures`` holds the JSON summary (``audit.reports``);
    ``file`` the export in ``format``, plus ``findings_file`` for CSV (requests and findings are two
    tables). Files live in the default storage (``MEDIA_ROOT``), served only through the admin.
    """

    class Format(models.TextChoices):
        CSV = "csv", "CSV (requests and findings)"
        JSON = "json", "JSON summary"
        HTML = "html", "HTML page with charts"

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    class Origin(models.TextChoices):
        ADMIN = "admin"
        COMMAND = "command"
        SCHEDULE = "schedule"

    since = models.DateTimeField()
    until = models.DateTimeField(help_text="Exclusive.")
    tenants = models.ManyToManyField("tenants.Tenant", blank=True, related_name="+",
                                     help_text="Blank: every tenant you can see.")
    upstreams = models.ManyToManyField("tenants.Upstream", blank=True, related_name="+",
                                       help_text="Blank: every upstream of the chosen tenants.")
    format = models.CharField(max_length=8, choices=Format.choices, default=Format.HTML)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.QUEUED, editable=False)
    progress = models.PositiveSmallIntegerField(default=0, editable=False, help_text="Percent.")
    error = models.TextField(blank=True, editable=False)
    figures = models.JSONField(null=True, blank=True, editable=False)
    file = models.FileField(upload_to="reports/%Y/%m/", blank=True, editable=False)
    findings_file = models.FileField(upload_to="reports/%Y/%m/", blank=True, editable=False)
    origin = models.CharField(max_length=8, choices=Origin.choices, default=Origin.ADMIN, editable=False)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+", editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False, db_index=True)
    started = models.DateTimeField(null=True, blank=True, editable=False)
    finished = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created"]
        constraints = [
            models.CheckConstraint(condition=models.Q(since__lt=models.F("until")), name="report_period_ordered"),
        ]

    def __str__(self) -> str:
        return f"report #{self.pk} {self.since:%Y-%m-%d} – {self.until:%Y-%m-%d} ({self.format})"

    def clean(self) -> None:
        """The period must not be empty."""
        if self.since and self.until and self.since >= self.until:
            raise ValidationError({"until": "Must be after “since”."})

    @property
    def is_finished(self) -> bool:
        """True once done or failed."""
        return self.status in (self.Status.DONE, self.Status.FAILED)
