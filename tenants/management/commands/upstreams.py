"""``upstreams add|status``: a tenant's upstreams and their credential pools from the shell (docs/routing.md).

``add --tenant T --name NAME --url URL --key KEY [--key KEY ...] [--weight N]``: creates or updates the
upstream ``NAME`` (idempotent by name) and adds each key to its pool once (a key already there is not
added again; ``--weight`` sets the weight of the keys given). ``status --tenant T [--json]``: every
upstream's circuit and keys, as ``{"upstreams": [{"name": str, "circuit": "closed"|"open"|"half-open",
"keys": [{"id": str, "state": "ok"|"cooling"|"disabled", "until": ISO|null}], "broken_rate": {MODEL:
float}}]}`` (more fields may be present). The state is the server's: read from Redis (``REDIS_URL``);
without Redis a command's own process knows none (every circuit closed, every key ok).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.management.commands._common import tenant_named
from tenants.models import Upstream
from tenants.pools import tenant_status
from tenants.services import upstream_key_add, upstream_upsert


class Command(BaseCommand):
    help = "Add upstreams with credential pools, or show their circuits and keys."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="Create or update an upstream; add keys to its pool.")
        add.add_argument("--tenant", required=True)
        add.add_argument("--name", required=True)
        add.add_argument("--url", required=True, help="OpenAI-style base URL, e.g. https://api.deepseek.com/v1")
        add.add_argument("--key", action="append", default=[], help="A credential (repeat for a pool).")
        add.add_argument("--weight", type=int, default=None, help="Weight of the keys given (>= 1).")
        status = sub.add_parser("status", help="Circuits and key states of the tenant's upstreams.")
        status.add_argument("--tenant", required=True)
        status.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_named(options["tenant"])
        if options["action"] == "add":
            self._add(tenant, options)
            return
        found = tenant_status(tenant)
        if options["json"]:
            self.stdout.write(json.dumps(found))
            return
        for up in found["upstreams"]:
            self.stdout.write(f"{up['name']}: circuit {up['circuit']}")
            for key in up["keys"]:
                until = f" until {key['until']}" if key["until"] else ""
                self.stdout.write(f"  key {key['id']} {key['hint']} weight {key['weight']}: {key['state']}{until}")

    def _add(self, tenant: Any, options: dict[str, Any]) -> None:
        existing = Upstream.objects.filter(tenant=tenant, name=options["name"]).exists()
        try:
            upstream = upstream_upsert(tenant=tenant, name=options["name"], base_url=options["url"])
            added = [upstream_key_add(upstream=upstream, raw=k, weight=options["weight"]) for k in options["key"]]
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        new = sum(1 for _, was_added in added if was_added)
        self.stdout.write(
            f"upstream {upstream.name} {'updated' if existing else 'created'}; "
            f"{new} key(s) added, {len(added) - new} already in the pool"
        )
