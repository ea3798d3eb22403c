"""Admin for alert webhooks (tenant admins edit them; a test button) and their delivery log (read-only).

Scoped like every tenant-owned row (``tenants.admin.TenantScopedAdmin``: members see their tenants'
rows, ``admin`` members change them). The signing secret is write-only: typed in when the webhook is
made (as GitHub's webhooks do, so it never has to be shown), replaced by typing a new one.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from alerts.models import AlertDelivery, AlertWebhook
from alerts.tasks import alert_test, alert_test_refusal
from audit.display import pill
from tenants.admin import TenantFilter, TenantScopedAdmin
from tenants.models import validate_header_value
from tenants.scoping import request_scope

SECRET_MIN = 16


class AlertWebhookForm(forms.ModelForm):  # type: ignore[type-arg]
    """The webhook, with its signing secret write-only (required when the webhook is made)."""

    url = forms.URLField(max_length=500, assume_scheme="https", help_text=AlertWebhook._meta.get_field("url").help_text)
    new_secret = forms.CharField(required=False, strip=False, widget=forms.PasswordInput(render_value=False),
                                 label="Signing secret",
                                 help_text=f"At least {SECRET_MIN} characters; the receiver checks "
                                           "X-Toolrelay-Signature with it. Leave blank to keep the current one.")

    class Meta:
        model = AlertWebhook
        fields = ("tenant", "name", "url", "format", "enabled", "window_minutes", "corruption_rate", "min_requests",
                  "exhausted_over", "loops_over")

    def clean_new_secret(self) -> str:
        secret: str = self.cleaned_data.get("new_secret") or ""
        if not secret and self.instance.pk is None:
            raise forms.ValidationError("A new webhook needs a signing secret.")
        if secret:
            if len(secret) < SECRET_MIN:
                raise forms.ValidationError(f"Use at least {SECRET_MIN} characters.")
            validate_header_value(secret, what="The secret")
        return secret


@admin.register(AlertWebhook)
class AlertWebhookAdmin(TenantScopedAdmin[AlertWebhook]):
    """A tenant's alert webhooks; "Send a test alert" posts one now (through the delivery log)."""

    form = AlertWebhookForm
    list_display = ("name", "tenant", "url", "format", "enabled", "rules", "last_delivery")
    list_filter = (TenantFilter, "enabled")
    list_select_related = ("tenant",)
    search_fields = ("name", "url")
    actions = ("send_test",)
    fieldsets = (
        (None, {"fields": ("tenant", "name", "url", "format", "new_secret", "enabled")}),
        ("Rules (blank: off)", {"fields": ("window_minutes", "corruption_rate", "min_requests", "exhausted_over",
                                           "loops_over")}),
    )

    @admin.display(description="rules")
    def rules(self, obj: AlertWebhook) -> str:
        on = [f"corruption ≥ {obj.corruption_rate:.0%}" if obj.corruption_rate is not None else "",
              f"exhausted > {obj.exhausted_over}" if obj.exhausted_over is not None else "",
              f"loops > {obj.loops_over}" if obj.loops_over is not None else ""]
        text = ", ".join(r for r in on if r)
        return f"{text} per {obj.window_minutes} min" if text else "none (test only)"

    @admin.display(description="last delivery")
    def last_delivery(self, obj: AlertWebhook) -> SafeString | str:
        last = obj.deliveries.order_by("-created").first()
        return pill(last.status) if last is not None else "—"

    def get_readonly_fields(self, request: HttpRequest, obj: AlertWebhook | None = None) -> Any:
        return ("tenant",) if obj is not None else ()

    def get_fieldsets(self, request: HttpRequest, obj: AlertWebhook | None = None) -> Any:
        if self.has_change_permission(request, obj):
            return self.fieldsets
        return [(name, {**opts, "fields": [f for f in opts["fields"] if f != "new_secret"]})
                for name, opts in self.fieldsets]

    def save_model(self, request: HttpRequest, obj: AlertWebhook, form: Any, change: bool) -> None:
        secret = form.cleaned_data.get("new_secret")
        if secret:
            obj.secret_encrypted = _encrypt(secret)
        super().save_model(request, obj, form, change)

    @admin.action(description="Send a test alert")
    def send_test(self, request: HttpRequest, queryset: Any) -> None:
        for hook in queryset:
            if self.has_change_permission(request, hook):
                refusal = alert_test_refusal(webhook=hook)
                if refusal is not None:
                    self.message_user(request, f"Not sent: {refusal}.", level=messages.WARNING)
                    continue
                alert_test(webhook=hook)
                self.message_user(request, f"Test alert to {hook.name} queued; see the delivery log.")

    def get_urls(self) -> list[URLPattern]:
        test = path("<path:object_id>/test/", self.admin_site.admin_view(self.test_view),
                    name="alerts_alertwebhook_test")
        return [test, *super().get_urls()]

    def test_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: queue a test alert to the webhook, then show its deliveries."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        hook = self.get_object(request, object_id)
        if hook is None:
            raise Http404
        if not self.has_change_permission(request, hook):
            raise PermissionDenied
        refusal = alert_test_refusal(webhook=hook)
        if refusal is not None:
            messages.warning(request, f"Not sent: {refusal}.")
        else:
            alert_test(webhook=hook)
            messages.success(request, f"Test alert to {hook.name} queued.")
        return HttpResponseRedirect(reverse("admin:alerts_alertdelivery_changelist") + f"?webhook={hook.pk}")


def _encrypt(secret: str) -> str:
    from tenants import crypto

    return crypto.encrypt(secret)


class WebhookFilter(admin.SimpleListFilter):
    """The webhooks of the user's tenants (never another tenant's names)."""

    title = "webhook"
    parameter_name = "webhook"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        rows = request_scope(request).limit(AlertWebhook.objects.select_related("tenant"))
        return [(hook.pk, f"{hook.tenant.slug} / {hook.name}") for hook in rows]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(webhook_id=int(value)) if value.isdigit() else queryset.none()


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(TenantScopedAdmin[AlertDelivery]):
    """Every alert posted (or being retried), with the receiver's last answer. Read-only."""

    list_display = ("created", "webhook", "rule", "subject", "status_pill", "attempts", "response_status",
                    "error_short", "delivered")
    list_filter = (TenantFilter, WebhookFilter, "status", "rule")
    list_select_related = ("webhook", "tenant")
    readonly_fields = ("webhook", "tenant", "rule", "subject", "payload", "status", "attempts", "response_status",
                       "error", "created", "delivered")
    show_full_result_count = False

    @admin.display(description="status", ordering="status")
    def status_pill(self, obj: AlertDelivery) -> SafeString:
        return pill(obj.status)

    @admin.display(description="last answer")
    def error_short(self, obj: AlertDelivery) -> SafeString:
        return format_html('<span title="{}">{}</span>', obj.error, obj.error[:80])

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AlertDelivery | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AlertDelivery | None = None) -> bool:
        return False
