"""``apikey create|revoke|list --tenant NAME``: manage a tenant's API keys from the shell."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from tenants.auth import parse_api_key
from tenants.management.commands._common import base_url, client_urls, tenant_named
from tenants.models import API_KEY_PREFIX, ApiKey, Tenant
from tenants.selectors import NotFound, api_key_for_tenant, api_keys_for_tenant
from tenants.services import api_key_create, api_key_revoke


def find_key(tenant: Tenant, ref: str) -> ApiKey:
    """The tenant's key by id, prefix, shown form ``tr-<prefix>-…`` or full key; ``CommandError`` if none.

    Missing and another tenant's key give the same error.
    """
    ref = ref.strip()
    if ref.isdigit():
        try:
            return api_key_for_tenant(tenant, ref)
        except NotFound:
            pass
    # A full key or its shown form "tr-<prefix>-…" carry the prefix; so do "tr-<prefix>" and "tr-<prefix>-".
    prefix = parse_api_key(ref) or ref.removeprefix(f"{API_KEY_PREFIX}-").rstrip("-…")
    key = api_keys_for_tenant(tenant).filter(prefix=prefix).first()
    if key is None:
        raise CommandError(f"tenant {tenant.name!r} has no API key {ref!r}")
    return key


def status(key: ApiKey) -> str:
    """``active``, ``revoked`` or ``expired``."""
    if key.revoked_at is not None:
        return "revoked"
    return "active" if key.is_usable() else "expired"


class Command(BaseCommand):
    help = "Create, revoke or list a tenant's API keys. Secrets are printed only by `create`, once."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{create,revoke,list}")
        create = actions.add_parser("create", help="Create a key and print it (once).")
        create.add_argument("--name", default="cli", help="A label for the key (default: cli).")
        create.add_argument("--expires-days", type=int, metavar="DAYS", help="Expire after DAYS days.")
        create.add_argument("--json", action="store_true", help="Print one JSON object {tenant, api_key, base_url}.")
        revoke = actions.add_parser("revoke", help="Revoke a key by id or prefix.")
        revoke.add_argument("key", metavar="PREFIX_OR_ID")
        listing = actions.add_parser("list", help="List keys (prefixes only, never secrets).")
        for sub in (create, revoke, listing):
            sub.add_argument("--tenant", required=True, metavar="NAME", help="Tenant name or slug.")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_named(options["tenant"])
        getattr(self, f"_{options['action']}")(tenant, options)

    def _create(self, tenant: Tenant, options: dict[str, Any]) -> None:
        days = options["expires_days"]
        if days is not None and days < 1:
            raise CommandError("--expires-days must be at least 1")
        expires = timezone.now() + timedelta(days=days) if days else None
        key, raw = api_key_create(tenant=tenant, name=options["name"], expires=expires)
        if options["json"]:
            self.stdout.write(json.dumps({"tenant": tenant.name, "api_key": raw, "base_url": base_url()}))
            return
        self.stdout.write("\n".join([f"New API key for {tenant.name} (shown once, not stored): {raw}",
                                     *client_urls()]))

    def _revoke(self, tenant: Tenant, options: dict[str, Any]) -> None:
        key = api_key_revoke(key=find_key(tenant, options["key"]))
        self.stdout.write(f"Revoked {key.display} ({key.name}) of {tenant.name}.")

    def _list(self, tenant: Tenant, options: dict[str, Any]) -> None:
        rows = [("ID", "KEY", "NAME", "STATUS", "CREATED", "LAST USED", "EXPIRES")]
        for key in api_keys_for_tenant(tenant).order_by("created"):
            rows.append((str(key.pk), key.display, key.name, status(key), _when(key.created), _when(key.last_used),
                         _when(key.expires)))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value else "-"
