"""Admin for tenants, API keys, upstreams, routes and memberships, scoped to the user's tenants.

Superusers see everything. Other staff users see the rows of the tenants they are members of
(``tenants.scoping``, the one door): the ``admin`` role may change them, ``viewer`` only looks.
Rows of other tenants are not in the querysets at all, so their change pages answer exactly like a
missing primary key. Writes with side effects go through ``tenants.services``. Secrets are
write-only: a new API key is shown once, on the page the form redirects to (a reload does not show
it again, nor create another); an upstream credential or its extra headers never.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import ModelAdmin, TabularInline
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models
from django.db.models import Count, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from tenants import crypto, revocation
from tenants.admin_invite import MemberInviteForm, invitation_context, invite_or_errors
from tenants.admin_site import register_login_trail
from tenants.limits import HOLDER_NAMES, LIMIT_NAMES
from tenants.models import (
    ApiKey,
    Membership,
    ModelRoute,
    PolicyFields,
    RouteFallback,
    Tenant,
    Upstream,
    UpstreamCredential,
    UpstreamLearnedLimit,
    validate_extra_headers,
    validate_header_value,
)
from tenants.policy_forms import PolicyFormMixin, policy_summary
from tenants.pools import upstreams_status
from tenants.scoping import request_scope
from tenants.services import (
    api_key_create,
    api_key_revoke,
    learned_limit_forget,
    learned_limit_save,
    member_reinvite,
    upstream_key_add,
)

_M = TypeVar("_M", bound=models.Model)

POLICY_HELP = "“inherit” takes {}."
#: Session entry holding a just-created key (encrypted) until the page that shows it is loaded.
NEW_KEY_SESSION = "toolrelay_new_api_key"


class TenantScopedAdmin(ModelAdmin[_M]):
    """Rows of the user's tenants only; view for members, change for tenant admins, all for superusers.

    ``tenant_path`` is the lookup from the model to its Tenant. Foreign keys to tenants and upstreams
    offer only those the user manages; the models' ``clean()`` keeps a row's upstreams in its tenant.
    """

    tenant_path = "tenant"

    def get_queryset(self, request: HttpRequest) -> QuerySet[_M]:
        return request_scope(request).limit(super().get_queryset(request), self.tenant_path)

    def tenant_id_of(self, obj: _M) -> int:
        """The id of the tenant that owns ``obj``."""
        return int(obj.tenant_id)  # type: ignore[attr-defined]

    def _tenant_of(self, obj: _M | None) -> int | None:
        return None if obj is None else self.tenant_id_of(obj)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request_scope(request).sees()

    def has_view_permission(self, request: HttpRequest, obj: _M | None = None) -> bool:
        return request_scope(request).sees(self._tenant_of(obj))

    def has_change_permission(self, request: HttpRequest, obj: _M | None = None) -> bool:
        return request_scope(request).manages(self._tenant_of(obj))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request_scope(request).manages()

    def has_delete_permission(self, request: HttpRequest, obj: _M | None = None) -> bool:
        return request_scope(request).manages(self._tenant_of(obj))

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        kwargs.setdefault("queryset", _scoped_choices(db_field, request))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


def _scoped_choices(db_field: Any, request: HttpRequest) -> QuerySet[Any] | None:
    """Foreign-key choices limited to what the user manages (None: leave the field alone)."""
    if db_field.related_model is Tenant:
        return request_scope(request).tenants(managed=True)
    if db_field.related_model is Upstream:
        return request_scope(request).limit(Upstream.objects.select_related("tenant"), managed=True)
    return None


class TenantFilter(admin.SimpleListFilter):
    """Filter by tenant, offering only the tenants the user may see (never other tenants' names)."""

    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        return [(tenant.pk, tenant.name) for tenant in request_scope(request).tenants()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(tenant_id=int(value)) if value.isdigit() else queryset.none()


# ----- tenants and their keys -----

class ApiKeyInline(TabularInline[ApiKey, Tenant]):
    """The tenant's keys, read-only: keys are created through the one-time add page, revoked by action."""

    model = ApiKey
    fields = ("key", "name", "created", "last_used", "expires", "revoked_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    @admin.display(description="key")
    def key(self, obj: ApiKey) -> str:
        return obj.display

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request_scope(request).sees(None if obj is None else obj.pk)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PolicyAdminMixin:
    """View-only pages show the guard policy as one table ("inherit (default: …)"), not as raw
    nullable fields ("Unknown", ``null``)."""

    policy_section = ""

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        if obj is None or self.has_change_permission(request, obj):  # type: ignore[attr-defined]
            return fieldsets
        return [(name, {**opts, "fields": ("policy_view",)}) if name == self.policy_section else (name, opts)
                for name, opts in fieldsets]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return (*super().get_readonly_fields(request, obj), "policy_view")  # type: ignore[misc]

    def policy_tenant(self, obj: Any) -> Tenant | None:
        """Whose values the row inherits (None: the product defaults)."""
        return None

    @admin.display(description="guard policy")
    def policy_view(self, obj: Any) -> Any:
        return policy_summary(obj, self.policy_tenant(obj))


LIMITS_HELP = ("Empty: no limit; 0 blocks. Over a rate the client gets HTTP 429 with Retry-After; over a day's or "
               "month's tokens or a money budget a 429 insufficient_quota that agents do not retry. The soft "
               "threshold (a percent of each money budget) tells the alert webhooks and the live feed first.")


class TenantForm(PolicyFormMixin):
    """Offers only the tenant's own upstreams as its default upstream; policy fields say what
    "inherit" means (the product defaults)."""

    class Meta:
        model = Tenant
        fields = ("name", "slug", "active", "default_upstream", *PolicyFields.POLICY_FIELDS, *HOLDER_NAMES)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields.get("default_upstream")
        if isinstance(field, forms.ModelChoiceField):
            field.queryset = Upstream.objects.filter(tenant_id=self.instance.pk) if self.instance.pk else \
                Upstream.objects.none()


@admin.register(Tenant)
class TenantAdmin(PolicyAdminMixin, TenantScopedAdmin[Tenant]):
    """Tenants with their keys inline. Only superusers create or delete tenants."""

    form = TenantForm
    policy_section = "Guard policy defaults"
    tenant_path = "pk"
    list_display = ("name", "slug", "active", "default_upstream", "active_keys", "created")
    list_filter = ("active",)
    search_fields = ("name", "slug")
    list_select_related = ("default_upstream",)
    prepopulated_fields = {"slug": ("name",)}
    readonly_fields = ("created",)
    fieldsets = (
        (None, {"fields": ("name", "slug", "active", "default_upstream", "created")}),
        ("Guard policy defaults", {"fields": PolicyFields.POLICY_FIELDS,
                                   "description": POLICY_HELP.format("toolrelay's default")}),
        ("Limits", {"fields": HOLDER_NAMES, "description": LIMITS_HELP}),
    )
    inlines = (ApiKeyInline,)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A tenant's limits bound what its own admins may do: only superusers change them (its admins may set
        # the soft threshold of its money budgets: it refuses nothing).
        own = () if request.user.is_superuser else LIMIT_NAMES
        return (*super().get_readonly_fields(request, obj), *own)

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        """Save, then tell every proxy process its cached principals of this tenant are stale (limits,
        disabled)."""
        super().save_model(request, obj, form, change)
        if change:
            revocation.tenant_changed(obj.pk)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tenant]:
        usable = Q(api_keys__revoked_at__isnull=True) & (Q(api_keys__expires__isnull=True)
                                                         | Q(api_keys__expires__gt=timezone.now()))
        return super().get_queryset(request).annotate(active_key_count=Count("api_keys", filter=usable))

    def tenant_id_of(self, obj: Tenant) -> int:
        return int(obj.pk)

    @admin.display(description="active keys", ordering="active_key_count")
    def active_keys(self, obj: Tenant) -> int:
        return int(getattr(obj, "active_key_count", 0))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request_scope(request).everything

    def has_delete_permission(self, request: HttpRequest, obj: Tenant | None = None) -> bool:
        return request_scope(request).everything


class ApiKeyCreateForm(forms.Form):
    """What the one-time key page asks for; the key itself is made by ``api_key_create``."""

    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none())
    name = forms.CharField(max_length=100, help_text="Who or what uses the key, e.g. “ci-bot” or “alice laptop”.")
    expires = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                                  help_text="Optional (UTC). Blank: the key never expires.")

    def __init__(self, *args: Any, tenants: QuerySet[Tenant], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["tenant"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = tenants

    def clean_expires(self) -> Any:
        expires = self.cleaned_data.get("expires")
        if expires is not None and expires <= timezone.now():
            raise ValidationError("Choose a time in the future.")
        return expires


class KeyStatusFilter(admin.SimpleListFilter):
    """Active / revoked / expired."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("active", "active"), ("revoked", "revoked"), ("expired", "expired")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "active":
            return queryset.filter(pk__in=ApiKey.objects.active().values("pk"))
        if value == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        if value == "expired":
            return queryset.filter(revoked_at__isnull=True, expires__lte=timezone.now())
        return queryset


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin[ApiKey]):
    """API keys: listed by prefix, created on a one-time page, revoked by an action; the digest is hidden."""

    list_display = ("key", "name", "tenant", "member", "status", "created", "last_used", "expires")
    list_filter = (TenantFilter, KeyStatusFilter)
    search_fields = ("name", "prefix", "member__user__username")
    list_select_related = ("tenant", "member__user")
    actions = ("revoke",)
    fieldsets = (
        (None, {"fields": ("tenant", "key", "name", "member", "created", "last_used", "expires", "revoked_at")}),
        ("Limits", {"fields": HOLDER_NAMES, "description": LIMITS_HELP + " A key's limits apply within its "
                    "tenant's and may not be above them."}),
    )
    readonly_fields = ("tenant", "key", "member", "created", "last_used", "revoked_at")

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        """Save (``ApiKey.clean`` refused limits above the tenant's), then tell every proxy process."""
        super().save_model(request, obj, form, change)
        revocation.tenant_changed(obj.tenant_id)

    @admin.display(description="key", ordering="prefix")
    def key(self, obj: ApiKey) -> str:
        return obj.display

    @admin.display(description="status")
    def status(self, obj: ApiKey) -> str:
        if obj.revoked_at is not None:
            return "revoked"
        return "active" if obj.is_usable() else "expired"

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[ApiKey],
                           search_term: str) -> tuple[QuerySet[ApiKey], bool]:
        # People paste what they see: "tr-<prefix>-…" or even a whole key; search by its prefix.
        parts = search_term.strip().split("-")
        if len(parts) >= 2 and parts[0] == "tr" and parts[1]:
            search_term = parts[1]
        return super().get_search_results(request, queryset, search_term)

    @admin.action(description="Revoke the selected API keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        """Revoke (through ``api_key_revoke``) the selected keys of tenants the user manages."""
        keys = request_scope(request).limit(queryset, managed=True).filter(revoked_at__isnull=True)
        count = 0
        for key in keys:
            api_key_revoke(key=key)
            # Bulk actions write no history by themselves: one entry per key, as a change page would.
            self.log_change(request, key, "Revoked (action “Revoke the selected API keys”).")
            count += 1
        self.message_user(request, f"Revoked {count} API key(s). Running proxy processes are told at once "
                                   f"(within {settings.AUTH_CACHE_SECONDS:g} s if the broadcast is lost).",
                          messages.SUCCESS)

    def add_view(self, request: HttpRequest, form_url: str = "",
                 extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Ask for tenant, name and expiry; create the key and redirect to the page that shows it once
        (POST/redirect/GET: reloading that page never makes a second key).

        Between the POST and the GET the raw key waits in the session encrypted (``tenants.crypto``,
        as upstream credentials are), and the GET removes it: the session never holds it in clear,
        nor for longer than one page load.
        """
        if not self.has_add_permission(request):
            raise PermissionDenied
        data = request.POST if request.method == "POST" else None
        form = ApiKeyCreateForm(data, tenants=request_scope(request).tenants(managed=True),
                                initial={"tenant": request.GET.get("tenant")})
        if data is not None and form.is_valid():
            key, raw = api_key_create(tenant=form.cleaned_data["tenant"], name=form.cleaned_data["name"],
                                      expires=form.cleaned_data["expires"])
            self.log_addition(request, key, [{"added": {}}])
            request.session[NEW_KEY_SESSION] = {"id": key.pk, "token": crypto.encrypt(raw)}
            return HttpResponseRedirect(reverse("admin:tenants_apikey_created", args=[key.pk]))
        return self._render(request, "create.html", title="Create an API key", form=form)

    def created_view(self, request: HttpRequest, key_id: int) -> HttpResponse:
        """The new key, shown on the first load after its creation only; later loads say it is gone."""
        key = self.get_queryset(request).filter(pk=key_id).select_related("tenant").first()
        if key is None or not self.has_view_permission(request, key):
            raise Http404("No such API key.")
        pending = request.session.get(NEW_KEY_SESSION)
        raw = None
        if isinstance(pending, dict) and pending.get("id") == key.pk:
            del request.session[NEW_KEY_SESSION]
            raw = crypto.decrypt(str(pending.get("token", "")))
        return self._render(request, "created.html", title="New API key", key=key, raw_key=raw,
                            base_url=f"{settings.SITE_URL}/v1", site_url=settings.SITE_URL)

    def get_urls(self) -> list[URLPattern]:
        created = path("<int:key_id>/created/", self.admin_site.admin_view(self.created_view),
                       name="tenants_apikey_created")
        return [created, *super().get_urls()]

    def _render(self, request: HttpRequest, template: str, **context: Any) -> TemplateResponse:
        request.current_app = self.admin_site.name
        context = {**self.admin_site.each_context(request), "opts": self.opts, **context}
        return TemplateResponse(request, f"admin/tenants/apikey/{template}", context)


# ----- upstreams -----

class WriteOnlyTextarea(forms.Textarea):
    """A textarea that never renders a value, not even what was just submitted with an error."""

    def format_value(self, value: Any) -> str | None:
        return None


class UpstreamForm(forms.ModelForm):  # type: ignore[type-arg]
    """Upstream fields plus write-only secrets: a blank credential / headers field keeps what is stored.

    The form fields are deliberately not named like the model's ``credential()`` / ``extra_headers()``
    methods: the admin's read-only rendering would call those and print the decrypted values.
    """

    new_credential = forms.CharField(
        label="Set credential", required=False, strip=False, widget=forms.PasswordInput(render_value=False),
        help_text="Write-only API key for this upstream. Leave blank to keep the stored one.")
    clear_credential = forms.BooleanField(label="Remove credential", required=False)
    new_extra_headers = forms.CharField(
        label="Set extra headers", required=False, widget=WriteOnlyTextarea(attrs={"rows": 3}),
        help_text='Write-only JSON object sent with every request, e.g. {"X-Org-Id": "…"}. Blank keeps the '
                  "stored headers.")
    clear_extra_headers = forms.BooleanField(label="Remove extra headers", required=False)
    new_pool_keys = forms.CharField(
        label="Add pool keys", required=False, strip=False, widget=WriteOnlyTextarea(attrs={"rows": 3}),
        help_text="Write-only: more API keys for this upstream, one per line (weight 1; a key already in the "
                  "pool is not added again). Requests pick among the healthy keys by weight (docs/routing.md).")
    # Declared so that a scheme-less URL means https (Django 6's default; 5.2 warns otherwise).
    base_url = forms.URLField(max_length=500, assume_scheme="https",
                              help_text=Upstream._meta.get_field("base_url").help_text)

    class Meta:
        model = Upstream
        fields = ("tenant", "name", "base_url", "enabled", "connect_timeout", "first_byte_timeout", "idle_timeout",
                  "request_deadline", "text_continuation")

    def clean(self) -> dict[str, Any]:
        """Stored secrets stay bound to the host they were entered for: moving the upstream to another
        scheme, host or port requires entering (or removing) them again, so nobody who can edit an
        upstream can send its credential elsewhere."""
        data: dict[str, Any] = super().clean() or {}
        instance = self.instance
        url = data.get("base_url")
        if instance.pk is None or not url or _origin(url) == _origin(instance.base_url):
            return data
        if instance.credential_encrypted and not (data.get("new_credential") or data.get("clear_credential")):
            self.add_error("new_credential", "The host changed: enter the credential again, or remove it.")
        if instance.extra_headers_encrypted and not (data.get("new_extra_headers") or data.get("clear_extra_headers")):
            self.add_error("new_extra_headers", "The host changed: enter the extra headers again, or remove them.")
        if instance.credentials.exists():
            self.add_error("base_url", "The host changed: delete the pool keys first (below), then add them again.")
        return data

    def clean_new_pool_keys(self) -> list[str]:
        """One key per line, each a valid header value; at most 50."""
        lines = [line for line in self.cleaned_data.get("new_pool_keys", "").splitlines() if line.strip()]
        if len(lines) > 50:
            raise ValidationError("At most 50 keys at once.")
        for line in lines:
            validate_header_value(line, what="A pool key")
        return lines

    def clean_new_credential(self) -> str:
        """No line breaks, control characters or surrounding spaces (they would break the header)."""
        value: str = self.cleaned_data.get("new_credential", "")
        if value:
            validate_header_value(value, what="The credential")
        return value

    def clean_new_extra_headers(self) -> dict[str, str] | None:
        raw = self.cleaned_data.get("new_extra_headers", "").strip()
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            raise ValidationError("Not valid JSON.") from None
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ValidationError("Expected a JSON object mapping header names to string values.")
        validate_extra_headers(value)
        return value


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, lowercased; default ports made explicit."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.scheme.lower(), (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(parts.scheme)


SECRET_FORM_FIELDS = ("new_credential", "clear_credential", "new_extra_headers", "clear_extra_headers",
                      "new_pool_keys")


class UpstreamCredentialInline(TabularInline[UpstreamCredential, Upstream]):
    """The upstream's pool keys beyond its own credential: masked, weight and switch editable; added through
    the write-only "Add pool keys" field."""

    model = UpstreamCredential
    fields = ("key", "hint", "weight", "enabled", "created")
    readonly_fields = ("key", "hint", "created")
    extra = 0
    verbose_name = "pool key"

    @admin.display(description="id")
    def key(self, obj: UpstreamCredential) -> str:
        return obj.key_id if obj.pk else "—"

    def _tenant(self, obj: Upstream | None) -> int | None:
        return None if obj is None else obj.tenant_id

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request_scope(request).sees(self._tenant(obj))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request_scope(request).manages(self._tenant(obj))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request_scope(request).manages(self._tenant(obj))


@admin.register(Upstream)
class UpstreamAdmin(TenantScopedAdmin[Upstream]):
    """Upstreams: the credential is write-only and shown masked (``sk-…3f9a``)."""

    form = UpstreamForm
    inlines = (UpstreamCredentialInline,)
    list_display = ("name", "tenant", "shown_url", "masked_credential", "enabled", "connect_timeout",
                    "first_byte_timeout", "idle_timeout")
    list_filter = (TenantFilter, "enabled")
    search_fields = ("name", "base_url", "tenant__name")
    list_select_related = ("tenant",)
    readonly_fields = ("masked_credential", "extra_headers_state", "created", "shown_url", "learned_limits",
                       "routing_state")
    fieldsets = (
        (None, {"fields": ("tenant", "name", "base_url", "enabled", "text_continuation", "created")}),
        ("Health and keys (live)", {"fields": ("routing_state",)}),
        ("Learned from its errors", {"fields": ("learned_limits",)}),
        ("Secrets", {"fields": ("masked_credential", "new_credential", "clear_credential", "new_pool_keys",
                                "extra_headers_state", "new_extra_headers", "clear_extra_headers")}),
        ("Timeouts (seconds)", {"fields": ("connect_timeout", "first_byte_timeout", "idle_timeout",
                                           "request_deadline")}),
    )

    @admin.display(description="base URL", ordering="base_url")
    def shown_url(self, obj: Upstream) -> str:
        return obj.display_url

    @admin.display(description="credential", ordering="credential_hint")
    def masked_credential(self, obj: Upstream) -> str:
        return obj.credential_display or "—"

    @admin.display(description="extra headers")
    def extra_headers_state(self, obj: Upstream) -> str:
        return "set (hidden)" if obj.extra_headers_encrypted else "—"

    @admin.display(description="state")
    def routing_state(self, obj: Upstream) -> str:
        """The circuit and every pool key's state and cool-down, from the shared state (docs/routing.md)."""
        if not obj.pk:
            return "—"
        (found,) = upstreams_status([obj])
        until = f" until {found['circuit_until']}" if found["circuit_until"] else ""
        keys = [(k["id"], k["hint"] or "(none)", k["weight"], k["state"], f" until {k['until']}" if k["until"] else "")
                for k in found["keys"]]
        return format_html("<p>circuit: <b>{}</b>{}</p><ul>{}</ul>", found["circuit"], until,
                           format_html_join("", "<li>key {} {} (weight {}): <b>{}</b>{}</li>", keys) if keys
                           else format_html("<li>{}</li>", "no credential"))

    @admin.display(description="learned limits")
    def learned_limits(self, obj: Upstream) -> str:
        return learned_list(obj.learned_limits.select_related("upstream")) if obj.pk else "—"

    def get_fieldsets(self, request: HttpRequest, obj: Upstream | None = None) -> Any:
        if self.has_change_permission(request, obj):
            return self.fieldsets
        # View-only pages render every field read-only; the write-only inputs have nothing to show,
        # and the URL is shown masked (a row saved before userinfo was refused may hold user:pass@).
        return [(name, {**opts, "fields": ["shown_url" if f == "base_url" else f for f in opts["fields"]
                                           if f not in SECRET_FORM_FIELDS]})
                for name, opts in self.fieldsets]

    def get_readonly_fields(self, request: HttpRequest, obj: Upstream | None = None) -> Any:
        # Moving an upstream to another tenant would hand its credential over with it.
        extra = ("tenant",) if obj is not None else ()
        return (*self.readonly_fields, *extra)

    def save_model(self, request: HttpRequest, obj: Upstream, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if data.get("clear_credential"):
            obj.set_credential("")
        elif data.get("new_credential"):
            obj.set_credential(data["new_credential"])
        if data.get("clear_extra_headers"):
            obj.set_extra_headers({})
        elif data.get("new_extra_headers") is not None:
            obj.set_extra_headers(data["new_extra_headers"])
        super().save_model(request, obj, form, change)
        for raw in data.get("new_pool_keys") or ():
            upstream_key_add(upstream=obj, raw=raw)


# ----- routes -----

class RouteFallbackInline(TabularInline[RouteFallback, ModelRoute]):
    """Where retries 1, 2, … of the route go, in ``position`` order."""

    model = RouteFallback
    fields = ("position", "upstream", "model")
    extra = 0

    def _route_tenant(self, obj: ModelRoute | None) -> int | None:
        return None if obj is None else obj.tenant_id

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request_scope(request).sees(self._route_tenant(obj))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request_scope(request).manages(self._route_tenant(obj))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request_scope(request).manages(self._route_tenant(obj))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request_scope(request).manages(self._route_tenant(obj))

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        kwargs.setdefault("queryset", _scoped_choices(db_field, request))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class RouteForm(PolicyFormMixin):
    """A route's fields; its policy overrides inherit the tenant's effective values."""

    class Meta:
        model = ModelRoute
        fields = ("tenant", "public_name", "upstream", "upstream_model", "max_output_tokens", "continue_text",
                  *PolicyFields.POLICY_FIELDS)

    def inherited_from(self) -> Tenant | None:
        return self.instance.tenant if self.instance.tenant_id else None


@admin.register(ModelRoute)
class ModelRouteAdmin(PolicyAdminMixin, TenantScopedAdmin[ModelRoute]):
    """Model routes with their fallbacks and guard policy overrides."""

    form = RouteForm
    policy_section = "Guard policy overrides"

    list_display = ("public_name", "tenant", "upstream", "target", "max_output_tokens", "fallback_count")
    list_filter = (TenantFilter,)
    search_fields = ("public_name", "upstream_model", "upstream__name", "tenant__name")
    list_select_related = ("tenant", "upstream")
    readonly_fields = ("created", "learned_limits")
    fieldsets = (
        (None, {"fields": ("tenant", "public_name", "upstream", "upstream_model", "max_output_tokens",
                           "learned_limits", "request_deadline", "continue_text", "created")}),
        ("Guard policy overrides", {"fields": PolicyFields.POLICY_FIELDS,
                                    "description": POLICY_HELP.format("the tenant's value (toolrelay's "
                                                                      "default on a new route)")}),
    )
    inlines = (RouteFallbackInline,)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ModelRoute]:
        return super().get_queryset(request).annotate(fallback_total=Count("fallbacks"))

    def get_readonly_fields(self, request: HttpRequest, obj: ModelRoute | None = None) -> Any:
        return (*super().get_readonly_fields(request, obj), *(("tenant",) if obj is not None else ()))

    def policy_tenant(self, obj: ModelRoute) -> Tenant | None:
        return obj.tenant

    @admin.display(description="upstream model", ordering="upstream_model")
    def target(self, obj: ModelRoute) -> str:
        return obj.upstream_model or "(same name)"

    @admin.display(description="fallbacks", ordering="fallback_total")
    def fallback_count(self, obj: ModelRoute) -> int:
        return int(getattr(obj, "fallback_total", 0))

    @admin.display(description="learned from the upstream")
    def learned_limits(self, obj: ModelRoute) -> str:
        """What the route's upstreams were learned to refuse for its model, beside the route's own cap."""
        return learned_list(route_learned_limits(obj)) if obj.pk else "—"


def route_learned_limits(route: ModelRoute) -> QuerySet[UpstreamLearnedLimit]:
    """The learned limits of the route's upstream and fallbacks for its upstream model (every model of theirs
    for a glob route that keeps the requested name)."""
    upstreams = [route.upstream_id, *route.fallbacks.values_list("upstream_id", flat=True)]
    rows = UpstreamLearnedLimit.objects.filter(upstream_id__in=upstreams).select_related("upstream")
    model = route.upstream_model or ("" if route.is_glob else route.public_name)
    models_ = {model, *route.fallbacks.exclude(model="").values_list("model", flat=True)} if model else set()
    return rows.filter(model__in=models_) if models_ else rows


def learned_list(rows: QuerySet[UpstreamLearnedLimit]) -> str:
    """Each limit as a link to its change page, with its state; "—" when there are none."""
    now = timezone.now()
    items = [(reverse("admin:tenants_upstreamlearnedlimit_change", args=[r.pk]),
              f"{r.upstream.name}:{r.model} {r.describe()}",
              f"until {r.expires_at:%Y-%m-%d %H:%M} UTC" if r.is_live(now) else "expired") for r in rows]
    if not items:
        return "—"
    return format_html("<ul>{}</ul>", format_html_join("", '<li><a href="{}">{}</a> ({})</li>', items))


# ----- learned upstream limits -----

class LearnedLimitForm(forms.ModelForm):  # type: ignore[type-arg]
    """A learned limit; a new one expires after ``UPSTREAM_LEARNED_TTL_SECONDS`` unless set otherwise."""

    class Meta:
        model = UpstreamLearnedLimit
        fields = ("upstream", "model", "parameter", "value", "expires_at", "detail")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is None and "expires_at" in self.fields:
            self.fields["expires_at"].initial = timezone.now() + timedelta(
                seconds=settings.UPSTREAM_LEARNED_TTL_SECONDS)


@admin.register(UpstreamLearnedLimit)
class UpstreamLearnedLimitAdmin(TenantScopedAdmin[UpstreamLearnedLimit]):
    """What upstreams were learned to refuse, from their own errors (``proxy.upstreams.learned``): an operator may
    change a value, set when it expires, or forget it (it expires now). Saving stamps the row, so the edit
    wins over what proxy processes learned before it."""

    form = LearnedLimitForm
    tenant_path = "upstream__tenant"
    list_display = ("upstream", "model", "shown", "state", "learned_at", "expires_at")
    list_filter = (("upstream", admin.RelatedOnlyFieldListFilter),)
    search_fields = ("model", "parameter", "upstream__name")
    list_select_related = ("upstream", "upstream__tenant")
    readonly_fields = ("learned_at",)
    actions = ("forget",)

    def tenant_id_of(self, obj: UpstreamLearnedLimit) -> int:
        return int(obj.upstream.tenant_id)

    def get_readonly_fields(self, request: HttpRequest, obj: UpstreamLearnedLimit | None = None) -> Any:
        return (*self.readonly_fields, *(("upstream", "model", "parameter", "detail") if obj is not None else ()))

    @admin.display(description="limit", ordering="parameter")
    def shown(self, obj: UpstreamLearnedLimit) -> str:
        return obj.describe()

    @admin.display(description="state")
    def state(self, obj: UpstreamLearnedLimit) -> str:
        return "in force" if obj.is_live() else "expired"

    def save_model(self, request: HttpRequest, obj: UpstreamLearnedLimit, form: Any, change: bool) -> None:
        learned_limit_save(limit=obj)

    @admin.action(description="Forget the selected limits (send what clients ask again)", permissions=["change"])
    def forget(self, request: HttpRequest, queryset: QuerySet[UpstreamLearnedLimit]) -> None:
        count = 0
        mine = request_scope(request).limit(queryset, "upstream__tenant", managed=True)
        for limit in mine.select_related("upstream"):
            learned_limit_forget(limit=limit)
            self.log_change(request, limit, "Forgotten (expired now).")
            count += 1
        self.message_user(request, f"Forgot {count} learned limit(s).", messages.SUCCESS)


# ----- memberships -----

@admin.register(Membership)
class MembershipAdmin(TenantScopedAdmin[Membership]):
    """Who belongs to which tenant. Members see their tenants' memberships; only superusers add existing
    accounts or grant roles (granting a role is granting access, and the user picker would list every
    account). A tenant's admins add new people as members (an invitation link, ``tenants.admin_invite``),
    remove them, and set what its people may do: how many keys, which models, their limits and budgets."""

    list_display = ("user", "tenant", "role", "max_keys", "allowed_models", "created")
    list_filter = ("role", TenantFilter)
    search_fields = ("user__username", "user__email", "tenant__name")
    list_select_related = ("user", "tenant")
    raw_id_fields = ("user",)
    readonly_fields = ("created",)
    fieldsets = (
        (None, {"fields": ("user", "tenant", "role", "created")}),
        ("Self-service keys", {"fields": ("max_keys", "allowed_models"),
                               "description": "What this person may do on their own key page (/account/keys/)."}),
        ("Limits", {"fields": HOLDER_NAMES, "description": LIMITS_HELP + " A person's limits apply to all their "
                    "keys together, within the tenant's."}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Membership | None = None) -> Any:
        if request.user.is_superuser:
            return self.readonly_fields
        return ("user", "tenant", "role", "created")

    def save_model(self, request: HttpRequest, obj: Membership, form: Any, change: bool) -> None:
        """Save, then tell every proxy process (its keys' models and limits change at once)."""
        super().save_model(request, obj, form, change)
        revocation.tenant_changed(obj.tenant_id)

    def has_change_permission(self, request: HttpRequest, obj: Membership | None = None) -> bool:
        return request_scope(request).manages(self._tenant_of(obj))

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Superusers (any account, any role); a tenant's admins add new people as members
        (``tenants.admin_invite``)."""
        return request_scope(request).manages()

    def has_delete_permission(self, request: HttpRequest, obj: Membership | None = None) -> bool:
        """Superusers; a tenant's admins remove its ``member`` people (their keys are revoked), not its
        admins or viewers (access is a superuser's to grant and take)."""
        scope = request_scope(request)
        if scope.everything:
            return True
        return (obj is None or obj.role == Membership.MEMBER) and scope.manages(self._tenant_of(obj))

    def get_actions(self, request: HttpRequest) -> Any:
        """No bulk delete for tenant admins (it would skip the per-row role check of ``has_delete_permission``)."""
        actions = super().get_actions(request)
        if not request.user.is_superuser:
            actions.pop("delete_selected", None)
        return actions

    def add_view(self, request: HttpRequest, form_url: str = "",
                 extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Superusers: the ordinary form. A tenant's admins: a new person of a tenant they manage, then the
        invitation link shown once on the answer (a reload re-posts and is refused: the name is taken)."""
        if request.user.is_superuser and "invite" not in request.GET:
            return super().add_view(request, form_url, extra_context)
        if not self.has_add_permission(request):
            raise PermissionDenied
        tenants = request_scope(request).tenants(managed=True)
        form = MemberInviteForm(request.POST if request.method == "POST" else None, tenants=tenants,
                                initial={"tenant": request.GET.get("tenant"), "max_keys": 5})
        invited = invite_or_errors(form) if request.method == "POST" else None
        request.current_app = self.admin_site.name
        context = {**self.admin_site.each_context(request), "opts": self.opts, "form": form,
                   "title": "Add a person", "submit": "Add and show the invitation link",
                   **(invitation_context(request, invited) if invited else {})}
        if invited is not None:
            self.log_addition(request, invited.membership, [{"added": {}}])
        response = TemplateResponse(request, "admin/tenants/membership/invite.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.reinvite_view)
        return [path("<path:object_id>/invite/", view, name="tenants_membership_invite"), *super().get_urls()]

    def reinvite_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """``<membership>/invite/``: GET asks, POST sends a new invitation link to a person who has not taken
        theirs (``member_reinvite``: older links stop working), shown once and e-mailed when they have an
        address. A row the user may not change is a missing one (404)."""
        obj = self.get_object(request, object_id)
        if obj is None or not self.has_change_permission(request, obj):
            raise Http404("No such membership.")
        request.current_app = self.admin_site.name
        context: dict[str, Any] = {**self.admin_site.each_context(request), "opts": self.opts,
                                   "title": "Send a new invitation", "reinvite": obj, "form": forms.Form(),
                                   "submit": "Send a new invitation link"}
        if request.method == "POST":
            try:
                invited = member_reinvite(membership=obj)
            except ValidationError as exc:
                self.message_user(request, " ".join(exc.messages), messages.ERROR)
                return HttpResponseRedirect(reverse("admin:tenants_membership_change", args=[obj.pk]))
            self.log_change(request, obj, "Sent a new invitation link.")
            context.update(invitation_context(request, invited, again=True))
        response = TemplateResponse(request, "admin/tenants/membership/invite.html", context)
        response["Cache-Control"] = "no-store"
        return response


# ----- the login trail (django-axes' records, read-only for superusers) -----

register_login_trail(admin.site)
