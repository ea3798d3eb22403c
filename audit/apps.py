from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    """Proxy requests, attempts, findings and reports."""

    name = "audit"
    verbose_name = "Audit"
