"""The prices a serving process charges with: ``price_book()`` -> ``PriceBook`` (ORM-free, never blocks).

The book is the shipped defaults (``billing/prices.json``) beneath the operator's ``ModelPrice`` rows,
loaded from the database once before the first request is served (``await ready()``, from the edge)
and then refreshed off the request path every ``BILLING_REFRESH_SECONDS`` (a daemon thread; the old
book is served meanwhile; with the database down, the last book stays). ``PriceBook.cost`` is what
``proxy.relay.attempts`` records on every attempt.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings

from billing.cost import Price, cost_usd, estimate_usd, pick
from proxy.guard.checks.usage import Usage

logger = logging.getLogger(__name__)

DEFAULTS = Path(__file__).with_name("prices.json")


@dataclass(frozen=True, slots=True)
class PriceBook:
    """Every price known (defaults and the operator's), and when it was read (monotonic seconds; 0: never
    from the database)."""

    prices: tuple[Price, ...]
    loaded: float = 0.0
    #: (model, upstream) -> the price in force now (the request path asks the same few pairs again and again;
    #: a price that starts later is picked up when the book is read again). Bounded.
    memo: dict[tuple[str, str], Price | None] = field(default_factory=dict, compare=False, repr=False)

    def price(self, model: str, upstream: str = "", when: float | None = None) -> Price | None:
        """The price in force (``billing.cost.pick``) at ``when`` (Unix seconds; None: now)."""
        if when is not None:
            return pick(self.prices, model, upstream, when)
        key = (model, upstream)
        if key in self.memo:
            return self.memo[key]
        found = pick(self.prices, model, upstream, time.time())
        if len(self.memo) < 10_000:
            self.memo[key] = found
        return found

    def cost(self, usage: Usage, *, model: str, upstream: str = "", when: float | None = None) -> float | None:
        """USD of ``usage`` for ``model`` at ``upstream``; None when no price applies (unpriced)."""
        price = self.price(model, upstream, when)
        return None if price is None else cost_usd(usage, price)

    def estimate(self, prompt_tokens: int, output_tokens: int, *, model: str, upstream: str = "") -> float | None:
        """USD a request of this size would cost (``billing.cost.estimate_usd``); None: unpriced."""
        price = self.price(model, upstream)
        return None if price is None else estimate_usd(prompt_tokens, output_tokens, price)


def _day(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@cache
def defaults() -> tuple[Price, ...]:
    """The shipped default prices (``prices.json``: model glob, USD per million, date, source)."""
    data = json.loads(DEFAULTS.read_text())
    return tuple(
        Price(
            model=p["model"],
            input=float(p["input"]),
            output=float(p["output"]),
            cache_read=p.get("cache_read"),
            cache_write=p.get("cache_write"),
            reasoning=p.get("reasoning"),
            upstream=p.get("upstream", ""),
            since=_day(p["date"]),
            source=p["source"],
        )
        for p in data["prices"]
    )


def _usd(value: Any) -> float | None:
    return None if value is None else float(value)


def load() -> PriceBook:
    """Read the operator's prices (synchronous ORM) and make the book."""
    from billing.models import ModelPrice

    rows = ModelPrice.objects.all()
    own = tuple(
        Price(
            model=r.model,
            upstream=r.upstream,
            input=float(r.input_usd),
            output=float(r.output_usd),
            cache_read=_usd(r.cache_read_usd),
            cache_write=_usd(r.cache_write_usd),
            reasoning=_usd(r.reasoning_usd),
            since=r.effective_from.timestamp(),
            source=r.source,
            id=r.pk,
        )
        for r in rows
    )
    return PriceBook((*own, *defaults()), loaded=time.monotonic())


class _Holder:
    """The process's book and its one refresh at a time."""

    def __init__(self) -> None:
        self.book = PriceBook(())
        self.lock = threading.Lock()
        self.refreshing = False

    def refresh(self) -> None:
        """Load the book now (in the calling thread); on failure keep the old one."""
        from django.db import connections

        book: PriceBook | None = None
        try:
            book = load()
        except Exception as exc:  # noqa: BLE001 - the database may be down: serve the last book
            logger.warning("prices not refreshed (the last ones stay in force): %s: %s", type(exc).__name__, exc)
            # never loaded: the defaults until the next try (no database call per request meanwhile)
            book = None if self.book.loaded else PriceBook(defaults(), loaded=time.monotonic())
        finally:
            connections.close_all()  # this thread's connection: none is left to the garbage collector
            with self.lock:
                self.refreshing = False
        if book is not None:
            self.book = book

    def current(self) -> PriceBook:
        book = self.book
        if book.loaded and time.monotonic() - book.loaded < float(settings.BILLING_REFRESH_SECONDS):  # inf: never
            return book
        with self.lock:
            if self.refreshing:
                return book
            self.refreshing = True
        threading.Thread(target=self.refresh, name="price-book", daemon=True).start()
        return book if book.prices else PriceBook(defaults())


_holder = _Holder()


def price_book() -> PriceBook:
    """The process's book (never blocks: a stale one starts its refresh in a thread and is served meanwhile;
    before the first load, the shipped defaults)."""
    return _holder.current()


async def ready() -> None:
    """Load the book from the database once, before the first request of this process is charged (one
    thread hop the first time; nothing after)."""
    if not _holder.book.loaded:
        with _holder.lock:
            _holder.refreshing = True
        await asyncio.to_thread(_holder.refresh)


def reset(book: PriceBook | None = None) -> None:
    """Replace the process's book (tests, and ``prices set`` in this process); None: load on next use."""
    _holder.book = book if book is not None else PriceBook(())
