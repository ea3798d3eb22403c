from __future__ import annotations

from django.apps import AppConfig


class TenantsConfig(AppConfig):
    """Tenants, API keys, upstreams, routes and guard policy; the one door for tenant scoping."""

    name = "tenants"
    verbose_name = "Tenants"

    def ready(self) -> None:
        from tenants import checks  # noqa: F401 - registers the system checks
