"""The price map in the admin: the operator's prices (superusers only: prices are the deployment's, not a
tenant's). A change is a new row in force from its time on; old requests keep what they were charged."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from billing.models import ModelPrice


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """USD per million tokens per model glob and optional upstream glob (docs/money.md)."""

    list_display = ("model", "upstream", "input_usd", "output_usd", "cache_read_usd", "cache_write_usd",
                    "reasoning_usd", "effective_from", "source")
    list_filter = ("upstream",)
    search_fields = ("model", "upstream", "source")
    ordering = ("model", "upstream", "-effective_from")

    def _superuser(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    has_view_permission = has_add_permission = has_change_permission = has_delete_permission = _superuser
    has_module_permission = _superuser
