"""Management API tokens in the admin: listed and revoked by the tenant's admins, never shown (they are
created with ``manage.py apitoken``, which prints the token once)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from api.models import AdminToken
from api.tokens import admin_token_revoke
from tenants.admin import TenantFilter, TenantScopedAdmin
from tenants.scoping import request_scope


@admin.register(AdminToken)
class AdminTokenAdmin(TenantScopedAdmin[AdminToken]):
    """Tokens by prefix, tenant and state; the ``revoke`` action for tenants the user manages."""

    list_display = ("token", "name", "tenant", "status", "created", "last_used")
    list_filter = (TenantFilter,)
    search_fields = ("name", "prefix")
    list_select_related = ("tenant",)
    actions = ("revoke",)
    fields = ("tenant", "token", "name", "created", "last_used", "revoked_at")
    readonly_fields = ("tenant", "token", "created", "last_used", "revoked_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # the secret is shown once, by `manage.py apitoken`

    @admin.display(description="token", ordering="prefix")
    def token(self, obj: AdminToken) -> str:
        return obj.display

    @admin.display(description="status")
    def status(self, obj: AdminToken) -> str:
        return "revoked" if obj.revoked_at else "active"

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[AdminToken]) -> None:
        """Revoke the selected tokens of tenants the user manages."""
        count = 0
        for token in request_scope(request).limit(queryset, managed=True).filter(revoked_at__isnull=True):
            admin_token_revoke(token=token)
            self.log_change(request, token, "Revoked.")
            count += 1
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[AdminToken],
                           search_term: str) -> tuple[QuerySet[AdminToken], Any]:
        parts = search_term.strip().split("-")
        if len(parts) >= 2 and parts[0] == "tra" and parts[1]:
            search_term = parts[1]
        return super().get_search_results(request, queryset, search_term)
