"""``usage --tenant T [--member USER] [--since ISO] [--until ISO] [--json]``: what a tenant spent.

``--json`` prints ``billing.spend.spend``'s object (docs/money.md); without it, a few readable lines.
The period is half-open by request start; ``--since`` / ``--until`` ISO 8601 (UTC when no zone).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from billing.management.commands.prices import when
from billing.spend import spend
from tenants.management.commands._common import tenant_named


class Command(BaseCommand):
    help = "What a tenant (or one member) spent: requests, USD delivered and wasted, per model and member."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, metavar="NAME", help="Tenant name or slug.")
        parser.add_argument("--member", metavar="USER", help="Only the requests of this member's keys.")
        parser.add_argument("--since", type=when, metavar="ISO", help="From (inclusive).")
        parser.add_argument("--until", type=when, metavar="ISO", help="Until (exclusive).")
        parser.add_argument("--json", action="store_true", help="One JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        figures = spend(tenant_named(options["tenant"]), member=options["member"], since=options["since"],
                        until=options["until"])
        if options["json"]:
            self.stdout.write(json.dumps(figures))
            return
        self.stdout.write(f"{figures['tenant']}: {figures['requests']} requests, ${figures['cost_usd']:.6f} "
                          f"(delivered ${figures['delivered_usd']:.6f}, wasted ${figures['wasted_usd']:.6f}); "
                          f"{figures['unpriced_requests']} unpriced, {figures['estimated_requests']} estimated")
        for row in figures["by_model"]:
            self.stdout.write(f"  {row['model']}: {row['requests']} requests, ${row['cost_usd']:.6f} "
                              f"(wasted ${row['wasted_usd']:.6f})")
        for row in figures["by_member"]:
            self.stdout.write(f"  member {row['member']}: {row['requests']} requests, ${row['cost_usd']:.6f}")
