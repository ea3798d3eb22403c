"""The audit dashboard: the report figures for a chosen period and tenant, inside the admin.

Served at ``admin:audit_dashboard`` (registered by ``ProxyRequestAdmin.get_urls`` behind the admin's
staff login). Staff who see no tenant get 403; a tenant the user cannot see is refused by the form
exactly like a tenant id that does not exist.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from time import time as time_now
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Max, Min
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from audit.chart_links import ChartLinks
from audit.charts import usage_charts
from audit.exports import figure_context, wasted_cells, write_rows
from audit.incidents import KINDS, Incident, incident
from audit.models import Finding, ProxyRequest
from audit.people import usage_rows_by_member
from audit.reports import Scope, build_figures
from audit.usage import COLUMNS, usage_over_time, usage_rows
from tenants.models import Tenant, Upstream
from tenants.pools import live_rates
from tenants.scoping import request_scope

MAX_DAYS = 366
#: The default period looks back this far, and zooms in on the data when it covers less.
DEFAULT_SPAN = timedelta(hours=24)
#: The shortest default period (a burst of requests a minute ago is not one dot).
MIN_SPAN = timedelta(minutes=30)
#: Without data in the last 24 hours, the default is the span of the data, at most this long.
DATA_SPAN_MAX = timedelta(days=90)
#: (label, hours) of the preset links.
PRESETS = (("last hour", 1), ("last 24 hours", 24), ("last 7 days", 24 * 7), ("last 30 days", 24 * 30),
           ("last 90 days", 24 * 90))
_MINUTE = "%Y-%m-%dT%H:%M"


def _local_input() -> forms.DateTimeInput:
    return forms.DateTimeInput(format=_MINUTE, attrs={"type": "datetime-local"})


class DashboardForm(forms.Form):
    """A period and an optional tenant among the user's.

    ``since`` / ``until`` (UTC, until exclusive) or whole UTC days ``start`` / ``end`` (end
    inclusive); with neither, :func:`default_period`.
    """

    since = forms.DateTimeField(required=False, widget=_local_input(), label="From (UTC)")
    until = forms.DateTimeField(required=False, widget=_local_input(), label="Until (UTC)",
                                help_text="Exclusive.")
    start = forms.DateField(required=False, widget=forms.HiddenInput)
    end = forms.DateField(required=False, widget=forms.HiddenInput)
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), required=False, empty_label="All your tenants")

    def __init__(self, *args: Any, request: HttpRequest, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request = request
        field = self.fields["tenant"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = request_scope(request).tenants()

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("since") or data.get("until"):
            until = data.get("until") or timezone.now()
            since, until = data.get("since") or until - DEFAULT_SPAN, until
        elif data.get("start") or data.get("end"):
            end = data.get("end") or timezone.now().astimezone(UTC).date()
            start = data.get("start") or end
            since, until = _midnight(start), _midnight(end + timedelta(days=1))
        else:
            since, until = default_period(_tenant_ids(data, self.request))
        if since >= until:
            raise ValidationError("The start must be before the end.")
        if until - since > timedelta(days=MAX_DAYS):
            raise ValidationError(f"Choose at most {MAX_DAYS} days.")
        data["since"], data["until"] = since.astimezone(UTC), until.astimezone(UTC)
        return data


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def _tenant_ids(data: dict[str, Any], request: HttpRequest) -> tuple[int, ...] | None:
    tenant = data.get("tenant")
    ids = request_scope(request).seen
    return (tenant.pk,) if tenant is not None else None if ids is None else tuple(sorted(ids))


def _floor(moment: datetime, step: timedelta) -> datetime:
    moment = moment.astimezone(UTC).replace(second=0, microsecond=0)
    return moment.replace(minute=0) if step >= timedelta(hours=1) else moment


def default_period(tenant_ids: tuple[int, ...] | None, now: datetime | None = None) -> tuple[datetime, datetime]:
    """The last 24 hours, narrowed to the data when it covers less (at least ``MIN_SPAN``); with no
    data in the last 24 hours, the span of the data (at most ``DATA_SPAN_MAX``, ending at its newest
    request); with no data at all, the last 24 hours. Two indexed MIN/MAX queries."""
    now = _floor(now or timezone.now(), timedelta(minutes=1)) + timedelta(minutes=1)  # whole minutes
    rows = Scope(now - timedelta(days=MAX_DAYS * 10), now + timedelta(minutes=1), tenant_ids).requests()
    span = rows.aggregate(first=Min("created"), last=Max("created"))
    first, last = span["first"], span["last"]
    if last is None:
        return _floor(now - DEFAULT_SPAN, DEFAULT_SPAN), now
    if last >= now - DEFAULT_SPAN:
        recent = rows.filter(created__gte=now - DEFAULT_SPAN).aggregate(first=Min("created"))["first"] or last
        since = max(now - DEFAULT_SPAN, min(recent, now - MIN_SPAN))
        return _floor(since, now - since), now
    until = last + timedelta(minutes=1)
    since = max(first, until - DATA_SPAN_MAX)
    since = min(since, until - MIN_SPAN)
    return _floor(since, until - since), until


def dashboard_scope(data: dict[str, Any], request: HttpRequest) -> Scope:
    """The scope of a valid form: the chosen tenant, else every tenant the user sees."""
    return Scope(data["since"], data["until"], _tenant_ids(data, request))


def _preset_links(tenant: Any) -> list[tuple[str, str]]:
    now = timezone.now().astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    links = []
    for label, hours in PRESETS:
        query = {"since": (now - timedelta(hours=hours)).strftime(_MINUTE), "until": now.strftime(_MINUTE)}
        if tenant is not None:
            query["tenant"] = str(tenant.pk)
        links.append((label, "?" + urlencode(query)))
    return links


def _report_link(scope: Scope) -> str:
    query = {"since": scope.since.strftime("%Y-%m-%dT%H:%M"), "until": scope.until.strftime("%Y-%m-%dT%H:%M")}
    if scope.tenant_ids:
        query["tenants"] = ",".join(str(pk) for pk in scope.tenant_ids)
    return reverse("admin:audit_report_add") + "?" + urlencode(query)


def _live_rates(tenant_ids: tuple[int, ...] | None) -> list[dict[str, Any]]:
    """The live broken-turn rate per upstream and model the router sees (``tenants.pools.live_rates``) for
    the tenants in scope (None: all), at most 100 upstreams, worst first."""
    upstreams = Upstream.objects.filter(enabled=True).select_related("tenant").order_by("tenant__name", "name")
    if tenant_ids is not None:
        upstreams = upstreams.filter(tenant_id__in=tenant_ids)
    rows = live_rates(list(upstreams[:100]), time_now())
    return sorted(rows, key=lambda r: (-(r["rate"] if r["rate"] is not None else -1.0), r["upstream"], r["model"]))


def dashboard(request: HttpRequest, admin_site: AdminSite) -> HttpResponse:
    """Render the dashboard for the period and tenant in the query string (default: ``default_period``)."""
    if not request_scope(request).sees():
        raise PermissionDenied
    form = DashboardForm(request.GET, request=request)  # every field optional: no query = defaults
    context: dict[str, Any] = {**admin_site.each_context(request), "title": "Audit dashboard", "form": form}
    if form.is_valid():
        data = form.cleaned_data
        scope = dashboard_scope(data, request)
        tenant = data.get("tenant")
        links = ChartLinks(scope.since, scope.until, scope.bucket, tenant.pk if tenant is not None else None)
        context.update(figure_context(build_figures(scope), title="Audit dashboard", links=links))
        usage_query = {"since": scope.since.strftime(_MINUTE), "until": scope.until.strftime(_MINUTE),
                       **({"tenant": str(tenant.pk)} if tenant is not None else {})}
        context.update(live_rates=_live_rates(scope.tenant_ids))
        context.update(presets=_preset_links(tenant), report_link=_report_link(scope), tenant=tenant,
                       usage_link=reverse("admin:audit_usage") + "?" + urlencode(usage_query),
                       can_request_report=request_scope(request).manages(),
                       all_requests=links.requests(), problem_requests=links.requests(show="problems"),
                       # The inputs show the period in effect (also when it is the default).
                       form=DashboardForm(initial={"since": scope.since, "until": scope.until, "tenant": tenant},
                                          request=request))
    return TemplateResponse(request, "audit/dashboard.html", context)


#: The live page starts with the incidents of this recent past, read from the audit rows.
RECENT = timedelta(hours=24)
RECENT_MAX = 50
#: Where ``config/asgi.py`` routes the feed's WebSocket.
SOCKET_PATH = "/admin/audit/incidents/ws"


def _recent_incidents(tenant_ids: frozenset[int] | None) -> list[Incident]:
    """The newest exhausted and retried requests, broken loops and spent retry budgets of the last ``RECENT``
    (newest first),
    shaped as the feed's incidents."""
    since = timezone.now() - RECENT
    rows = ProxyRequest.objects.filter(created__gte=since, outcome__in=[ProxyRequest.Outcome.EXHAUSTED,
                                                                         ProxyRequest.Outcome.RECOVERED])
    loops = Finding.objects.filter(created__gte=since, kind__in=["agent-loop", "retry-budget-spent"])
    if tenant_ids is not None:
        rows, loops = rows.filter(tenant_id__in=tenant_ids), loops.filter(tenant_id_copy__in=tenant_ids)
    found = []
    for row in rows.order_by("-created")[:RECENT_MAX]:
        exhausted = row.outcome == ProxyRequest.Outcome.EXHAUSTED
        title = (f"Retries ran out after {row.attempts} attempt(s) ({row.model[:100]})" if exhausted
                 else f"Recovered by retry after {row.attempts} attempts ({row.model[:100]})")
        when = row.finished or row.created
        found.append(incident("exhausted" if exhausted else "retry", "error" if exhausted else "warning", title,
                              tenant_id=row.tenant_id, request_id=str(row.pk), upstream_id=row.upstream_id,
                              detail=row.error if exhausted else "", at=when.timestamp()))
    for finding in loops.select_related("request").order_by("-created")[:RECENT_MAX]:
        kind, title = (("loop-broken", "An agent loop was broken") if finding.kind == "agent-loop" else
                       ("retry-budget", "The tenant's retry budget is spent: broken answers get one attempt"))
        found.append(incident(kind, "warning", title, tenant_id=finding.tenant_id_copy,
                              request_id=str(finding.request_id), upstream_id=finding.request.upstream_id,
                              detail=finding.detail, at=finding.created.timestamp()))
    return sorted(found, key=lambda i: -i["at"])[:RECENT_MAX]


def incidents(request: HttpRequest, admin_site: AdminSite) -> HttpResponse:
    """The live incident feed: the recent incidents, then new ones over the WebSocket (``audit.consumers``)."""
    if not request_scope(request).sees():
        raise PermissionDenied
    scope = request_scope(request)
    ids, tenants = scope.seen, scope.tenants()
    upstreams = scope.limit(Upstream.objects.select_related("tenant"))
    context: dict[str, Any] = {
        **admin_site.each_context(request), "title": "Live incidents",
        "recent": _recent_incidents(ids),
        "names": {"tenants": {str(t.pk): t.name for t in tenants},
                  "upstreams": {str(u.pk): f"{u.tenant.slug} / {u.name}" for u in upstreams}},
        "request_url": reverse("admin:audit_proxyrequest_change", args=["00000000-0000-0000-0000-000000000000"]),
        "socket_path": SOCKET_PATH, "kinds": KINDS,
    }
    return TemplateResponse(request, "audit/incidents.html", context)


class UsageForm(DashboardForm):
    """The dashboard's period and tenant, and the dimension usage is grouped by."""

    group = forms.ChoiceField(choices=[("key", "virtual key"), ("member", "member"), ("tenant", "tenant"),
                                       ("model", "model"), ("upstream", "upstream")], required=False, label="Per")

    def clean_group(self) -> str:
        return self.cleaned_data.get("group") or "key"


def usage(request: HttpRequest, admin_site: AdminSite) -> HttpResponse:
    """Usage per key, member, tenant, model or upstream for the period (``audit.usage``), with charts; ``?format=csv``
    downloads the table through the safe CSV writer (``audit.exports``)."""
    if not request_scope(request).sees():
        raise PermissionDenied
    form = UsageForm(request.GET, request=request)
    context: dict[str, Any] = {**admin_site.each_context(request), "title": "Usage", "form": form}
    if not form.is_valid():
        return TemplateResponse(request, "audit/usage.html", context)
    data = form.cleaned_data
    scope = dashboard_scope(data, request)
    by_member = data["group"] == "member"
    rows = usage_rows_by_member(scope) if by_member else usage_rows(scope, data["group"])
    if request.GET.get("format") == "csv":
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        stamp = f"{scope.since:%Y%m%dT%H%M}-{scope.until:%Y%m%dT%H%M}"
        response["Content-Disposition"] = f'attachment; filename="usage-{data["group"]}-{stamp}.csv"'
        write_rows(response, (*COLUMNS, "incidents") if by_member else COLUMNS,  # type: ignore[arg-type]
                   wasted_cells(rows))
        return response
    query = request.GET.copy()
    query["format"] = "csv"
    context.update(rows=rows, group=data["group"], columns=COLUMNS, charts=usage_charts(rows, usage_over_time(scope)),
                   tenant=data.get("tenant"), csv_link="?" + query.urlencode(),
                   period={"since": scope.since, "until": scope.until, "bucket": scope.bucket})
    return TemplateResponse(request, "audit/usage.html", context)
