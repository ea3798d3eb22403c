"""The audit dashboard: the report figures for a chosen period and tenant, inside the admin.

Served at ``admin:audit_dashboard`` (registered by ``ProxyRequestAdmin.get_urls`` behind the admin's
staff login). Staff who see no tenant get 403; a tenant the user cannot see is refused by the form
exactly like a tenant id that does not exist.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from audit.exports import figure_context
from audit.reports import Scope, build_figures
from audit.scoping import can_manage_audit, can_view_audit, visible_tenant_ids, visible_tenants
from tenants.models import Tenant

DEFAULT_DAYS = 7
MAX_DAYS = 366
PRESETS = (1, 7, 30, 90)


class DashboardForm(forms.Form):
    """A period of whole UTC days (``end`` inclusive) and an optional tenant among the user's."""

    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}),
                          help_text="Inclusive (UTC days).")
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), required=False, empty_label="All your tenants")

    def __init__(self, *args: Any, request: HttpRequest, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["tenant"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = visible_tenants(request)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        today = timezone.now().astimezone(UTC).date()
        end = data.get("end") or today
        start = data.get("start") or end - timedelta(days=DEFAULT_DAYS - 1)
        if start > end:
            raise ValidationError("The start must not be after the end.")
        if (end - start).days >= MAX_DAYS:
            raise ValidationError(f"Choose at most {MAX_DAYS} days.")
        data["start"], data["end"] = start, end
        return data


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def dashboard_scope(data: dict[str, Any], request: HttpRequest) -> Scope:
    """The scope of a valid form: the chosen tenant, else every tenant the user sees."""
    tenant = data.get("tenant")
    ids = visible_tenant_ids(request)
    tenant_ids = (tenant.pk,) if tenant is not None else None if ids is None else tuple(sorted(ids))
    return Scope(_midnight(data["start"]), _midnight(data["end"] + timedelta(days=1)), tenant_ids)


def _preset_links(request: HttpRequest, tenant: Any) -> list[tuple[str, str]]:
    today = timezone.now().astimezone(UTC).date()
    links = []
    for days in PRESETS:
        query = {"start": (today - timedelta(days=days - 1)).isoformat(), "end": today.isoformat()}
        if tenant is not None:
            query["tenant"] = str(tenant.pk)
        links.append(("today" if days == 1 else f"last {days} days", "?" + urlencode(query)))
    return links


def _report_link(scope: Scope) -> str:
    query = {"since": scope.since.strftime("%Y-%m-%dT%H:%M"), "until": scope.until.strftime("%Y-%m-%dT%H:%M")}
    if scope.tenant_ids:
        query["tenants"] = ",".join(str(pk) for pk in scope.tenant_ids)
    return reverse("admin:audit_report_add") + "?" + urlencode(query)


def dashboard(request: HttpRequest, admin_site: AdminSite) -> HttpResponse:
    """Render the dashboard for the period and tenant in the query string (default: last 7 days)."""
    if not can_view_audit(request):
        raise PermissionDenied
    form = DashboardForm(request.GET, request=request)  # every field optional: no query = defaults
    context: dict[str, Any] = {**admin_site.each_context(request), "title": "Audit dashboard", "form": form}
    if form.is_valid():
        data = form.cleaned_data
        scope = dashboard_scope(data, request)
        context.update(figure_context(build_figures(scope), title="Audit dashboard"))
        context.update(presets=_preset_links(request, data.get("tenant")), report_link=_report_link(scope),
                       tenant=data.get("tenant"), can_request_report=can_manage_audit(request))
    return TemplateResponse(request, "audit/dashboard.html", context)
