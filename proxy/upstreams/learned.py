"""What each upstream was learned to refuse, per upstream and model: kept in the process, shared.

A ``LearnedFact`` is one remembered fix (``proxy.upstreams.refusals.Fix``) for one (upstream, upstream model):
"``max_tokens`` at most 8192", "``stream_options`` left out". The upstream client keeps this
process's facts in a ``LearnedLimits`` and applies them to every body it sends, so a request after
a refusal goes right the first time. Nothing here reads the database on the request path:

- learned here: kept at once, journaled (``audit.records.limit_learned``, the journal writer
  stores it as an ``UpstreamLearnedLimit`` row, shown and editable in the admin) and, when
  ``REDIS_URL`` is set, written to Redis (a background task);
- learned elsewhere: every process pulls the Redis hash every ``UPSTREAM_LEARNED_SYNC_SECONDS``
  (a background task), and every principal carries the rows of its tenant's upstreams
  (``tenants.auth``: read with the key, in a database thread), merged in when a target is used.

Merging keeps, per (upstream, model, parameter), the fact learned (or edited) last; an admin edit is
stamped with its time, so it wins over what processes learned before it. A fact expires
``UPSTREAM_LEARNED_TTL_SECONDS`` after it was learned (default 7 days), so a raised limit is noticed:
the next request asks for what the client wanted again. An expired fact stays in the store as a
tombstone (the admin's "forget" is one), so an older copy cannot bring it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import replace

from proxy.upstreams.refusals import Fix, Refused
from tenants.learned import LearnedFact, redis_field, redis_key

logger = logging.getLogger(__name__)

#: Facts kept per process (the oldest are dropped past it; a fact is a few hundred bytes).
STORE_CAP = 10_000
_DETAIL_CAP = 300


class LearnedLimits:
    """This process's facts. ``fixes`` is called for every upstream body (a dict lookup or two); ``absorb``
    merges facts from elsewhere; ``learn`` keeps a new one. Safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._facts: dict[tuple[int, str, str], LearnedFact] = {}
        self._by_target: dict[tuple[int, str], dict[str, LearnedFact]] = {}
        self._absorbed: dict[int, tuple[LearnedFact, ...]] = {}  # the last tuple merged per upstream

    def fixes(self, upstream_id: int, model: str, carried: tuple[LearnedFact, ...] = ()) -> tuple[Fix, ...]:
        """The live fixes for ``model`` on ``upstream_id``, after merging the facts a principal ``carried``
        (merged once per tuple: the same principal's targets share it)."""
        if carried and self._absorbed.get(upstream_id) is not carried:
            self.absorb(carried)
            self._absorbed[upstream_id] = carried
        found = self._by_target.get((upstream_id, model))
        if not found:
            return ()
        now = time.time()
        return tuple(Fix(fact.parameter, fact.limit) for fact in list(found.values()) if fact.live(now))

    def absorb(self, facts: Iterable[LearnedFact]) -> list[LearnedFact]:
        """Merge ``facts``: per key the one learned last wins. Returns those that changed the store."""
        changed = []
        with self._lock:
            for fact in facts:
                held = self._facts.get(fact.key)
                if held is not None and held.learned_at >= fact.learned_at:
                    continue
                self._put(fact)
                changed.append(fact)
        return changed

    def learn(self, upstream_id: int, model: str, fix: Fix, *, ttl: float, detail: str = "",
              now: float | None = None) -> LearnedFact:
        """Keep ``fix`` for ``model`` on ``upstream_id`` for ``ttl`` seconds from ``now`` (unix seconds)."""
        now = time.time() if now is None else now
        fact = LearnedFact(upstream_id, model, fix.parameter, fix.limit, now, now + ttl, detail[:_DETAIL_CAP])
        with self._lock:
            held = self._facts.get(fact.key)
            if held is not None and held.learned_at > now:
                fact = replace(fact, learned_at=held.learned_at + 1e-6)  # a clock step back never loses it
            self._put(fact)
        return fact

    def facts(self) -> list[LearnedFact]:
        """Every fact held, live or not (tests, the admin's view of a process)."""
        with self._lock:
            return list(self._facts.values())

    def _put(self, fact: LearnedFact) -> None:
        if fact.key not in self._facts and len(self._facts) >= STORE_CAP:
            oldest = min(self._facts.values(), key=lambda f: f.learned_at)
            del self._facts[oldest.key]
            self._by_target.get(oldest.key[:2], {}).pop(oldest.parameter, None)
        self._facts[fact.key] = fact
        self._by_target.setdefault((fact.upstream_id, fact.model), {})[fact.parameter] = fact


def facts_of(refused: Refused) -> tuple[Fix, ...]:
    """The fixes of ``refused`` that hold for later requests."""
    return tuple(f for f in refused.fixes if f.remember)


# ----- sharing: the journal (the database, the admin) and Redis (sibling processes) -----

def record(facts: Iterable[LearnedFact], share: RedisShare | None) -> None:
    """Journal each fact (the journal writer stores it) and, with Redis, publish it in the background.
    Never raises and never waits (the request path calls it)."""
    from audit import records as audit

    for fact in facts:
        try:
            audit.limit_learned(fact=fact)
        except Exception:  # noqa: BLE001 - the process still has the fact; the audit must not fail a request
            logger.exception("learned limit not journaled")
        if share is not None:
            share.publish_later(fact)


class RedisShare:
    """The facts of every process in one Redis hash (``redis_key()``): ``publish`` one, ``pull`` all.

    Failures are logged once per outage and never raised: the process keeps its own facts, and the
    principals carry the database's."""

    def __init__(self, url: str) -> None:
        import redis.asyncio

        self._client = redis.asyncio.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._key = redis_key()
        self._failing = False
        self._publishing: set[asyncio.Task[None]] = set()

    def publish_later(self, fact: LearnedFact) -> None:
        """``publish`` in the background (the request path never waits); ``aclose`` lets it finish first,
        so no write reopens a connection of a closed client."""
        task = asyncio.ensure_future(self.publish(fact))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def publish(self, fact: LearnedFact) -> None:
        """Write ``fact`` unless the hash holds one learned later."""
        try:
            held = LearnedFact.from_json(await self._client.hget(self._key, redis_field(fact)))
            if held is None or held.learned_at < fact.learned_at:
                await self._client.hset(self._key, redis_field(fact), fact.to_json())
            self._ok()
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self._failed(exc)

    async def pull(self) -> list[LearnedFact]:
        """Every fact in the hash ([] when Redis cannot be read)."""
        try:
            raw = await self._client.hgetall(self._key)
            self._ok()
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self._failed(exc)
            return []
        return [fact for value in raw.values() if (fact := LearnedFact.from_json(value)) is not None]

    async def follow(self, store: LearnedLimits, interval: float) -> None:
        """Merge the hash into ``store`` every ``interval`` seconds, until cancelled."""
        while True:
            store.absorb(await self.pull())
            await asyncio.sleep(interval)

    async def aclose(self) -> None:
        """Let pending publishes end (bounded by their socket timeouts), then close the connections."""
        if self._publishing:
            await asyncio.wait(set(self._publishing), timeout=2.0)
        with contextlib.suppress(Exception):
            await self._client.aclose()

    def _ok(self) -> None:
        if self._failing:
            logger.warning("learned limits: Redis answers again")
        self._failing = False

    def _failed(self, exc: Exception) -> None:
        if not self._failing:
            logger.warning("learned limits not shared through Redis: %s", exc)
        self._failing = True


