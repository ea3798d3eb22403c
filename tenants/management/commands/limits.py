"""``limits set|show --tenant T [--key tr-PREFIX]``: a tenant's and its keys' limits from the shell.

``set --tenant T [--key tr-PREFIX] [--rpm N] [--tpm N] [--concurrency N] [--daily-tokens N]
[--monthly-tokens N]``: ``N`` a whole number (``0`` blocks) or ``none`` (removes the limit); a key
limit above its tenant's is refused. ``show --tenant T [--json]``: the tenant's limits and every key's,
as ``{"tenant": name, "limits": {...}, "keys": [{"key": "tr-PREFIX", "limits": {...}}]}``.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.limits import LIMIT_NAMES, Limits
from tenants.management.commands._common import tenant_named
from tenants.management.commands.apikey import find_key
from tenants.models import API_KEY_PREFIX, Tenant
from tenants.selectors import api_keys_for_tenant
from tenants.services import limits_set


class _Unset:
    """An option not given (None means ``none``: remove the limit)."""


argparse_unset = _Unset()


def limit_value(text: str) -> int | None:
    """``none`` -> None, a whole number >= 0 -> int; argparse's ``type``."""
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number or none, got {text!r}") from None
    if value < 0:
        raise ValueError("a limit is >= 0 (0 blocks) or none")
    return value


def _shown(limits: Limits) -> str:
    return ", ".join(f"{n}={'none' if v is None else v}" for n, v in limits.as_json().items())


class Command(BaseCommand):
    help = "Set or show the limits of a tenant and its API keys (N: a whole number, 0 blocks, or none)."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{set,show}")
        setting = actions.add_parser("set", help="Set limits of the tenant, or of one key with --key.")
        setting.add_argument("--key", metavar="tr-PREFIX", help="The key (prefix, shown form or id).")
        for name in LIMIT_NAMES:
            setting.add_argument(f"--{name.replace('_', '-')}", dest=name, type=limit_value, metavar="N",
                                 default=argparse_unset)
        show = actions.add_parser("show", help="Show the tenant's limits and its keys'.")
        show.add_argument("--json", action="store_true", help="One JSON object.")
        for sub in (setting, show):
            sub.add_argument("--tenant", required=True, metavar="NAME", help="Tenant name or slug.")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_named(options["tenant"])
        getattr(self, f"_{options['action']}")(tenant, options)

    def _set(self, tenant: Tenant, options: dict[str, Any]) -> None:
        values = {n: options[n] for n in LIMIT_NAMES if options[n] is not argparse_unset}
        if not values:
            names = ", ".join(f"--{n.replace('_', '-')}" for n in LIMIT_NAMES)
            raise CommandError(f"nothing to set: give at least one of {names}")
        key = find_key(tenant, options["key"]) if options["key"] else None
        try:
            limits = limits_set(tenant=tenant, key=key, values=values)
        except ValidationError as exc:
            raise CommandError("; ".join(_messages(exc))) from None
        holder = f"key {API_KEY_PREFIX}-{key.prefix}" if key is not None else f"tenant {tenant.name}"
        self.stdout.write(f"Limits of {holder}: {_shown(limits)}")

    def _show(self, tenant: Tenant, options: dict[str, Any]) -> None:
        rows = api_keys_for_tenant(tenant).order_by("created", "pk")
        keys = [(f"{API_KEY_PREFIX}-{k.prefix}", k.limits()) for k in rows]
        if options["json"]:
            self.stdout.write(json.dumps({"tenant": tenant.name, "limits": tenant.limits().as_json(),
                                          "keys": [{"key": key, "limits": lim.as_json()} for key, lim in keys]}))
            return
        self.stdout.write("\n".join([f"{tenant.name}: {_shown(tenant.limits())}",
                                     *(f"  {key}: {_shown(lim)}" for key, lim in keys)]))


def _messages(exc: ValidationError) -> list[str]:
    if hasattr(exc, "error_dict"):
        return [f"--{name.replace('_', '-')}: {' '.join(str(m) for m in errors[0].messages)}"
                for name, errors in exc.error_dict.items()]
    return [str(m) for m in exc.messages]
