"""The admin app with toolrelay's site as the default (its own module: an apps module may declare
only one default AppConfig, and the site module imports models, which app loading must not)."""

from __future__ import annotations

from django.contrib.admin.apps import AdminConfig


class ToolrelayAdminConfig(AdminConfig):
    """Django's admin with ``tenants.admin_site.ToolrelayAdminSite`` (second factor, single sign-on,
    login trail) as ``admin.site``."""

    default_site = "tenants.admin_site.ToolrelayAdminSite"
