"""Shared state for limits and the loop breaker: one interface, in Redis or in process memory.

What it offers (all ``async``, safe on the event loop):

- **Windows** (``Window``): request and token counters over a period, sliding (the current and the
  previous fixed bucket, the previous one weighted by how much of it still overlaps the window: the
  approximation Cloudflare and redis-cell use) or fixed (calendar days and months: ``bucket`` and
  ``reset_at`` given by the caller). ``admit`` checks every window and every concurrency lease of a
  request and, only when all pass, counts them: atomically, in one Lua script, one round trip.
  ``add`` corrects counts afterwards (tokens estimated before, known after); ``settle`` does that and
  gives the request's leases back in one round trip too. Both scripts are registered once per event
  loop and called by ``EVALSHA`` (redis-py loads a script again after a Redis restart); the admission's
  numbers go as one JSON argument and come back as one string (packing and reading ~100 arguments and
  a nested reply was most of its client-side cost; ``bench/limits_micro.py``).
- **Leases** (``Lease``): a concurrency slot held by one request, with an expiry, so a slot held by a
  process that died frees itself; ``release`` gives it back.
- **Remembered values** with a TTL (``remember`` / ``recall``) and **lists** with a TTL and a length
  bound (``append`` / ``recent``): session fingerprints of the loop breaker.
- **A broadcast** (``publish`` / ``publish_sync`` / ``subscribe``): revocations, to every process.

``RedisState`` (``REDIS_URL`` set) keeps it in Redis, so every process sees the same counts. Each call
has a short deadline (``LIMITS_REDIS_TIMEOUT_SECONDS``, 50 ms by default) and a circuit breaker: a
failed or late call opens it for ``LIMITS_REDIS_COOLDOWN_SECONDS`` during which no call is tried.
Meanwhile everything *fails open*: ``admit`` admits (``Verdict.fail_open``), ``recall`` knows nothing,
writes are dropped; each such answer counts in ``toolrelay_limits_fail_open_total{op}`` and the first
of an outage logs a warning. Nothing raises to the caller. (Keys of one request are in several hash
slots: a single Redis, or a primary with replicas, not Redis Cluster.)

``MemoryState`` (no ``REDIS_URL``: one process, ``make run``) has the same semantics in this process.

Times are Unix seconds (``clock``, injectable for tests); counts are integers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings

from infra import metrics

logger = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], float]
Callback = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Window:
    """A counter over a window of ``period`` seconds, named ``name`` (e.g. ``key:42:rpm``).

    ``limit`` None counts without refusing; 0 refuses everything. ``cost`` is what one admission adds
    (1 request, N estimated tokens). ``strict``: refused when ``used + cost > limit`` (a rate); else
    when ``used >= limit`` (a budget: the request that crosses it is still served). ``sliding``
    windows weigh the previous bucket in; fixed ones count one bucket: ``bucket`` (e.g.
    ``2026-12``) ending at ``reset_at`` (Unix seconds) when given, else ``floor(now / period)``.
    """

    name: str
    period: float
    limit: int | None
    cost: int = 1
    strict: bool = True
    sliding: bool = True
    bucket: str | None = None
    reset_at: float | None = None

    def buckets(self, now: float) -> tuple[str, str, float, float]:
        """``(current bucket, previous bucket, weight of the previous one 0..1, seconds to the reset)``."""
        if self.bucket is not None:
            reset = (self.reset_at or now + self.period) - now
            return self.bucket, "", 0.0, max(0.0, reset)
        index = math.floor(now / self.period)
        elapsed = now - index * self.period
        weight = 1.0 - elapsed / self.period if self.sliding else 0.0
        return str(index), str(index - 1), weight, self.period - elapsed

    def ttl(self, now: float) -> float:
        """Seconds the current bucket must be kept (it is read back as the previous one when sliding)."""
        if self.bucket is not None:
            return max(1.0, (self.reset_at or now + self.period) - now + 60)
        return self.period * 2 + 1


@dataclass(frozen=True, slots=True)
class Lease:
    """A concurrency slot in ``name`` (at most ``limit`` held; None: unlimited, 0: none) held by
    ``holder`` for at most ``ttl`` seconds (a dead process's slot frees itself then)."""

    name: str
    limit: int | None
    ttl: float
    holder: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True, slots=True)
class WindowUsage:
    """A window after ``admit``: its ``limit``, what is ``used`` (the admission included when admitted)
    and seconds until its count drops (``reset``)."""

    window: Window
    used: int
    reset: float

    @property
    def remaining(self) -> int | None:
        """What is left under the limit (never negative), None without a limit."""
        return None if self.window.limit is None else max(0, self.window.limit - self.used)


@dataclass(frozen=True, slots=True)
class Verdict:
    """``admit``'s answer. ``refused``: the first window or lease over its limit (None: admitted, and
    everything was counted); ``usage`` per window in order; ``held`` slots per lease; ``fail_open``:
    the shared state could not be asked and the request was admitted unchecked."""

    refused: Window | Lease | None
    usage: tuple[WindowUsage, ...]
    held: tuple[int, ...]
    fail_open: bool = False

    @property
    def admitted(self) -> bool:
        return self.refused is None


class SharedState(ABC):
    """The interface (see the module docstring); ``get_state()`` gives the process's instance."""

    def __init__(self, clock: Clock = time.time) -> None:
        self.clock = clock

    @abstractmethod
    async def admit(self, windows: Sequence[Window], leases: Sequence[Lease] = ()) -> Verdict:
        """Check every window and lease; when all pass count the windows' costs and take the leases
        (all or nothing, atomic, one round trip)."""

    @abstractmethod
    async def add(self, adjustments: Sequence[tuple[Window, int]]) -> None:
        """Add ``delta`` (may be negative; a count never goes below 0) to each window's current bucket."""

    @abstractmethod
    async def release(self, leases: Sequence[Lease]) -> None:
        """Give the leases back (a lease already expired is no error)."""

    async def settle(self, adjustments: Sequence[tuple[Window, int]], leases: Sequence[Lease]) -> None:
        """``add(adjustments)`` and ``release(leases)`` together: a request's settle (one round trip in Redis)."""
        await self.add(adjustments)
        await self.release(leases)

    @abstractmethod
    async def renew(self, leases: Sequence[Lease]) -> None:
        """Extend the leases still held to ``ttl`` seconds from now (one round trip); an expired lease is
        not taken again."""

    @abstractmethod
    async def remember(self, key: str, value: str, ttl: float) -> None:
        """Keep ``value`` under ``key`` for ``ttl`` seconds."""

    @abstractmethod
    async def recall(self, key: str) -> str | None:
        """The value remembered under ``key``, None when none (or expired, or unknown: fail open)."""

    async def recall_many(self, keys: Sequence[str]) -> list[str | None]:
        """``recall`` of each of ``keys``, in order, in one round trip (all None when unavailable)."""
        return [await self.recall(key) for key in keys]

    @abstractmethod
    async def claim(self, key: str, value: str, ttl: float) -> bool:
        """Remember ``value`` under ``key`` for ``ttl`` seconds only if nothing is there: True when this
        call set it (one process wins; unavailable: True, fail open)."""

    @abstractmethod
    async def append(self, key: str, value: str, ttl: float, max_len: int = 100) -> None:
        """Append ``value`` to the list ``key``, keep its last ``max_len`` items, expire it ``ttl``
        seconds after this append."""

    @abstractmethod
    async def recent(self, key: str, count: int = 100) -> list[str]:
        """The last ``count`` items of list ``key``, oldest first ([] when none or unknown)."""

    @abstractmethod
    async def publish(self, channel: str, message: str) -> None:
        """Send ``message`` to every process subscribed to ``channel`` (this one included)."""

    @abstractmethod
    def publish_sync(self, channel: str, message: str) -> None:
        """``publish`` from synchronous code (admin, management commands); never raises."""

    @abstractmethod
    def subscribe(self, channel: str, callback: Callback) -> None:
        """Call ``callback(message)`` for every message on ``channel`` from now on. With Redis it runs on
        the event loop of the first subscription (call from a running loop); in memory in the
        publisher's thread: callbacks must be quick and thread-safe."""

    async def close(self) -> None:  # noqa: B027 - optional: nothing to release in memory
        """Release connections and background tasks."""


# ----- in process memory -----

class MemoryState(SharedState):
    """The shared state of a single process (no ``REDIS_URL``)."""

    def __init__(self, clock: Clock = time.time) -> None:
        super().__init__(clock)
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, float]] = {}  # key -> (count, expires at)
        self._leases: dict[str, dict[str, float]] = {}  # name -> holder -> expires at
        self._values: dict[str, tuple[str, float]] = {}
        self._lists: dict[str, tuple[list[str], float]] = {}
        self._subscribers: dict[str, list[Callback]] = {}
        self._ops = 0

    def _count(self, key: str, now: float) -> int:
        hit = self._counts.get(key)
        return hit[0] if hit is not None and hit[1] > now else 0

    def _held(self, name: str, now: float) -> dict[str, float]:
        holders = self._leases.setdefault(name, {})
        for holder in [h for h, expires in holders.items() if expires <= now]:
            del holders[holder]
        return holders

    def _sweep(self, now: float) -> None:
        self._ops += 1
        if self._ops % 1000:
            return
        for store in (self._counts, self._values, self._lists):
            for key in [k for k, v in store.items() if v[1] <= now]:
                del store[key]
        for name in [n for n, holders in self._leases.items() if not holders]:
            del self._leases[name]

    async def admit(self, windows: Sequence[Window], leases: Sequence[Lease] = ()) -> Verdict:
        now = self.clock()
        spans = [w.buckets(now) for w in windows]  # once per window: the key, the check and the usage use it
        with self._lock:
            self._sweep(now)
            refused: Window | Lease | None = None
            used: list[float] = []
            for w, (current, previous, weight, _) in zip(windows, spans, strict=True):
                u = self._count(f"{w.name}:{current}", now) + (
                    self._count(f"{w.name}:{previous}", now) * weight if weight > 0 else 0.0)
                used.append(u)
                if refused is None and _over(w, u):
                    refused = w
            held = [len(self._held(lease.name, now)) for lease in leases]
            for lease, n in zip(leases, held, strict=True):
                if refused is None and lease.limit is not None and n >= lease.limit:
                    refused = lease
            if refused is None:
                for i, w in enumerate(windows):
                    self._bump_key(f"{w.name}:{spans[i][0]}", w.cost, now + w.ttl(now), now)
                    used[i] += w.cost
                for i, lease in enumerate(leases):
                    self._leases[lease.name][lease.holder] = now + lease.ttl
                    held[i] += 1
        return Verdict(refused, _usage(windows, [_ceil(u) for u in used], [b[3] for b in spans]), tuple(held))

    def _bump(self, w: Window, delta: int, now: float) -> None:
        self._bump_key(f"{w.name}:{w.buckets(now)[0]}", delta, now + w.ttl(now), now)

    def _bump_key(self, key: str, delta: int, expires: float, now: float) -> None:
        self._counts[key] = (max(0, self._count(key, now) + delta), expires)

    async def add(self, adjustments: Sequence[tuple[Window, int]]) -> None:
        now = self.clock()
        with self._lock:
            for w, delta in adjustments:
                self._bump(w, delta, now)

    async def release(self, leases: Sequence[Lease]) -> None:
        with self._lock:
            for lease in leases:
                self._leases.get(lease.name, {}).pop(lease.holder, None)

    async def renew(self, leases: Sequence[Lease]) -> None:
        now = self.clock()
        with self._lock:
            for lease in leases:
                holders = self._held(lease.name, now)
                if lease.holder in holders:
                    holders[lease.holder] = now + lease.ttl

    async def remember(self, key: str, value: str, ttl: float) -> None:
        now = self.clock()
        with self._lock:
            self._sweep(now)
            self._values[key] = (value, now + ttl)

    async def recall(self, key: str) -> str | None:
        with self._lock:
            hit = self._values.get(key)
        return hit[0] if hit is not None and hit[1] > self.clock() else None

    async def claim(self, key: str, value: str, ttl: float) -> bool:
        now = self.clock()
        with self._lock:
            hit = self._values.get(key)
            if hit is not None and hit[1] > now:
                return False
            self._values[key] = (value, now + ttl)
            return True

    async def append(self, key: str, value: str, ttl: float, max_len: int = 100) -> None:
        now = self.clock()
        with self._lock:
            self._sweep(now)
            hit = self._lists.get(key)
            items = hit[0] if hit is not None and hit[1] > now else []
            items = [*items, value][-max_len:]
            self._lists[key] = (items, now + ttl)

    async def recent(self, key: str, count: int = 100) -> list[str]:
        with self._lock:
            hit = self._lists.get(key)
        if hit is None or hit[1] <= self.clock():
            return []
        return list(hit[0][-count:]) if count > 0 else []

    async def publish(self, channel: str, message: str) -> None:
        self.publish_sync(channel, message)

    def publish_sync(self, channel: str, message: str) -> None:
        with self._lock:
            callbacks = list(self._subscribers.get(channel, ()))
        for callback in callbacks:
            try:
                callback(message)
            except Exception:
                logger.exception("subscriber of %s failed", channel)

    def subscribe(self, channel: str, callback: Callback) -> None:
        with self._lock:
            self._subscribers.setdefault(channel, []).append(callback)


_EPS = 1e-9


def _over(w: Window, used: float) -> bool:
    if w.limit is None:
        return False
    return used + w.cost > w.limit + _EPS if w.strict else used >= w.limit - _EPS


def _ceil(used: float) -> int:
    return math.ceil(used - _EPS)


def _usage(windows: Sequence[Window], used: Sequence[int], resets: Sequence[float]) -> tuple[WindowUsage, ...]:
    return tuple(WindowUsage(w, int(u), r) for w, u, r in zip(windows, used, resets, strict=True))


# ----- Redis -----

#: KEYS: per window its current bucket, then the previous bucket of each sliding window (weight > 0), in
#: window order, then one sorted set per lease.
#: ARGV[1]: one JSON array (one argument to encode and send, not five per window): now, #windows, #leases,
#: #previous buckets; per window: limit (-1: none), cost, weight (0: no previous bucket), strict (1/0), ttl
#: (ms); per lease: limit (-1: none), holder, expires at.
#: Returns ``"refused|used used ...|held held ..."`` (refused 1-based, 0: admitted; one string to read back).
#: A sliding window's count is fractional (the previous bucket weighted): compared as such, reported
#: rounded up (``_over`` and ``_ceil`` do the same in memory). A bucket's expiry is set when it is made
#: (``PEXPIRE NX``): ``Window.ttl`` from then covers its life as the current and then the previous bucket.
_ADMIT = """
local EPS = 1e-9
local A = cjson.decode(ARGV[1])
local now, nw, nl, np = A[1], A[2], A[3], A[4]
local used, held, refused = {}, {}, 0
local a, p = 5, nw
for i = 1, nw do
  local limit, cost, weight = A[a], A[a + 1], A[a + 2]
  local u = tonumber(redis.call('GET', KEYS[i]) or '0')
  if weight > 0 then
    p = p + 1
    u = u + tonumber(redis.call('GET', KEYS[p]) or '0') * weight
  end
  used[i] = u
  if refused == 0 and limit >= 0 then
    if (A[a + 3] == 1 and u + cost > limit + EPS) or (A[a + 3] ~= 1 and u >= limit - EPS) then
      refused = i
    end
  end
  a = a + 5
end
local la, lk = a, nw + np
for j = 1, nl do
  local key = KEYS[lk + j]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  held[j] = redis.call('ZCARD', key)
  local limit = A[a]
  if refused == 0 and limit >= 0 and held[j] >= limit then refused = nw + j end
  a = a + 3
end
if refused == 0 then
  a = 5
  for i = 1, nw do
    local cost = A[a + 1]
    if cost ~= 0 then redis.call('INCRBY', KEYS[i], string.format('%d', cost)) end
    redis.call('PEXPIRE', KEYS[i], string.format('%d', A[a + 4]), 'NX')
    used[i] = used[i] + cost
    a = a + 5
  end
  a = la
  for j = 1, nl do
    local key, expires = KEYS[lk + j], A[a + 2]
    redis.call('ZADD', key, string.format('%.6f', expires), A[a + 1])
    local ms = math.ceil((expires - now) * 1000) + 1000
    if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
    held[j] = held[j] + 1
    a = a + 3
  end
end
for i = 1, nw do used[i] = string.format('%d', math.ceil(used[i] - EPS)) end
for j = 1, nl do held[j] = string.format('%d', held[j]) end
return refused .. '|' .. table.concat(used, ' ') .. '|' .. table.concat(held, ' ')
"""

#: A request's settle in one call. KEYS: the buckets to correct, then the leases' sorted sets; ARGV: the
#: number of buckets; per bucket delta, ttl (ms) (never below 0); per lease its holder (taken out).
_SETTLE = """
local n = tonumber(ARGV[1])
for i = 1, n do
  local v = redis.call('INCRBY', KEYS[i], ARGV[2 * i])
  if v < 0 then redis.call('SET', KEYS[i], 0) end
  if redis.call('PTTL', KEYS[i]) < tonumber(ARGV[2 * i + 1]) then redis.call('PEXPIRE', KEYS[i], ARGV[2 * i + 1]) end
end
for j = n + 1, #KEYS do redis.call('ZREM', KEYS[j], ARGV[n + 1 + j]) end
return 0
"""


class RedisState(SharedState):
    """The shared state in Redis at ``url`` (keys under ``prefix``), failing open (module docstring)."""

    def __init__(self, url: str, *, prefix: str = "toolrelay:", clock: Clock = time.time,
                 timeout: float | None = None, cooldown: float | None = None) -> None:
        super().__init__(clock)
        self.url, self.prefix = url, prefix
        self.timeout = float(settings.LIMITS_REDIS_TIMEOUT_SECONDS if timeout is None else timeout)
        self.cooldown = float(settings.LIMITS_REDIS_COOLDOWN_SECONDS if cooldown is None else cooldown)
        self._clients: dict[int, Any] = {}  # event loop id -> redis.asyncio.Redis (its pool is per loop)
        self._open_until = 0.0  # monotonic: the circuit is open (no call tried) until then
        self._warned = False
        self._subscribers: dict[str, list[Callback]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._scripts: dict[int, tuple[Any, Any]] = {}

    # -- plumbing --

    def _client(self) -> Any:
        import redis.asyncio

        loop = id(asyncio.get_running_loop())
        client = self._clients.get(loop)
        if client is None:
            client = redis.asyncio.Redis.from_url(self.url, socket_timeout=self.timeout,
                                                  socket_connect_timeout=self.timeout, retry_on_timeout=False)
            self._clients[loop] = client
            self._scripts[loop] = (client.register_script(_ADMIT), client.register_script(_SETTLE))
        return client

    def _script(self, which: int) -> Any:
        self._client()
        return self._scripts[id(asyncio.get_running_loop())][which]

    def _k(self, name: str) -> str:
        return self.prefix + name

    @property
    def available(self) -> bool:
        """False while the circuit is open (Redis failed a moment ago)."""
        return time.monotonic() >= self._open_until

    async def _call(self, op: str, make: Callable[[], Awaitable[T]], default: T) -> T:
        """``await make()`` within the deadline; on any failure (or an open circuit) ``default``."""
        if not self.available:
            metrics.LIMITS_FAIL_OPEN.labels(op=op).inc()
            return default
        try:
            async with asyncio.timeout(self.timeout):  # no task per call, unlike ``wait_for`` before 3.12
                result = await make()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - fail open on anything Redis does (module docstring)
            self._open_until = time.monotonic() + self.cooldown
            metrics.LIMITS_FAIL_OPEN.labels(op=op).inc()
            if not self._warned:
                self._warned = True
                logger.warning("shared state (Redis) unavailable, limits fail open for %.1f s: %s: %s",
                               self.cooldown, type(exc).__name__, exc)
            return default
        if self._warned:
            self._warned = False
            logger.warning("shared state (Redis) available again")
        return result

    # -- windows and leases --

    async def admit(self, windows: Sequence[Window], leases: Sequence[Lease] = ()) -> Verdict:
        now = self.clock()
        prefix = self.prefix
        keys: list[str] = []
        previous: list[str] = []
        resets: list[float] = []
        args: list[Any] = [now, len(windows), len(leases), 0]
        for w in windows:
            current, before, weight, reset = w.buckets(now)
            keys.append(f"{prefix}w:{w.name}:{current}")
            if weight > 0:
                previous.append(f"{prefix}w:{w.name}:{before}")
            resets.append(reset)
            args += (-1 if w.limit is None else w.limit, w.cost, weight, 1 if w.strict else 0,
                     math.ceil(w.ttl(now) * 1000))
        args[3] = len(previous)
        keys += previous
        for lease in leases:
            keys.append(f"{prefix}l:{lease.name}")
            args += (-1 if lease.limit is None else lease.limit, lease.holder, now + lease.ttl)
        packed = [json.dumps(args, separators=(",", ":"))]
        answer = await self._call("admit", lambda: self._script(0)(keys=keys, args=packed), None)
        if answer is None:
            return Verdict(None, _usage(windows, [0] * len(windows), resets), (0,) * len(leases), fail_open=True)
        first, counts, slots = (answer.decode() if isinstance(answer, bytes) else str(answer)).split("|")
        index, used = int(first), [int(u) for u in counts.split()]
        held = tuple(int(h) for h in slots.split())
        refused: Window | Lease | None = None
        if index:
            refused = windows[index - 1] if index <= len(windows) else leases[index - 1 - len(windows)]
        return Verdict(refused, _usage(windows, used, resets), held)

    async def add(self, adjustments: Sequence[tuple[Window, int]]) -> None:
        await self.settle(adjustments, ())

    async def settle(self, adjustments: Sequence[tuple[Window, int]], leases: Sequence[Lease]) -> None:
        now = self.clock()
        keys = [self._k(f"w:{w.name}:{w.buckets(now)[0]}") for w, _ in adjustments]
        args: list[Any] = [len(keys)]
        for w, delta in adjustments:
            args += (int(delta), math.ceil(w.ttl(now) * 1000))
        keys += [self._k(f"l:{lease.name}") for lease in leases]
        args += [lease.holder for lease in leases]
        if keys:
            await self._call("settle" if leases else "add", lambda: self._script(1)(keys=keys, args=args), None)

    async def release(self, leases: Sequence[Lease]) -> None:
        await self.settle((), leases)

    async def renew(self, leases: Sequence[Lease]) -> None:
        now = self.clock()

        async def run() -> None:
            async with self._client().pipeline(transaction=False) as pipe:
                for lease in leases:
                    name = self._k(f"l:{lease.name}")
                    pipe.zadd(name, {lease.holder: now + lease.ttl}, xx=True)
                    pipe.pexpire(name, math.ceil(lease.ttl * 1000) + 1000, gt=True)
                await pipe.execute()
        if leases:
            await self._call("renew", run, None)

    # -- values and lists --

    async def remember(self, key: str, value: str, ttl: float) -> None:
        await self._call("remember", lambda: self._client().set(self._k(f"v:{key}"), value,
                                                                 px=max(1, math.ceil(ttl * 1000))), None)

    async def recall_many(self, keys: Sequence[str]) -> list[str | None]:
        if not keys:
            return []
        nothing: list[Any] = [None] * len(keys)
        raw = await self._call("recall", lambda: self._client().mget([self._k(f"v:{k}") for k in keys]), nothing)
        return [r.decode() if isinstance(r, bytes) else r for r in raw]

    async def claim(self, key: str, value: str, ttl: float) -> bool:
        won = await self._call("claim", lambda: self._client().set(self._k(f"v:{key}"), value, nx=True,
                                                                   px=max(1, math.ceil(ttl * 1000))), True)
        return bool(won)

    async def recall(self, key: str) -> str | None:
        raw = await self._call("recall", lambda: self._client().get(self._k(f"v:{key}")), None)
        return raw.decode() if isinstance(raw, bytes) else raw

    async def append(self, key: str, value: str, ttl: float, max_len: int = 100) -> None:
        async def run() -> None:
            name = self._k(f"s:{key}")
            async with self._client().pipeline(transaction=True) as pipe:
                pipe.rpush(name, value).ltrim(name, -max_len, -1).pexpire(name, max(1, math.ceil(ttl * 1000)))
                await pipe.execute()
        await self._call("append", run, None)

    async def recent(self, key: str, count: int = 100) -> list[str]:
        if count <= 0:
            return []
        empty: list[Any] = []
        raw = await self._call("recent", lambda: self._client().lrange(self._k(f"s:{key}"), -count, -1), empty)
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]

    # -- broadcast --

    async def publish(self, channel: str, message: str) -> None:
        await self._call("publish", lambda: self._client().publish(self._k(f"c:{channel}"), message), None)

    def publish_sync(self, channel: str, message: str) -> None:
        import redis

        try:
            client = redis.Redis.from_url(self.url, socket_timeout=0.5, socket_connect_timeout=0.5)
            try:
                client.publish(self._k(f"c:{channel}"), message)
            finally:
                client.close()
        except Exception as exc:  # noqa: BLE001 - revocation then falls back to the auth cache lifetime
            metrics.LIMITS_FAIL_OPEN.labels(op="publish").inc()
            logger.warning("broadcast on %s not sent (Redis unavailable): %s", channel, exc)

    def subscribe(self, channel: str, callback: Callback) -> None:
        self._subscribers.setdefault(self._k(f"c:{channel}"), []).append(callback)
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._listen())
        # a listener already running picks the new channel up at its next (re)subscription

    async def _listen(self) -> None:
        """Receive broadcasts forever; reconnect (at most once a second) whenever Redis fails."""
        import redis.asyncio

        lost = False
        while True:
            client = redis.asyncio.Redis.from_url(self.url, socket_connect_timeout=1.0)
            try:
                async with client.pubsub() as pubsub:
                    channels = list(self._subscribers)
                    await pubsub.subscribe(*channels)
                    if lost:
                        lost = False
                        logger.warning("broadcast listener reconnected to Redis")
                    while True:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        if list(self._subscribers) != channels:
                            break  # a channel was added: subscribe again with all of them
                        if message is not None:
                            self._deliver(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep listening once Redis is back
                if not lost:  # once per outage, not once a second
                    lost = True
                    logger.warning("broadcast listener lost Redis (%s); revocations fall back to the auth cache "
                                   "lifetime until it is back (retrying every second)", exc)
                await asyncio.sleep(1.0)
            finally:
                await client.aclose()

    def _deliver(self, message: dict[str, Any]) -> None:
        channel = message.get("channel")
        channel = channel.decode() if isinstance(channel, bytes) else str(channel)
        data = message.get("data")
        text = data.decode() if isinstance(data, bytes) else str(data)
        for callback in self._subscribers.get(channel, ()):
            try:
                callback(text)
            except Exception:
                logger.exception("subscriber of %s failed", channel)

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
            self._listener = None
        loop = id(asyncio.get_running_loop())
        client = self._clients.pop(loop, None)
        self._scripts.pop(loop, None)
        if client is not None:
            await client.aclose()


# ----- the process's instance -----

_state: SharedState | None = None
_state_lock = threading.Lock()


def get_state() -> SharedState:
    """The process's shared state: ``RedisState(REDIS_URL)`` when set, else ``MemoryState``."""
    global _state
    with _state_lock:
        if _state is None:
            _state = RedisState(settings.REDIS_URL, prefix=settings.LIMITS_KEY_PREFIX) if settings.REDIS_URL \
                else MemoryState()
        return _state


def reset_state(state: SharedState | None = None) -> None:
    """Replace the process's instance (tests; None: made again from the settings on next use)."""
    global _state
    with _state_lock:
        _state = state
