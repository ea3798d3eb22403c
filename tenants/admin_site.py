"""The admin site: login with an optional second factor, optional single sign-on, read-only login trail.

- Passwords go through ``authenticate`` with django-axes first in ``AUTHENTICATION_BACKENDS``, so
  failed logins are counted per account and address together and locked out (``AXES_*`` settings);
  beside that, an address with ``ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT`` failures (any accounts) within the
  cool-off gets axes' lockout answer for every login (``address_locked``).
- A staff user with a confirmed django-otp device (TOTP) must enter its code on the login page;
  with ``ADMIN_OTP_REQUIRED_FOR_SUPERUSERS`` a superuser without a device cannot log in. A wrong
  code counts as a failed login for axes. Sessions opened through single sign-on (OIDC,
  ``tenants.oidc``) count as verified for users who are not superusers (the identity provider does the
  second factor); a superuser's never does: superusers log in with password and code.
- When OIDC is configured (``OIDC_ENABLED``), the login page offers it.
- axes' login records (successes, failures, lockouts) are shown read-only to superusers.
- "toolrelay admin" branding, one Audit section that starts with the dashboard, and Celery beat's
  schedule models only where a broker runs them.

The site replaces Django's default one (``tenants.admin_config.ToolrelayAdminConfig`` in
``INSTALLED_APPS``, the documented way to replace the default site), so every ``@admin.register``
uses it.
"""

from __future__ import annotations

from typing import Any

from axes.admin import AccessAttemptAdmin, AccessFailureLogAdmin, AccessLogAdmin
from axes.helpers import get_client_ip_address, get_lockout_response
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import BACKEND_SESSION_KEY, user_login_failed
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django_otp import devices_for_user, user_has_device
from django_otp.forms import OTPAuthenticationFormMixin
from django_otp.models import Device

#: The audit section's order: the dashboard first, then the lists people open during an incident.
AUDIT_ORDER = ("Dashboard", "LiveIncidents", "Usage", "ProxyRequest", "Finding", "Report", "Fragment")
#: Apps shown first, in this order (the rest follow in Django's order).
APP_ORDER = ("audit", "tenants")
#: Apps whose models only do something with a Celery broker (periodic tasks run by beat).
BROKER_ONLY_APPS = frozenset({"django_celery_beat"})
#: The session's auth backend when the login came through single sign-on.
OIDC_BACKEND = "tenants.oidc.ToolrelayOIDCBackend"


def otp_required(user: Any) -> bool:
    """Must ``user`` present a second factor (has a device, or is a superuser and policy says so)?"""
    return bool(user_has_device(user) or (user.is_superuser and settings.ADMIN_OTP_REQUIRED_FOR_SUPERUSERS))


class LoginForm(AdminAuthenticationForm, OTPAuthenticationFormMixin):  # type: ignore[misc]
    """Username, password and, for users with a device, the one-time code (django-otp verifies it)."""

    #: Offered (filled by django-otp) only when the user has several devices.
    otp_device = forms.CharField(required=False, widget=forms.Select, label="Device")
    otp_token = forms.CharField(
        required=False, label="Authentication code", max_length=16,
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "numeric"}),
        help_text="The code from your authenticator app, if you have set up a second factor.")

    def _chosen_device(self, user: Any) -> Device | None:
        """The chosen device, or the user's only one (django-otp asks for an explicit choice)."""
        chosen: Device | None = super()._chosen_device(user)
        if chosen is None:
            devices = list(devices_for_user(user, confirmed=True))
            chosen = devices[0] if len(devices) == 1 else None
        return chosen

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean()
        user: Any = self.get_user()
        if user is None:
            return data
        if user_has_device(user):
            try:
                self.clean_otp(user)
            except ValidationError:
                # A wrong code is a failed login: axes counts it against the account and the address.
                user_login_failed.send(sender=type(self), credentials={"username": user.get_username()},
                                       request=self.request)
                raise
        elif otp_required(user):
            raise ValidationError("A second factor is required for superusers: ask another superuser to add a "
                                  "TOTP device for you (Django OTP › TOTP devices).", code="otp_required")
        return data


class ToolrelayAdminSite(admin.AdminSite):
    """The admin, with ``LoginForm`` and the second-factor rule on every page, branded, with the audit
    dashboard inside the Audit section."""

    site_header = "toolrelay admin"
    site_title = "toolrelay admin"
    index_title = "toolrelay admin"
    login_form = LoginForm
    login_template = "admin/toolrelay_login.html"
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

    def has_permission(self, request: HttpRequest) -> bool:
        if not super().has_permission(request):
            return False
        user: Any = request.user
        if request.session.get(BACKEND_SESSION_KEY) == OIDC_BACKEND:
            return not user.is_superuser  # single sign-on never stands in for a superuser's second factor
        if not otp_required(user):
            return True
        return bool(getattr(user, "is_verified", lambda: False)())

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "POST" and address_locked(request):
            locked: HttpResponse = get_lockout_response(
                request, credentials={"username": str(request.POST.get("username", ""))})
            return locked
        context = {"oidc_enabled": settings.OIDC_ENABLED, **(extra_context or {})}
        return super().login(request, extra_context=context)


def address_locked(request: HttpRequest) -> bool:
    """Has the request's address (as axes reads it: ``TRUSTED_PROXY_COUNT``) failed
    ``ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT`` logins, whatever the accounts, within ``AXES_COOLOFF_TIME``?"""
    address = get_client_ip_address(request)
    if not address:
        return False
    since = timezone.now() - settings.AXES_COOLOFF_TIME
    failures = AccessFailureLog.objects.filter(ip_address=address, attempt_time__gte=since)
    return bool(failures.count() >= settings.ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT)


def _audit_models(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        pages = [("Dashboard", "Dashboard", reverse("admin:audit_dashboard")),
                 ("Live incidents", "LiveIncidents", reverse("admin:audit_incidents")),
                 ("Usage", "Usage", reverse("admin:audit_usage"))]
    except NoReverseMatch:
        return models
    extra = [{"name": name, "object_name": object_name, "admin_url": url, "add_url": None, "view_only": True,
              "perms": {"view": True}} for name, object_name, url in pages]
    rank = {name: n for n, name in enumerate(AUDIT_ORDER)}
    return sorted([*extra, *models], key=lambda m: rank.get(m["object_name"], len(rank)))


class _ReadOnly:
    """Records are evidence: nobody edits them in the admin (axes' lockouts can still be deleted,
    which is how a superuser unlocks an account)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class LoginAttemptAdmin(_ReadOnly, AccessAttemptAdmin):  # type: ignore[misc]
    """Current failure counters and lockouts (delete one to unlock)."""


class LoginLogAdmin(_ReadOnly, AccessLogAdmin):  # type: ignore[misc]
    """Successful logins and logouts."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class LoginFailureLogAdmin(_ReadOnly, AccessFailureLogAdmin):  # type: ignore[misc]
    """Every failed login, with address, user agent and whether it was locked out."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def register_login_trail(site: admin.AdminSite) -> None:
    """Show axes' records read-only on ``site`` (replacing axes' own, editable registrations)."""
    for model, model_admin in ((AccessAttempt, LoginAttemptAdmin), (AccessLog, LoginLogAdmin),
                               (AccessFailureLog, LoginFailureLogAdmin)):
        if site.is_registered(model):
            site.unregister(model)
        site.register(model, model_admin)
