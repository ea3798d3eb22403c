"""``routes set``: a tenant's model route and its targets from the shell (docs/routing.md).

``set --tenant T --model GLOB --targets NAME[:MODEL][,NAME[:MODEL]...] [--prefer order|quality]
[--retry-target same|next] [--continue-text on|off]``: the route for ``GLOB`` (an exact model name or a
glob) sends to the named upstreams in order (the first is the route's upstream, the others its fallbacks;
``:MODEL`` is the model asked of that upstream, else the client's), idempotent by ``--model``: running it
again replaces the targets and the choices. ``--prefer quality``: a new session goes to the target with the lowest live
broken-turn rate; ``--retry-target``: where the retry of a broken tool turn goes (default ``next`` with
more than one target); ``--continue-text on``: a text stream the upstream cuts after text reached the client
is continued from that text when the upstream takes a prefix (``Upstream.text_continuation``), ``off`` the
in-stream error; left out, the route keeps what it had (off for a new one).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.management.commands._common import tenant_named
from tenants.selectors import upstreams_for_tenant
from tenants.services import route_set


class Command(BaseCommand):
    help = "Set a model route: its upstreams in order, how new sessions choose among them, where retries go."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        put = sub.add_parser("set", help="Create or replace the route of a model name or glob.")
        put.add_argument("--tenant", required=True)
        put.add_argument("--model", required=True, help="Public model name or glob, e.g. deepseek-*")
        put.add_argument("--targets", required=True, help="Upstream names in order: NAME[:MODEL],NAME[:MODEL]")
        put.add_argument("--prefer", choices=["order", "quality"], default="order")
        put.add_argument("--retry-target", choices=["same", "next"], default="")
        put.add_argument("--continue-text", choices=["on", "off"], default=None,
                         help="Continue cut text streams (upstreams that take a prefix); default: unchanged.")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_named(options["tenant"])
        upstreams = upstreams_for_tenant(tenant)
        targets = []
        for item in (p.strip() for p in options["targets"].split(",")):
            name, _, model = item.partition(":")
            upstream = upstreams.filter(name=name.strip()).first()
            if upstream is None:
                raise CommandError(f"no upstream named {name.strip()!r} in tenant {tenant.name} "
                                   "(add it with `manage.py upstreams add`)")
            targets.append((upstream, model.strip()))
        try:
            route = route_set(tenant=tenant, public_name=options["model"], targets=targets,
                              prefer=options["prefer"], retry_target=options["retry_target"],
                              continue_text=None if options["continue_text"] is None
                              else options["continue_text"] == "on")
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        names = ", ".join(u.name for u, _ in targets)
        self.stdout.write(f"route {route.public_name} -> {names} (prefer {route.prefer}, retry target "
                          f"{route.retry_target or 'next'}, continue text {'on' if route.continue_text else 'off'})")
