"""``prices set|show``: the price map from the shell (USD per million tokens; docs/money.md).

``set --model GLOB [--upstream NAME] --input USD --output USD [--cache-read USD] [--cache-write USD]
[--reasoning USD] [--from ISO]``: a new price in force from now (or ``--from``); requests before it keep
their price. ``show [--json]``: every price in force now, the operator's and the shipped defaults, as
``{"prices": [{"model", "upstream", "input", "output", "cache_read", "cache_write", "reasoning", "since",
"source", "operator"}]}`` (USD per million; ``since`` ISO 8601).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from billing import book
from billing.cost import Price
from billing.models import ModelPrice

#: The most USD per million tokens a price may say (a typo guard, not a market view).
MAX_USD = Decimal(100_000)


def usd(text: str) -> Decimal:
    """A price in USD per million tokens (>= 0); argparse's ``type``."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"expected an amount in USD, got {text!r}") from None
    if not value.is_finite() or value < 0 or value > MAX_USD:
        raise ValueError(f"a price is 0 to {MAX_USD} USD per million tokens")
    return value


def when(text: str) -> datetime:
    """An ISO 8601 time (UTC when it names no zone); argparse's ``type``."""
    parsed = parse_datetime(text) or (parse_datetime(text + "T00:00:00") if len(text) == 10 else None)
    if parsed is None:
        raise ValueError(f"expected an ISO 8601 time, got {text!r}")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def in_force(now: float) -> list[Price]:
    """The prices in force at ``now``: per (model glob, upstream glob, operator or default) the latest started."""
    latest: dict[tuple[str, str, bool], Price] = {}
    for price in book.load().prices:
        key = (price.model, price.upstream, price.id is not None)
        if price.since <= now and (key not in latest or price.since > latest[key].since):
            latest[key] = price
    return sorted(latest.values(), key=lambda p: (p.model, p.upstream, p.id is None))


def _json(price: Price) -> dict[str, Any]:
    return {"model": price.model, "upstream": price.upstream, "input": price.input, "output": price.output,
            "cache_read": price.cache_read, "cache_write": price.cache_write, "reasoning": price.reasoning,
            "since": datetime.fromtimestamp(price.since, UTC).isoformat() if math.isfinite(price.since) else None,
            "source": price.source, "operator": price.id is not None}


class Command(BaseCommand):
    help = "Set or show model prices (USD per million tokens)."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{set,show}")
        setting = actions.add_parser("set", help="A new price for a model glob, in force from now (or --from).")
        setting.add_argument("--model", required=True, metavar="GLOB", help="Upstream model glob, e.g. deepseek-*.")
        setting.add_argument("--upstream", default="", metavar="NAME", help="Upstream name glob (default: any).")
        for name, required in (("input", True), ("output", True), ("cache-read", False), ("cache-write", False),
                               ("reasoning", False)):
            setting.add_argument(f"--{name}", type=usd, required=required, metavar="USD",
                                 help="USD per million tokens.")
        setting.add_argument("--from", dest="since", type=when, metavar="ISO", help="In force from (default: now).")
        show = actions.add_parser("show", help="The prices in force now.")
        show.add_argument("--json", action="store_true", help="One JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "set":
            self._set(options)
        else:
            self._show(options)

    def _set(self, options: dict[str, Any]) -> None:
        model, upstream = options["model"].strip(), options["upstream"].strip()
        if not model or len(model) > 200 or len(upstream) > 200:
            raise CommandError("--model is a glob of 1 to 200 characters (--upstream at most 200)")
        row = ModelPrice.objects.create(
            model=model, upstream=upstream, input_usd=options["input"], output_usd=options["output"],
            cache_read_usd=options["cache_read"], cache_write_usd=options["cache_write"],
            reasoning_usd=options["reasoning"], effective_from=options["since"] or timezone.now())
        book.reset()  # this process; serving processes read it within BILLING_REFRESH_SECONDS
        self.stdout.write(f"Price set: {row}")

    def _show(self, options: dict[str, Any]) -> None:
        prices = in_force(timezone.now().timestamp())
        if options["json"]:
            self.stdout.write(json.dumps({"prices": [_json(p) for p in prices]}))
            return
        for p in prices:
            where = f" at {p.upstream}" if p.upstream else ""
            extra = "".join(f", {label} ${v}" for label, v in (("cache read", p.cache_read),
                                                               ("cache write", p.cache_write),
                                                               ("reasoning", p.reasoning)) if v is not None)
            origin = "operator" if p.id is not None else p.source
            self.stdout.write(f"{p.model}{where}: ${p.input} in, ${p.output} out{extra} per M  ({origin})")
