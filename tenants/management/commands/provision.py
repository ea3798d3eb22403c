"""``provision``: create or update a tenant, its default upstream and routes; a new tenant's first API key,
later ones only with ``--new-key``."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.management.commands._common import base_url, client_urls
from tenants.services import PROVISIONED_KEY_NAME, provision

#: Room left in ``ApiKey.name`` (100) for the ``-N`` that makes a taken name distinct.
KEY_NAME_MAX = 90


def parse_routes(values: list[str]) -> dict[str, str]:
    """``["PUBLIC=UPSTREAM_MODEL", ...]`` -> ``{public: upstream_model}`` (``PUBLIC`` or ``PUBLIC=``: same name)."""
    routes: dict[str, str] = {}
    for value in values:
        public, _, target = value.partition("=")
        if not public.strip():
            raise CommandError(f"--route {value!r}: expected PUBLIC=UPSTREAM_MODEL")
        routes[public.strip()] = target.strip()
    return routes


class Command(BaseCommand):
    help = (
        "Create or update (idempotently) a tenant, its default upstream and model routes, and print the proxy's "
        "URLs. A new tenant gets its first API key; later runs make one only with --new-key. With --json: one "
        "object {tenant, api_key (null when none was made), base_url}."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, metavar="NAME", help="Tenant name (created if missing).")
        parser.add_argument("--upstream-url", metavar="URL",
                            help="OpenAI-compatible base URL, e.g. https://api.deepseek.com/v1 (required for a new "
                                 "tenant; omitted: keep the stored one, e.g. to rotate --upstream-key alone).")
        parser.add_argument("--upstream-key", metavar="KEY",
                            help="Upstream API key, stored encrypted (omitted: keep the stored one).")
        parser.add_argument("--route", action="append", nargs="+", default=[], metavar="PUBLIC=UPSTREAM_MODEL",
                            help="Map a public model name (or glob) to an upstream model; repeatable.")
        parser.add_argument("--new-key", action="store_true",
                            help="Make another API key although the tenant has one (the existing keys stay).")
        parser.add_argument("--key-name", default=PROVISIONED_KEY_NAME, metavar="NAME",
                            help=f"Name of a key made (default {PROVISIONED_KEY_NAME!r}; -2, -3 ... when taken).")
        parser.add_argument("--json", action="store_true", help="Print one JSON object and nothing else.")

    def handle(self, *args: Any, **options: Any) -> None:
        routes = parse_routes([value for group in options["route"] for value in group])
        if not 0 < len(options["key_name"].strip()) <= KEY_NAME_MAX:
            raise CommandError(f"--key-name: 1 to {KEY_NAME_MAX} characters")
        try:
            result = provision(tenant_name=options["tenant"], upstream_url=options["upstream_url"],
                               upstream_key=options["upstream_key"], routes=routes,
                               new_key=True if options["new_key"] else None, key_name=options["key_name"].strip())
        except ValidationError as exc:
            raise CommandError(f"invalid upstream: {'; '.join(exc.messages)}") from exc
        if options["json"]:
            payload = {"tenant": result.tenant.name, "api_key": result.raw_key, "base_url": base_url()}
            self.stdout.write(json.dumps(payload))
            return
        verb = "Created" if result.created else "Updated"
        lines = [
            f"{verb} tenant {result.tenant.name!r} (slug {result.tenant.slug}); default upstream "
            f"{result.upstream.base_url} (credential {result.upstream.credential_display or 'none'}).",
            *(f"Route {public} -> {target or public}" for public, target in routes.items()),
            "",
            (f"New API key {result.api_key.name!r} (shown once, not stored): {result.raw_key}"
             if result.api_key is not None else
             "No new API key: the tenant's keys are unchanged (--new-key makes another; `apikey list` shows them)."),
            *client_urls(),
        ]
        self.stdout.write("\n".join(lines))
