"""The admin site: "toolrelay admin" branding, one Audit section that starts with the dashboard, and
Celery beat's schedule models only where a broker runs them.

Installed in place of ``django.contrib.admin`` (``ToolrelayAdminConfig`` in ``INSTALLED_APPS``), the
documented way to replace the default site: every ``@admin.register`` in the apps lands here.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

#: The audit section's order: the dashboard first, then the lists people open during an incident.
AUDIT_ORDER = ("Dashboard", "ProxyRequest", "Finding", "Report", "Fragment")
#: Apps shown first, in this order (the rest follow in Django's order).
APP_ORDER = ("audit", "tenants")
#: Apps whose models only do something with a Celery broker (periodic tasks run by beat).
BROKER_ONLY_APPS = frozenset({"django_celery_beat"})


class ToolrelayAdminSite(admin.AdminSite):
    """The default admin site, branded, with the audit dashboard inside the Audit section."""

    site_header = "toolrelay admin"
    site_title = "toolrelay admin"
    index_title = "toolrelay admin"
    # The sidebar takes 300 px of every page; the incident lists need them (the index and the
    # breadcrumbs still lead everywhere).
    enable_nav_sidebar = False
    site_url = None  # nothing is served at "/": no "View site" link

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        """Django's list, less the broker-only apps when no broker is configured, with a Dashboard
        entry leading the Audit section (the index, the app page and the sidebar all use this)."""
        apps = super().get_app_list(request, app_label)
        if not settings.CELERY_BROKER_URL:
            apps = [app for app in apps if app["app_label"] not in BROKER_ONLY_APPS]
        for app in apps:
            if app["app_label"] == "audit":
                app["models"] = _audit_models(app["models"])
        first = {label: n for n, label in enumerate(APP_ORDER)}
        return sorted(apps, key=lambda app: first.get(app["app_label"], len(first)))


def _audit_models(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        url = reverse("admin:audit_dashboard")
    except NoReverseMatch:
        return models
    dashboard = {"name": "Dashboard", "object_name": "Dashboard", "admin_url": url, "add_url": None,
                 "view_only": True, "perms": {"view": True}}
    rank = {name: n for n, name in enumerate(AUDIT_ORDER)}
    return sorted([dashboard, *models], key=lambda m: rank.get(m["object_name"], len(rank)))


class ToolrelayAdminConfig(AdminConfig):
    """``django.contrib.admin`` with :class:`ToolrelayAdminSite` as the default site."""

    default_site = "config.admin_site.ToolrelayAdminSite"
