"""The live broken-turn rate of a target (an upstream and the model it is asked for), the choice among a
route's interchangeable targets by that rate, and their names in the shared state (``proxy.routing.quality``
reads and counts them on the request path; ``tenants.pools`` and the dashboard show them). Pure but for
``read_sync``.

A **turn** here is a guarded request's first attempt that the guard judged: it counts in ``total``, and in
``broken`` when the guard found it broken (retried or refused for broken model output). Upstream errors
(HTTP, transport, timeouts) are the circuit's business, not this rate's. The counts live in two sliding
windows of ``ROUTING_QUALITY_WINDOW_SECONDS`` (``infra.shared_state.Window``: the current fixed bucket plus
the previous one weighted by its overlap), so the memory per target is four integers whatever the traffic.

``choose`` takes the target of lowest smoothed rate (``Rate.value``: Laplace's rule, ``(broken + 1) /
(total + 2)``, so an unmeasured target reads 0.5 and one turn moves nothing much), the route's order
breaking ties, and with probability ``explore`` one of the others (uniformly), so a recovered target is
noticed and a worse one still gets a few sessions.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings

from infra.shared_state import Window


@dataclass(frozen=True, slots=True)
class Rate:
    """A target's recent turns: ``broken`` of ``total`` (sliding-window counts, >= 0)."""

    broken: float = 0.0
    total: float = 0.0

    def value(self) -> float:
        """The smoothed broken-turn rate in (0, 1): ``(broken + 1) / (total + 2)``."""
        total = max(0.0, self.total)
        broken = min(max(0.0, self.broken), total)
        return (broken + 1.0) / (total + 2.0)

    def observed(self) -> float | None:
        """The plain rate ``broken / total`` (for operators), None without a turn."""
        return min(1.0, max(0.0, self.broken) / self.total) if self.total >= 1 else None


def choose(rates: Sequence[Rate], rand: float, explore: float) -> int:
    """The index in ``rates`` (one per target, the route's order; at least one) of the target a new session
    goes to: the lowest ``Rate.value`` (the earliest on ties), or, when ``rand`` (in [0, 1)) is below
    ``explore`` (clamped to [0, 0.5]), one of the others picked by ``rand``. Raises ``ValueError`` for no rates."""
    if not rates:
        raise ValueError("a route has at least one target")
    best = min(range(len(rates)), key=lambda i: (rates[i].value(), i))
    share = min(max(explore, 0.0), 0.5)
    point = min(max(rand, 0.0), 0.999999999)
    if len(rates) < 2 or point >= share:
        return best
    others = [i for i in range(len(rates)) if i != best]
    return others[min(int(point / share * len(others)), len(others) - 1)]


@functools.lru_cache(maxsize=4096)
def target_key(upstream_id: int, model: str) -> str:
    """``<upstream id>:<digest of the model>``: bounded whatever the model string (a route may pass the
    client's model through)."""
    return f"{upstream_id}:{hashlib.sha256(model[:500].encode('utf-8', 'replace')).hexdigest()[:12]}"


def windows(upstream_id: int, model: str, *, broken: int = 0, total: int = 0) -> tuple[Window, Window]:
    """The ``(total, broken)`` counting windows of a target, with what one call adds (0: a read)."""
    period = max(10.0, float(settings.ROUTING_QUALITY_WINDOW_SECONDS))
    key = target_key(upstream_id, model)
    return (Window(f"rq:t:{key}", period, None, cost=total), Window(f"rq:b:{key}", period, None, cost=broken))


def rate_of(total: float, broken: float) -> Rate:
    """The ``Rate`` of window counts as read (never more broken than total, never negative)."""
    total = max(0.0, float(total))
    return Rate(min(max(0.0, float(broken)), total), total)


def read_sync(targets: Sequence[tuple[int, str]], now: float) -> list[Rate]:
    """The rates of ``(upstream id, model)`` targets from synchronous code (``tenants.pools``, the dashboard):
    Redis with a 0.5 s timeout when ``REDIS_URL`` is set (nothing known on any failure), else no rate (the
    state is the server process's own memory)."""
    if not targets or not settings.REDIS_URL:
        return [Rate() for _ in targets]
    names: list[str] = []
    weights: list[float] = []
    for upstream_id, model in targets:
        for window in windows(upstream_id, model):
            current, previous, weight, _ = window.buckets(now)
            names += [f"{settings.LIMITS_KEY_PREFIX}w:{window.name}:{current}",
                      f"{settings.LIMITS_KEY_PREFIX}w:{window.name}:{previous}"]
            weights.append(weight)
    import redis

    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            raw = client.mget(names)
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - a view of advisory state: nothing known
        return [Rate() for _ in targets]
    counts = [_int(r) for r in raw]
    sums = [counts[2 * i] + counts[2 * i + 1] * weights[i] for i in range(len(weights))]
    return [rate_of(math.ceil(sums[2 * i] - 1e-9), math.ceil(sums[2 * i + 1] - 1e-9)) for i in range(len(targets))]


#: How many model names per upstream the served list keeps (the newest).
SERVED_MAX = 100


def served_key(upstream_id: int) -> str:
    """The shared-state list (``SharedState.append``) of the upstream models ``upstream_id`` served turns of
    lately (``proxy.routing.quality.count`` notes them), so operators see the rate of every model served, not
    only of those the routes name."""
    return f"rq:m:{upstream_id}"


def served_sync(upstream_ids: Sequence[int]) -> dict[int, list[str]]:
    """Per upstream id, the distinct models it served lately (newest last, at most ``SERVED_MAX``), from
    synchronous code: Redis with a 0.5 s timeout (nothing known on any failure, or without ``REDIS_URL``)."""
    if not upstream_ids or not settings.REDIS_URL:
        return {}
    import redis

    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            with client.pipeline(transaction=False) as pipe:
                for uid in upstream_ids:
                    pipe.lrange(f"{settings.LIMITS_KEY_PREFIX}s:{served_key(uid)}", -SERVED_MAX, -1)
                raw = pipe.execute()
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - a view of advisory state: nothing known
        return {}
    out: dict[int, list[str]] = {}
    for uid, names in zip(upstream_ids, raw, strict=True):
        seen = [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names or ()]
        out[uid] = list(dict.fromkeys(m[:200] for m in seen if m))
    return out


def _int(raw: object) -> int:
    if not isinstance(raw, bytes | str | int) or isinstance(raw, bool):
        return 0
    try:
        return max(0, int(raw))
    except ValueError:
        return 0
