from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    """People-facing surfaces: the self-service key page (``api.account``) and the management REST API
    (``api.rest``, django-ninja) with its tenant-scoped admin tokens (``api.models.AdminToken``)."""

    name = "api"
    verbose_name = "Management API"
    default_auto_field = "django.db.models.BigAutoField"
