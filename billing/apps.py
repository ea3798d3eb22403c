from __future__ import annotations

from django.apps import AppConfig


class BillingConfig(AppConfig):
    """Prices, costs and spend (docs/money.md)."""

    name = "billing"
    verbose_name = "Billing"
