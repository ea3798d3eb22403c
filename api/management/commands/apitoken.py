"""``apitoken --tenant T [--name N]``: a management API token for one tenant, printed once.

``apitoken --tenant T --list`` lists the tenant's tokens (never their secrets); ``--revoke tra-PREFIX``
revokes one. Use the token as ``Authorization: Bearer tra-…`` on ``/api/v1/`` (docs/people.md).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from api.models import AdminToken
from api.tokens import admin_token_create, admin_token_revoke
from tenants.management.commands._common import tenant_named


class Command(BaseCommand):
    help = "Create (default), list or revoke management API tokens of one tenant."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="Tenant name or slug.")
        parser.add_argument("--name", default="api", help="What uses the token (default: api).")
        parser.add_argument("--list", action="store_true", help="List the tenant's tokens.")
        parser.add_argument("--revoke", metavar="tra-PREFIX", help="Revoke this token of the tenant.")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_named(options["tenant"])
        tokens = AdminToken.objects.filter(tenant=tenant)
        if options["list"]:
            for token in tokens:
                state = "revoked" if token.revoked_at else "active"
                self.stdout.write(f"{token.display}\t{token.name}\t{state}\tcreated {token.created:%Y-%m-%d}")
            return
        if options["revoke"]:
            parts = str(options["revoke"]).split("-")
            prefix = parts[1] if len(parts) >= 2 and parts[0] == "tra" else parts[0]
            found = tokens.filter(prefix=prefix).first()
            if found is None:
                raise CommandError(f"no token {options['revoke']!r} in tenant {tenant.name}")
            admin_token_revoke(token=found)
            self.stdout.write(f"revoked {found.display}")
            return
        token, raw = admin_token_create(tenant=tenant, name=options["name"])
        self.stderr.write(f"Management API token {token.display} for tenant {tenant.name} ({token.name}); "
                          "shown once, store it now:")
        self.stdout.write(raw)
