"""Read-only audit admin (requests, findings, raw fragments), the dashboard, and reports.

Scoping: superusers see every tenant; other staff see the tenants they are members of
(``tenants.scoping``, the one door). Rows of other tenants are not in the
querysets at all, so their pages answer exactly like a missing primary key. Audit rows cannot be
added, changed or deleted here. The tables grow to millions of rows: lists never count them in full
(``CappedCountPaginator``, ``show_full_result_count = False``), filters offer choices read from a
bounded sample or from small tables, and every filter has an index that also serves the order.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, TypeVar

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import ModelAdmin, TabularInline
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import models
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from audit import views
from audit.display import (
    PROBLEM_OUTCOMES,
    attempt_ordinal,
    duration,
    pill,
    tokens,
    wasted_tokens,
    wasted_usage_unknown,
)
from audit.fragments import CSS, render_context, render_fragment, render_frames, split_frames
from audit.models import Attempt, Finding, Fragment, ProxyRequest, Report
from audit.report_services import report_delete
from audit.tasks import report_enqueue
from audit.timeline import render_delivered, render_timeline
from proxy.guard.policy import FragmentStorage
from tenants.models import Tenant, Upstream
from tenants.scoping import request_scope

_M = TypeVar("_M", bound=models.Model)


class CappedCountPaginator(Paginator):  # type: ignore[type-arg]  # not subscriptable at runtime
    """Counts at most ``CAP`` rows (``SELECT count(*) FROM (… LIMIT CAP)``), never a whole audit table.

    Past the cap the list shows ``CAP`` results and its last page; filters narrow it down.
    """

    CAP = 10_000

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if isinstance(rows, QuerySet):
            return rows.order_by()[: self.CAP].count()
        return min(len(rows), self.CAP)


# ----- filters -----

class TenantFilter(admin.SimpleListFilter):
    """The user's tenants only (never other tenants' names); ``tenant_field`` holds the tenant id."""

    title = "tenant"
    parameter_name = "tenant"
    tenant_field = "tenant_id"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        return [(t.pk, t.name) for t in request_scope(request).tenants()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(**{self.tenant_field: int(value)}) if value.isdigit() else queryset.none()


class CopiedTenantFilter(TenantFilter):
    """Tenant filter on the denormalised ``tenant_id_copy`` of findings and fragments."""

    tenant_field = "tenant_id_copy"


class UpstreamFilter(admin.SimpleListFilter):
    """Upstreams of the user's tenants (a small table)."""

    title = "upstream"
    parameter_name = "upstream"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        rows = request_scope(request).limit(Upstream.objects.select_related("tenant"))
        return [(u.pk, f"{u.tenant.slug} / {u.name}") for u in rows]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(upstream_id=int(value)) if value.isdigit() else queryset.none()


class RecentValuesFilter(admin.SimpleListFilter):
    """Choices are the values seen in the newest ``SAMPLE`` rows (bounded cost); any value filters."""

    SAMPLE = 5000
    field = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        recent = (model_admin.get_queryset(request).order_by("-created")
                  .values_list(self.field, flat=True)[: self.SAMPLE])
        return [(value, value or "(blank)") for value in sorted(set(recent))[:50]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if value is None else queryset.filter(**{self.field: value})


class DefaultOnFilter(admin.SimpleListFilter):
    """A filter with a default choice that applies when the query string says nothing (``DEFAULT``),
    unless an explicit search or one of ``yields_to`` (query parameters) is given: asking for a request
    id or an exact outcome must never come back empty because of the default."""

    DEFAULT = ""
    yields_to: tuple[str, ...] = ()

    def current(self, query: Mapping[str, Any]) -> str:
        """The effective choice given the query string: its own value, else the default, or "all"
        when a search or a parameter in ``yields_to`` is given."""
        value = self.value()
        if value is not None:
            return value
        explicit = any(key.startswith(self.yields_to) for key in query) if self.yields_to else False
        return "all" if explicit or query.get("q") else self.DEFAULT

    def choices(self, changelist: Any) -> Any:
        current = self.current(changelist.params)
        for lookup, title in self.lookup_choices:
            yield {"selected": current == lookup, "display": title,
                   "query_string": changelist.get_query_string({self.parameter_name: lookup})}


class ProblemsFilter(DefaultOnFilter):
    """Problems only (the default): repaired, recovered by retry, exhausted, upstream errors, rejected."""

    title = "problems"
    parameter_name = "show"
    DEFAULT = "problems"
    yields_to = ("outcome",)

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("problems", "Problems only"), ("all", "All requests")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.current(request.GET) == "problems":
            return queryset.filter(outcome__in=PROBLEM_OUTCOMES)
        return queryset


class SeverityFilter(DefaultOnFilter):
    """Warnings and errors (the default), one severity, or everything including ``info`` normalisations."""

    title = "severity"
    parameter_name = "severity"
    DEFAULT = "warning+error"
    yields_to = ("kind", "action")

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("warning+error", "Warnings and errors"), ("error", "Errors"), ("warning", "Warnings"),
                ("info", "Info (normalised quirks)"), ("all", "All")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        current = self.current(request.GET)
        if current == "all":
            return queryset
        return queryset.filter(severity__in=current.split("+"))


class ModelNameFilter(RecentValuesFilter):
    title = "model"
    parameter_name = "model"
    field = "model"


class ProtocolFilter(RecentValuesFilter):
    title = "client protocol"
    parameter_name = "protocol"
    field = "client_protocol"


# ----- shared read-only behaviour -----

class AuditAdmin(ModelAdmin[_M]):
    """Read-only, tenant-scoped; ``tenant_field`` is the model's tenant id column."""

    tenant_field = "tenant_id"
    paginator = CappedCountPaginator
    show_full_result_count = False
    # Facet counts would count every filter choice over the whole table.
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 50

    def get_queryset(self, request: HttpRequest) -> QuerySet[_M]:
        return request_scope(request).limit(super().get_queryset(request), self.tenant_field)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request_scope(request).sees()

    def has_view_permission(self, request: HttpRequest, obj: _M | None = None) -> bool:
        return request_scope(request).sees()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: _M | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: _M | None = None) -> bool:
        return False


class ReadOnlyInline(TabularInline[_M, Any]):
    """An inline that only shows rows."""

    extra = 0
    can_delete = False
    show_change_link = False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request_scope(request).sees()

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _parse_uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        return None


#: The short id the lists show (``short_id``, ``request_link``): the first 8 hex digits of the request id.
SHORT_ID = 8
_HEX = frozenset("0123456789abcdef")


def _id_range(text: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The request ids starting with ``text``, ``SHORT_ID`` to 31 hex digits (dashes ignored), as an
    inclusive ``(lowest, highest)`` range: a range scan on the primary key, never a LIKE."""
    digits = text.strip().lower().replace("-", "")
    if not SHORT_ID <= len(digits) < 32 or not set(digits) <= _HEX:
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def _admin_link(obj: models.Model, text: str) -> SafeString:
    opts = obj._meta
    return format_html('<a href="{}">{}</a>', reverse(f"admin:{opts.app_label}_{opts.model_name}_change",
                                                      args=[obj.pk]), text)


# ----- requests -----

class FindingInline(ReadOnlyInline[Finding]):
    """A request's findings; each links to its fragment viewer."""

    model = Finding
    fields = ("attempt_number", "kind", "severity", "action", "tool_name", "frame", "byte_offset", "detail")
    readonly_fields = ("attempt_number",)
    show_change_link = True

    def get_queryset(self, request: HttpRequest) -> QuerySet[Finding]:
        return super().get_queryset(request).select_related("attempt").defer("fragment")

    @admin.display(description="attempt")
    def attempt_number(self, obj: Finding) -> Any:
        return attempt_ordinal(obj.attempt.number) if obj.attempt is not None else "–"


def _short(text: str, width: int) -> SafeString:
    """``text`` cut to ``width`` characters, the whole text in the tooltip."""
    shown = text if len(text) <= width else text[: width - 1] + "…"
    return format_html('<span title="{}">{}</span>', text, shown)


def _moment(when: Any) -> SafeString:
    """A compact UTC time (``01-02 13:04:05``), the full one in the tooltip."""
    return format_html('<span title="{}">{}</span>', when.isoformat(), when.strftime("%m-%d %H:%M:%S"))


@admin.register(ProxyRequest)
class ProxyRequestAdmin(AuditAdmin[ProxyRequest]):
    """Client requests through the proxy, newest first, problems only unless asked; the page shows
    the attempts as a timeline, what the client received, and the findings inline."""

    list_display = ("short_id", "when", "where", "model_short", "outcome_pill", "attempts", "status", "ttft",
                    "wasted")
    list_display_links = ("short_id",)
    list_filter = (ProblemsFilter, TenantFilter, UpstreamFilter, ModelNameFilter, "outcome", "path", ProtocolFilter,
                   ("created", admin.DateFieldListFilter))
    list_select_related = ("tenant", "upstream")
    search_fields = ("=model",)
    search_help_text = ("A request id (the x-request-id a client saw, or its first 8 characters as the lists show) "
                        "or an exact model name.")
    inlines = (FindingInline,)
    readonly_fields = ("outcome_pill", "ttft", "total", "wasted_time", "token_counts", "wasted", "timeline",
                       "delivered_view", "body_capture")
    # The incident first: what happened and what the client got; identifiers and client details last.
    fieldsets = (
        (None, {"fields": ("id", "created", "tenant", "upstream", "model", "path", "outcome_pill", "status",
                           "attempts", "error")}),
        ("What the client received", {"fields": ("delivered_view",)}),
        ("Attempts", {"fields": ("timeline", "body_capture")}),
        ("Cost", {"fields": ("ttft", "total", "token_counts", "wasted", "wasted_time")}),
        ("Details", {"fields": ("finished", "api_key", "route", "upstream_model", "client_protocol",
                                "client_user_agent")}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[ProxyRequest]:
        return super().get_queryset(request).annotate(usage_gap=wasted_usage_unknown())

    @admin.display(description="request", ordering="id")
    def short_id(self, obj: ProxyRequest) -> str:
        return str(obj.pk)[:SHORT_ID]

    @admin.display(description="time (UTC)", ordering="created")
    def when(self, obj: ProxyRequest) -> SafeString:
        return _moment(obj.created)

    @admin.display(description="tenant / upstream")
    def where(self, obj: ProxyRequest) -> SafeString:
        return _short(f"{obj.tenant.slug}/{obj.upstream.name if obj.upstream else '–'}", 26)

    @admin.display(description="model", ordering="model")
    def model_short(self, obj: ProxyRequest) -> SafeString:
        return _short(obj.model, 24)

    @admin.display(description="outcome", ordering="outcome")
    def outcome_pill(self, obj: ProxyRequest) -> SafeString:
        return pill(obj.outcome)

    @admin.display(description="TTFT", ordering="ttft_ms")
    def ttft(self, obj: ProxyRequest) -> str:
        return duration(obj.ttft_ms)

    @admin.display(description="total time", ordering="total_ms")
    def total(self, obj: ProxyRequest) -> str:
        return duration(obj.total_ms)

    @admin.display(description="time on failed attempts")
    def wasted_time(self, obj: ProxyRequest) -> str:
        return duration(obj.wasted_ms)

    @admin.display(description="wasted tokens", ordering="wasted_completion_tokens")
    def wasted(self, obj: ProxyRequest) -> str:
        return wasted_tokens(obj.wasted_completion_tokens, int(bool(getattr(obj, "usage_gap", False))))

    @admin.display(description="tokens (prompt / completion)")
    def token_counts(self, obj: ProxyRequest) -> str:
        known = not (obj.attempts and obj.prompt_tokens == 0 and obj.completion_tokens == 0)
        return f"{tokens(obj.prompt_tokens, known=known)} / {tokens(obj.completion_tokens, known=known)}"

    @admin.display(description="timeline")
    def timeline(self, obj: ProxyRequest) -> SafeString:
        attempts = list(Attempt.objects.filter(request=obj).select_related("upstream"))
        bodies = dict(Fragment.objects.filter(attempt__request=obj).values_list("attempt_id", "pk"))
        return render_timeline(obj, attempts, bodies)

    @admin.display(description="answer")
    def delivered_view(self, obj: ProxyRequest) -> SafeString:
        return render_delivered(obj)

    @admin.display(description="raw bodies")
    def body_capture(self, obj: ProxyRequest) -> SafeString:
        """Whether whole upstream bodies are kept for this request's route, and how to turn it on."""
        overrides = obj.route.policy_overrides() if obj.route is not None else None
        storage = obj.tenant.policy(overrides).fragments
        if storage == FragmentStorage.ATTEMPT:
            return mark_safe("Kept for every attempt (fragment storage <code>attempt</code>), up to "
                             "<code>AUDIT_BODY_CAP</code> bytes each; purged after the retention days.")
        return format_html(
            "Only the frames findings point at are kept (fragment storage <code>{}</code>). To keep every "
            "attempt's whole body, set <em>Fragment storage</em> to <code>attempt</code> on the tenant "
            "(<em>Guard policy defaults</em>) or on this request's model route; bodies are capped at "
            "<code>AUDIT_BODY_CAP</code> bytes and purged after the tenant's retention days.", storage.value)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[ProxyRequest],
                           search_term: str) -> tuple[QuerySet[ProxyRequest], bool]:
        # Exact matches only: a pk lookup or the (model, -created) index, never a LIKE scan.
        if not search_term.strip():
            return queryset, False
        request_id = _parse_uuid(search_term)
        if request_id is not None:
            return queryset.filter(pk=request_id), False
        ids = _id_range(search_term)
        if ids is not None:
            return queryset.filter(pk__range=ids), False
        return queryset.filter(model=search_term.strip()), False

    def get_urls(self) -> list[URLPattern]:
        dashboard = path("dashboard/", self.admin_site.admin_view(self.dashboard_view), name="audit_dashboard")
        live = path("incidents/", self.admin_site.admin_view(self.incidents_view), name="audit_incidents")
        usage = path("usage/", self.admin_site.admin_view(self.usage_view), name="audit_usage")
        return [dashboard, live, usage, *super().get_urls()]

    def usage_view(self, request: HttpRequest) -> HttpResponse:
        """Usage per key, tenant, model or upstream (``audit.views.usage``) inside the admin's chrome."""
        return views.usage(request, self.admin_site)

    def incidents_view(self, request: HttpRequest) -> HttpResponse:
        """The live incident feed (``audit.views.incidents``) inside the admin's chrome."""
        return views.incidents(request, self.admin_site)

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """The dashboard (``audit.views.dashboard``) inside the admin's chrome."""
        return views.dashboard(request, self.admin_site)


# ----- findings and fragments -----

@admin.register(Finding)
class FindingAdmin(AuditAdmin[Finding]):
    """Findings, filterable by kind, severity and action; the page shows the offending frame."""

    tenant_field = "tenant_id_copy"
    list_display = ("id", "when", "kind", "severity_pill", "action", "tool_name", "tenant", "request_link",
                    "attempt_number", "frame", "detail_short")
    list_filter = (SeverityFilter, CopiedTenantFilter, "kind", "action", ("created", admin.DateFieldListFilter))
    list_select_related = ("attempt",)
    ordering = ("-created",)
    search_fields = ("=tool_name",)
    search_help_text = "A request id (or its first 8 characters) or an exact tool name."
    fields = ("request_link", "attempt_number", "created", "kind", "severity", "action", "tool_name", "choice",
              "slot", "frame", "byte_offset", "detail", "offending_frame", "context")
    readonly_fields = ("request_link", "attempt_number", "offending_frame", "context")

    class Media:
        css = {"all": [CSS]}

    @admin.display(description="tenant")
    def tenant(self, obj: Finding) -> str:
        return getattr(obj, "tenant_name", None) or "–"

    @admin.display(description="time (UTC)", ordering="created")
    def when(self, obj: Finding) -> SafeString:
        return _moment(obj.created)

    @admin.display(description="severity", ordering="severity")
    def severity_pill(self, obj: Finding) -> SafeString:
        return pill(obj.severity)

    @admin.display(description="detail")
    def detail_short(self, obj: Finding) -> SafeString:
        return _short(obj.detail, 90)

    @admin.display(description="request")
    def request_link(self, obj: Finding) -> SafeString:
        return format_html('<a href="{}">{}</a>', reverse("admin:audit_proxyrequest_change", args=[obj.request_id]),
                           str(obj.request_id)[:SHORT_ID])

    @admin.display(description="attempt")
    def attempt_number(self, obj: Finding) -> Any:
        return attempt_ordinal(obj.attempt.number) if obj.attempt is not None else "–"

    @admin.display(description="offending frame")
    def offending_frame(self, obj: Finding) -> SafeString:
        return render_fragment(obj.fragment, frame=obj.frame, offset=obj.byte_offset, label=obj.kind)

    @admin.display(description="in the attempt's body")
    def context(self, obj: Finding) -> SafeString | str:
        if obj.frame is None or not obj.attempt_id:
            return "–"
        body = Fragment.objects.filter(attempt_id=obj.attempt_id).values_list("body", flat=True).first()
        if body is None:
            return "The attempt's whole body was not kept (tenant policy) or was purged."
        return render_context(body, frame=obj.frame, label=obj.kind)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Finding],
                           search_term: str) -> tuple[QuerySet[Finding], bool]:
        if not search_term.strip():
            return queryset, False
        request_id = _parse_uuid(search_term)
        if request_id is not None:
            return queryset.filter(request_id=request_id), False
        ids = _id_range(search_term)
        if ids is not None:
            return queryset.filter(request_id__gte=ids[0], request_id__lte=ids[1]), False
        return queryset.filter(tool_name=search_term.strip()), False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Finding]:
        # The tenant's name through the denormalised id: a subquery per shown row, no join on requests.
        name = Tenant.objects.filter(pk=OuterRef("tenant_id_copy")).values("name")[:1]
        return super().get_queryset(request).annotate(tenant_name=Subquery(name))


@admin.register(Fragment)
class FragmentAdmin(AuditAdmin[Fragment]):
    """Raw attempt bodies kept per policy: every frame pretty-printed, the findings' frames marked."""

    tenant_field = "tenant_id_copy"
    list_display = ("id", "created", "request_link", "attempt_number", "truncated")
    list_filter = (CopiedTenantFilter, ("created", admin.DateFieldListFilter))
    list_select_related = ("attempt",)
    ordering = ("-created",)
    fields = ("request_link", "attempt_number", "created", "truncated", "frames")
    readonly_fields = fields

    class Media:
        css = {"all": [CSS]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Fragment]:
        return super().get_queryset(request).defer("body")

    @admin.display(description="request")
    def request_link(self, obj: Fragment) -> SafeString:
        request_id = obj.attempt.request_id
        return format_html('<a href="{}">{}</a>', reverse("admin:audit_proxyrequest_change", args=[request_id]),
                           str(request_id)[:SHORT_ID])

    @admin.display(description="attempt")
    def attempt_number(self, obj: Fragment) -> int:
        return attempt_ordinal(obj.attempt.number)

    @admin.display(description="frames")
    def frames(self, obj: Fragment) -> SafeString:
        marks: dict[int, list[str]] = {}
        for frame, kind in Finding.objects.filter(attempt_id=obj.attempt_id, frame__isnull=False).values_list(
                "frame", "kind"):
            if frame is not None:
                marks.setdefault(frame, []).append(kind)
        return render_frames(split_frames(obj.body), marks)


# ----- reports -----

class ReportForm(forms.ModelForm):  # type: ignore[type-arg]
    """Period, tenants, upstreams and format; choices limited to what the user can see.

    The period fields are single ``datetime-local`` inputs (not the admin's split widget), so the
    dashboard's "request a report of this period" link can prefill them from the query string.
    """

    since = forms.DateTimeField(help_text="UTC.", widget=forms.DateTimeInput(
        format="%Y-%m-%dT%H:%M", attrs={"type": "datetime-local"}))
    until = forms.DateTimeField(help_text="UTC, exclusive.", widget=forms.DateTimeInput(
        format="%Y-%m-%dT%H:%M", attrs={"type": "datetime-local"}))

    class Meta:
        model = Report
        fields = ("since", "until", "tenants", "upstreams", "format")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        tenants, upstreams = data.get("tenants"), data.get("upstreams")
        if tenants and upstreams and any(u.tenant_id not in {t.pk for t in tenants} for u in upstreams):
            raise ValidationError({"upstreams": "Choose upstreams of the chosen tenants."})
        return data


@admin.register(Report)
class ReportAdmin(ModelAdmin[Report]):
    """Reports: requested here (built by Celery), shown with status, progress and download links.

    A report is visible to a user when every tenant it covers is one of theirs; a report over all
    tenants (none chosen) only to superusers. Only superusers delete reports (with their files).
    """

    form = ReportForm
    list_display = ("id", "when", "period", "tenant_list", "format", "status_display", "downloads", "origin",
                    "requested_by")
    list_filter = ("status", "format", "origin")
    list_select_related = ("requested_by",)
    actions = ("build_again",)
    paginator = CappedCountPaginator
    show_full_result_count = False
    view_fields = ("period", "tenant_list", "upstream_list", "format", "status_display", "error", "downloads",
                   "origin", "requested_by", "created", "started", "finished")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Report]:
        queryset = super().get_queryset(request).prefetch_related("tenants", "upstreams")
        ids = request_scope(request).seen
        if ids is None:
            return queryset
        links = Report.tenants.through.objects
        theirs = links.filter(tenant_id__in=ids).values("report_id")
        others = links.exclude(tenant_id__in=ids).values("report_id")
        return queryset.filter(pk__in=theirs).exclude(pk__in=others)

    def get_fields(self, request: HttpRequest, obj: Report | None = None) -> Any:
        return ReportForm.Meta.fields if obj is None else self.view_fields

    def get_readonly_fields(self, request: HttpRequest, obj: Report | None = None) -> Any:
        return () if obj is None else self.view_fields

    def formfield_for_manytomany(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "tenants":
            kwargs["queryset"] = request_scope(request).tenants(managed=True)
        elif db_field.name == "upstreams":
            upstreams = Upstream.objects.select_related("tenant")
            kwargs["queryset"] = request_scope(request).limit(upstreams, managed=True)
        return super().formfield_for_manytomany(db_field, request, **kwargs)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request_scope(request).sees()

    def has_view_permission(self, request: HttpRequest, obj: Report | None = None) -> bool:
        return request_scope(request).sees()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request_scope(request).manages()  # viewers only read

    def has_change_permission(self, request: HttpRequest, obj: Report | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Report | None = None) -> bool:
        return request_scope(request).everything

    def has_build_permission(self, request: HttpRequest) -> bool:
        return request_scope(request).manages()

    #: Seconds between reloads of the list and of a report's page while a report builds.
    refresh_seconds = 3
    #: Reports queued longer than this (a stopped worker) no longer keep the list reloading.
    refresh_window = timedelta(hours=1)

    def building(self, request: HttpRequest, queryset: QuerySet[Report] | None = None) -> bool:
        """True while one of the user's reports is running, or queued recently."""
        rows = self.get_queryset(request) if queryset is None else queryset
        recent = timezone.now() - self.refresh_window
        running = Q(status=Report.Status.RUNNING) | Q(status=Report.Status.QUEUED, created__gte=recent)
        return rows.filter(running).exists()

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The list reloads itself every ``refresh_seconds`` while a report builds."""
        refresh = self.refresh_seconds if self.building(request) else None
        return super().changelist_view(request, {**(extra_context or {}), "refresh_seconds": refresh})

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """A report's page reloads itself until the report is done or failed."""
        rows = self.get_queryset(request).filter(pk=object_id) if str(object_id).isdigit() else Report.objects.none()
        refresh = self.refresh_seconds if self.building(request, rows) else None
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), "refresh_seconds": refresh})

    def save_model(self, request: HttpRequest, obj: Report, form: Any, change: bool) -> None:
        obj.requested_by_id = request.user.pk
        obj.origin = Report.Origin.ADMIN
        obj.save()

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        report = form.instance
        scope = request_scope(request)
        if not report.tenants.exists() and not scope.everything:
            report.tenants.set(scope.tenants(managed=True))  # "all" for a member = all the tenants they manage
        report_enqueue(report=report)

    def delete_model(self, request: HttpRequest, obj: Report) -> None:
        report_delete(report=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Report]) -> None:
        for report in queryset:
            report_delete(report=report)

    @admin.action(description="Build the selected reports again", permissions=["build"])
    def build_again(self, request: HttpRequest, queryset: QuerySet[Report]) -> None:
        """Re-queue the selected reports (e.g. failed ones, or ones a stopped process left running) that
        cover only tenants the user manages."""
        managed = request_scope(request).managed
        if managed is not None:
            others = Report.tenants.through.objects.exclude(tenant_id__in=managed).values("report_id")
            queryset = queryset.exclude(pk__in=others)
        count = 0
        for report in queryset:
            report_enqueue(report=report)
            count += 1
        self.message_user(request, f"Queued {count} report(s).", messages.SUCCESS)

    @admin.display(description="created (UTC)", ordering="created")
    def when(self, obj: Report) -> SafeString:
        return _moment(obj.created)

    @admin.display(description="period")
    def period(self, obj: Report) -> SafeString:
        """``since – until UTC``, each end kept on one line (the cell wraps between them)."""
        return format_html('<span class="tr-nowrap">{}</span> – <span class="tr-nowrap">{} UTC</span>',
                           f"{obj.since:%Y-%m-%d %H:%M}", f"{obj.until:%Y-%m-%d %H:%M}")

    @admin.display(description="tenants")
    def tenant_list(self, obj: Report) -> str:
        return ", ".join(t.slug for t in obj.tenants.all()) or "all"

    @admin.display(description="upstreams")
    def upstream_list(self, obj: Report) -> str:
        return ", ".join(u.name for u in obj.upstreams.all()) or "all"

    @admin.display(description="status", ordering="status")
    def status_display(self, obj: Report) -> SafeString:
        if obj.status == Report.Status.RUNNING:
            return format_html('running <progress max="100" value="{}"></progress> {}%', obj.progress, obj.progress)
        if obj.status == Report.Status.FAILED:
            return format_html('<strong class="errors" title="{}">failed</strong>', obj.error)
        return format_html("{}", obj.status)

    @admin.display(description="download")
    def downloads(self, obj: Report) -> SafeString | str:
        links = [(reverse("admin:audit_report_download", args=[obj.pk, which]), field.name.rsplit("/", 1)[-1])
                 for which, field in (("file", obj.file), ("findings", obj.findings_file)) if field]
        if obj.status != Report.Status.DONE or not links:
            return "–"
        return format_html_join("", '<a class="tr-download" href="{}">{}</a>', links)

    def get_urls(self) -> list[URLPattern]:
        download = path("<int:report_id>/download/<str:which>/", self.admin_site.admin_view(self.download_view),
                        name="audit_report_download")
        return [download, *super().get_urls()]

    def download_view(self, request: HttpRequest, report_id: int, which: str) -> FileResponse:
        """Stream a report file to a user who may see the report; 404 otherwise (missing or not theirs)."""
        report = self.get_queryset(request).filter(pk=report_id).first()
        field = {"file": "file", "findings": "findings_file"}.get(which)
        if report is None or field is None or not getattr(report, field) or not request_scope(request).sees():
            raise Http404("No such report file.")
        stored = getattr(report, field)
        return FileResponse(stored.open("rb"), as_attachment=True, filename=stored.name.rsplit("/", 1)[-1])

