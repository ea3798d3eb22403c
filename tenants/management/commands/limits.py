"""``limits set|show --tenant T [--key tr-PREFIX | --member USER]``: limits and money budgets from the shell.

``set --tenant T [--key tr-PREFIX | --member USER] [--rpm N] [--tpm N] [--concurrency N] [--daily-tokens N]
[--monthly-tokens N] [--daily-usd X] [--weekly-usd Y] [--monthly-usd Z] [--soft-percent [WINDOW=]P ...]``:
``N`` a whole number (``0`` blocks), ``X`` an amount in USD, ``P`` a soft threshold (a whole percent 1-100: past
it the tenant's alert webhooks fire once per budget and period; default 80): ``--soft-percent P`` the holder's,
for each budget without its own, ``--soft-percent daily=P`` (``weekly``, ``monthly``; or ``daily_usd=P``) that
budget's own (repeatable). Each value may be ``none`` (removes it); a key's or member's limit above its
tenant's is refused. ``show --tenant T [--json]``: the tenant's limits, every key's and every member's, as
``{"tenant": name, "limits": {...}, "keys": [{"key": "tr-PREFIX", "limits": {...}}], "members": [{"member":
username, "limits": {...}}]}``.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.limits import HOLDER_NAMES, LIMIT_NAMES, MONEY_NAMES, SOFT_NAME, WINDOW_SOFT_NAMES, Limits
from tenants.management.commands._common import tenant_named
from tenants.management.commands.apikey import find_key
from tenants.models import API_KEY_PREFIX, Membership, Tenant
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


def usd_value(text: str) -> float | None:
    """``none`` -> None, an amount in USD >= 0 -> float; argparse's ``type``."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected an amount in USD or none, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise ValueError("a budget is >= 0 USD (0 blocks) or none")
    return value


def percent_value(text: str) -> int | None:
    """``none`` -> None, a whole percent 1-100 -> int; argparse's ``type``."""
    value = limit_value(text)
    if value is not None and not 1 <= value <= 100:
        raise ValueError("the soft threshold is a whole percent from 1 to 100, or none")
    return value


#: ``--soft-percent WINDOW=P``: the window names it takes, and the budget each names.
SOFT_WINDOWS = {**{n.removesuffix("_usd"): n for n in MONEY_NAMES}, **{n: n for n in MONEY_NAMES}}


def soft_value(text: str) -> tuple[str, int | None]:
    """``P`` -> (``money_soft_percent``, P); ``daily=P`` (``weekly``, ``monthly``, or the budget's name
    ``daily_usd``) -> (``daily_usd_soft_percent``, P); ``P`` a whole percent 1-100 or ``none``; argparse's
    ``type``."""
    window, sep, value = text.rpartition("=")
    if not sep:
        return SOFT_NAME, percent_value(text)
    budget = SOFT_WINDOWS.get(window.strip().lower())
    if budget is None:
        names = ", ".join(n.removesuffix("_usd") for n in MONEY_NAMES)
        raise ValueError(f"unknown window {window!r}: one of {names}")
    return WINDOW_SOFT_NAMES[budget], percent_value(value)


def _shown(limits: Limits, names: tuple[str, ...] = HOLDER_NAMES) -> str:
    return ", ".join(f"{n}={'none' if v is None else v}" for n, v in limits.as_json().items() if n in names)


def _member(tenant: Tenant, username: str) -> Membership:
    member = Membership.objects.filter(tenant=tenant, user__username=username).select_related("user").first()
    if member is None:
        raise CommandError(f"{username!r} is not a member of {tenant.name}")
    return member


class Command(BaseCommand):
    help = "Set or show the limits of a tenant and its API keys (N: a whole number, 0 blocks, or none)."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{set,show}")
        setting = actions.add_parser("set", help="Set limits of the tenant, or of one key with --key.")
        holder = setting.add_mutually_exclusive_group()
        holder.add_argument("--key", metavar="tr-PREFIX", help="The key (prefix, shown form or id).")
        holder.add_argument("--member", metavar="USER", help="A member of the tenant (over all their keys).")
        for name in LIMIT_NAMES:
            money = name in MONEY_NAMES
            setting.add_argument(f"--{name.replace('_', '-')}", dest=name, type=usd_value if money else limit_value,
                                 metavar="USD" if money else "N", default=argparse_unset)
        setting.add_argument("--soft-percent", "--money-soft-percent", dest="soft", type=soft_value, action="append",
                             metavar="[WINDOW=]P", default=[],
                             help="Soft threshold of the money budgets, 1-100 percent (none: the default, 80); "
                                  "daily=P, weekly=P or monthly=P: that budget's own (none: the holder's). "
                                  "Repeatable.")
        show = actions.add_parser("show", help="Show the tenant's limits and its keys'.")
        show.add_argument("--json", action="store_true", help="One JSON object.")
        for sub in (setting, show):
            sub.add_argument("--tenant", required=True, metavar="NAME", help="Tenant name or slug.")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_named(options["tenant"])
        getattr(self, f"_{options['action']}")(tenant, options)

    def _set(self, tenant: Tenant, options: dict[str, Any]) -> None:
        values = {n: options[n] for n in LIMIT_NAMES if options[n] is not argparse_unset}
        values.update(dict(options.get("soft") or []))
        if not values:
            names = ", ".join([*(f"--{n.replace('_', '-')}" for n in LIMIT_NAMES), "--soft-percent"])
            raise CommandError(f"nothing to set: give at least one of {names}")
        key = find_key(tenant, options["key"]) if options["key"] else None
        member = _member(tenant, options["member"]) if options.get("member") else None
        try:
            limits = limits_set(tenant=tenant, key=key, member=member, values=values)
        except ValidationError as exc:
            raise CommandError("; ".join(_messages(exc))) from None
        holder = f"key {API_KEY_PREFIX}-{key.prefix}" if key is not None else f"tenant {tenant.name}"
        if member is not None:
            holder = f"member {member.user.get_username()}"
        self.stdout.write(f"Limits of {holder}: {_shown(limits)}")

    def _show(self, tenant: Tenant, options: dict[str, Any]) -> None:
        rows = api_keys_for_tenant(tenant).order_by("created", "pk")
        keys = [(f"{API_KEY_PREFIX}-{k.prefix}", k.limits()) for k in rows]
        members = [(m.user.get_username(), m.limits()) for m in
                   Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username")]
        if options["json"]:
            self.stdout.write(json.dumps({"tenant": tenant.name, "limits": tenant.limits().as_json(),
                                          "keys": [{"key": key, "limits": lim.as_json()} for key, lim in keys],
                                          "members": [{"member": name, "limits": lim.as_json()}
                                                      for name, lim in members]}))
            return
        self.stdout.write("\n".join([f"{tenant.name}: {_shown(tenant.limits())}",
                                     *(f"  {key}: {_shown(lim)}" for key, lim in keys),
                                     *(f"  member {name}: {_shown(lim)}" for name, lim in members)]))


def _messages(exc: ValidationError) -> list[str]:
    if hasattr(exc, "error_dict"):
        return [f"--{name.replace('_', '-')}: {' '.join(str(m) for m in errors[0].messages)}"
                for name, errors in exc.error_dict.items()]
    return [str(m) for m in exc.messages]
