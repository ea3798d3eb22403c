"""``provision``: create or update a tenant, its default upstream and routes, and print a new API key."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.management.commands._common import base_url, client_urls
from tenants.services import provision


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
        "Create or update (idempotently) a tenant, its default upstream and model routes, then print a new "
        "API key and the proxy's URLs. With --json: one object {tenant, api_key, base_url}."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, metavar="NAME", help="Tenant name (created if missing).")
        parser.add_argument("--upstream-url", required=True, metavar="URL",
                            help="OpenAI-compatible base URL, e.g. https://api.deepseek.com/v1")
        parser.add_argument("--upstream-key", metavar="KEY",
                            help="Upstream API key, stored encrypted (omitted: keep the stored one).")
        parser.add_argument("--route", action="append", nargs="+", default=[], metavar="PUBLIC=UPSTREAM_MODEL",
                            help="Map a public model name (or glob) to an upstream model; repeatable.")
        parser.add_argument("--json", action="store_true", help="Print one JSON object and nothing else.")

    def handle(self, *args: Any, **options: Any) -> None:
        routes = parse_routes([value for group in options["route"] for value in group])
        try:
            result = provision(tenant_name=options["tenant"], upstream_url=options["upstream_url"],
                               upstream_key=options["upstream_key"], routes=routes)
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
            f"New API key (shown once, not stored): {result.raw_key}",
            *client_urls(),
        ]
        self.stdout.write("\n".join(lines))
