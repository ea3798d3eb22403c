"""The rules of key pools and circuits, and their names in the shared state (``proxy.routing.router`` applies
them on the request path; ``tenants.pools`` shows them to operators). Pure but for ``read_sync``.

A **key** (``KeyState``) is ``ok``, ``cooling`` (a 429: until its ``Retry-After`` or a backoff) or
``disabled`` (a 401/403, until an operator acts or ``ROUTING_KEY_DISABLED_SECONDS``). ``choose_key``
picks by weight among the ok keys, and never benches the last one: with none ok it takes the
least-recently-failed (cooling before disabled).

A **circuit** (``Circuit``) is ``closed``; ``threshold`` consecutive transport errors, timeouts or 5xx
open it for ``cooldown`` seconds (the route skips the upstream); then it is ``half-open``: one probe
request may go (``router`` claims it in the shared state); its success closes the circuit, its failure
opens it again for another cool-down. Times are unix seconds (all processes share them).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.conf import settings

OK, COOLING, DISABLED = "ok", "cooling", "disabled"
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


@dataclass(frozen=True, slots=True)
class KeyState:
    """One pool key's state: cooling ``until`` (unix s, 0: not), ``disabled``, last failure ``failed_at``."""

    until: float = 0.0
    disabled: bool = False
    failed_at: float = 0.0

    def state(self, now: float) -> str:
        """``ok``, ``cooling`` or ``disabled`` at ``now``."""
        if self.disabled:
            return DISABLED
        return COOLING if self.until > now else OK

    def dumps(self) -> str:
        """Compact JSON (``loads`` reads it back)."""
        return json.dumps({"u": round(self.until, 3), "d": int(self.disabled), "f": round(self.failed_at, 3)})

    @classmethod
    def loads(cls, raw: str | None) -> KeyState:
        """The state in ``raw`` (``dumps``); a missing or malformed value is a fresh key."""
        if not raw:
            return _FRESH_KEY  # most keys of most requests: no dict, no parsing
        data = _object(raw)
        return cls(_num(data.get("u")), bool(data.get("d")), _num(data.get("f")))


def cooled(state: KeyState, now: float, seconds: float) -> KeyState:
    """``state`` after a 429 at ``now``: cooling for ``seconds`` (at least 0.1)."""
    return KeyState(until=max(state.until, now + max(0.1, seconds)), disabled=state.disabled, failed_at=now)


def disabled(state: KeyState, now: float) -> KeyState:
    """``state`` after a 401/403 at ``now``."""
    return KeyState(until=state.until, disabled=True, failed_at=now)


def choose_key(
    weights: Sequence[tuple[str, int]],
    states: Mapping[str, KeyState],
    now: float,
    rand: float,
    avoid: frozenset[str] = frozenset(),
) -> str:
    """The id of the key to use among ``weights`` (``(id, weight)``, at least one; weights below 1 count as 1).

    The ok keys not in ``avoid`` (the ones that failed earlier in this request), else the ok keys, by
    weight with ``rand`` in [0, 1); with none ok, the least-recently-failed key, cooling before
    disabled, ``avoid`` last (never none: the last usable key is never benched)."""
    if not weights:
        raise ValueError("a pool has at least one key")
    fresh = KeyState()
    ok = [(k, max(1, w)) for k, w in weights if states.get(k, fresh).state(now) == OK]
    pool = [kw for kw in ok if kw[0] not in avoid] or ok
    if pool:
        total = sum(w for _, w in pool)
        point = min(max(rand, 0.0), 0.999999999) * total
        for key, weight in pool:
            point -= weight
            if point < 0:
                return key
        return pool[-1][0]

    def rank(item: tuple[str, int]) -> tuple[int, int, float]:
        state = states.get(item[0], fresh)
        return (item[0] in avoid, state.disabled, state.failed_at)

    return min(weights, key=rank)[0]


@dataclass(frozen=True, slots=True)
class Circuit:
    """An upstream's circuit: consecutive ``failures``, ``opened_until`` (unix s; 0: closed) and when the
    last failure happened (``failed_at``)."""

    failures: int = 0
    opened_until: float = 0.0
    failed_at: float = 0.0

    def state(self, now: float) -> str:
        """``closed``, ``open`` (until ``opened_until``) or ``half-open`` (after it: a probe may go)."""
        if not self.opened_until:
            return CLOSED
        return OPEN if now < self.opened_until else HALF_OPEN

    def dumps(self) -> str:
        """Compact JSON (``loads`` reads it back)."""
        return json.dumps({"n": self.failures, "o": round(self.opened_until, 3), "f": round(self.failed_at, 3)})

    @classmethod
    def loads(cls, raw: str | None) -> Circuit:
        """The circuit in ``raw`` (``dumps``); missing or malformed: closed."""
        if not raw:
            return _CLOSED
        data = _object(raw)
        failures = data.get("n")
        return cls(
            failures if isinstance(failures, int) and failures >= 0 else 0, _num(data.get("o")), _num(data.get("f"))
        )


_FRESH_KEY, _CLOSED = KeyState(), Circuit()


def failed(circuit: Circuit, now: float, *, threshold: int, cooldown: float) -> Circuit:
    """``circuit`` after a transport error, timeout or 5xx at ``now``: a half-open circuit (its probe failed)
    opens again, a closed one opens at ``threshold`` consecutive failures, an open one stays open."""
    count = circuit.failures + 1
    state = circuit.state(now)
    if state == HALF_OPEN or (state == CLOSED and count >= max(1, threshold)):
        return Circuit(count, now + max(0.1, cooldown), now)
    return Circuit(count, circuit.opened_until, now)


def succeeded(circuit: Circuit) -> Circuit:
    """``circuit`` after an answer: closed, no failures counted."""
    return Circuit()


def _object(raw: str | None) -> dict[str, object]:
    if not raw or len(raw) > 1000:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else 0.0


def circuit_name(upstream_id: int) -> str:
    """The shared-state name of an upstream's circuit."""
    return f"rt:c:{upstream_id}"


def key_name(upstream_id: int, key_id: str) -> str:
    """The shared-state name of a pool key's state."""
    return f"rt:k:{upstream_id}:{key_id}"


def session_name(session: str, route_id: int | None = None) -> str:
    """The shared-state name of a session's upstream and key (``"<upstream id>:<key id>"``) on route
    ``route_id`` (None: the tenant's default upstream): one per route, so an agent's side requests on
    another model (a title, a summary) do not move its main route's upstream."""
    return f"rt:s:{route_id or 0}:{session[:64]}"


def probe_name(upstream_id: int) -> str:
    """The shared-state name of a half-open circuit's probe claim."""
    return f"rt:p:{upstream_id}"


def read_sync(names: Sequence[str]) -> list[str | None]:
    """The shared-state values of ``names`` from synchronous code (the admin, commands): Redis with a
    0.5 s timeout when ``REDIS_URL`` is set (None for each on any failure), else this process's memory
    (a command's own process knows nothing: the state is the server's)."""
    if not names:
        return []
    if settings.REDIS_URL:
        import redis

        try:
            client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
            try:
                raw = client.mget([f"{settings.LIMITS_KEY_PREFIX}v:{n}" for n in names])
            finally:
                client.close()
        except Exception:  # noqa: BLE001 - a view of advisory state: nothing known
            return [None] * len(names)
        return [r.decode() if isinstance(r, bytes) else r for r in raw]
    from infra.shared_state import get_state

    return asyncio.run(get_state().recall_many(names))
