"""The routing state of one request, in the shared state (``infra.shared_state``: Redis when set, so every
process agrees; process memory otherwise; fail open).

``Router.read(plan)`` reads, in one round trip (``recall_many``), the circuit of every upstream of the plan
and the state of every key of its pools, and drops from the plan the upstreams whose circuit is open
(never all of them: the last route is never benched). A half-open upstream stays in the plan of the one
request that claims its probe (a second round trip, only then). ``pick(target)`` chooses the key of an
attempt (``proxy.routing.health.choose_key``; no work for an upstream with one key), ``observe`` takes the
attempt's result: a 429 cools its key, a 401/403 disables it, a transport error, timeout or 5xx counts
towards the upstream's circuit, an answer closes it. Circuit changes and disabled keys are journaled
(``audit.records.routing_changed``): incidents on the live feed and posts to the operator's webhook.

Shared-state names (values with a TTL): ``rt:c:<upstream id>`` (a ``Circuit``), ``rt:k:<upstream id>:<key
id>`` (a ``KeyState``), ``rt:p:<upstream id>`` (the half-open probe's claim).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
import weakref

from django.conf import settings

from infra import routing_health as health
from infra.routing_health import Circuit, KeyState, circuit_name, key_name, probe_name, session_name
from infra.routing_quality import Rate, choose
from infra.shared_state import MemoryState, SharedState, get_state
from proxy.guard.decisions.loops import chain_session
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from proxy.guard.turn import Decision, Turn
from proxy.routing import quality
from tenants.principal import RoutePlan, UpstreamTarget

logger = logging.getLogger(__name__)

#: Upstream error types that count towards the circuit (``proxy.relay.attempts.failure_decision``).
_TRANSPORT_TYPES = frozenset({"upstream_unavailable", "upstream_timeout"})
_RANDOM = random.Random()  # noqa: S311 - spreading load, not security
#: Seconds a circuit's state is kept after its last change.
_CIRCUIT_TTL = 24 * 3600.0
#: Seconds a session keeps its upstream and key after its last answer.
_SESSION_TTL = 6 * 3600.0
#: Seconds a key's last failure is kept after its cool-down (the least-recently-failed choice uses it).
_KEY_MEMORY = 3600.0


def key_failure(decision: Decision) -> str | None:
    """``cooling`` for a 429, ``disabled`` for a 401/403, else None."""
    error = decision.error
    if error is None:
        return None
    if error.status == 429:
        return health.COOLING
    if error.status in (401, 403):
        return health.DISABLED
    return None


def health_failure(decision: Decision) -> bool:
    """True for what counts towards the upstream's circuit: a transport error, a timeout, a 5xx (not an
    ``upstream_misconfigured``: the configuration's fault, not the upstream's)."""
    error = decision.error
    if error is None or error.type == "upstream_misconfigured":
        return False
    return error.type in _TRANSPORT_TYPES or error.status >= 500


class Router:
    """One request's view of the circuits and keys of its plan (module docstring). ``plan``: the plan
    the request follows (upstreams with an open circuit left out)."""

    def __init__(
        self,
        plan: RoutePlan,
        circuits: dict[int, Circuit],
        keys: dict[tuple[int, str], KeyState],
        state: SharedState | None = None,
        *,
        tenant_id: int | None = None,
        rand: random.Random | None = None,
    ) -> None:
        self.original = plan
        self.plan = plan
        self.circuits = circuits
        self.keys = keys
        self.tenant_id = tenant_id
        self._state = state
        self._rand = rand or _RANDOM
        self._avoid: dict[int, set[str]] = {}  # keys that failed in this request, by upstream
        self.session = ""  # the agent session whose upstream and key are kept ("": none)
        self.opening = ""  # a new conversation's ``n:`` session: its first answer starts its chain
        self.sticky: tuple[int, str] | None = None  # the session's (upstream id, key id) when known
        #: Live broken-turn rates of the plan's targets (in its order) when the route prefers quality.
        self.rates: list[Rate] = []
        self.chosen_by_quality = False  # True when the first target was chosen by ``rates``

    @property
    def state(self) -> SharedState:
        if self._state is None:
            self._state = get_state()
        return self._state

    @classmethod
    async def read(
        cls, plan: RoutePlan, *, tenant_id: int | None = None, session: str = "", state: SharedState | None = None
    ) -> Router:
        """The router of a request on ``plan`` in agent ``session`` (``proxy.guard.decisions.loops.session_id``;
        only a client's session header ``h:`` or a conversation chain ``c:`` is kept): one ``recall_many``
        (and a probe claim when a circuit is half-open). Never raises for the shared state (it fails open:
        everything closed and ok, no session known)."""
        store = state or get_state()
        upstreams = list(dict.fromkeys(t.upstream_id for t in plan.targets))
        pooled = list(dict.fromkeys((t.upstream_id, k[0]) for t in plan.targets for k in t.keys))
        opening = session if session.startswith("n:") else ""
        session = session if session[:2] in ("h:", "c:") else ""
        names = [circuit_name(u) for u in upstreams] + [key_name(u, k) for u, k in pooled]
        names += [session_name(session, plan.route_id)] if session else []
        raw, rates = await _read_state(store, names, plan)
        circuits = {u: Circuit.loads(r) for u, r in zip(upstreams, raw, strict=False)}
        keys = {uk: KeyState.loads(r) for uk, r in zip(pooled, raw[len(upstreams) :], strict=False)}
        router = cls(plan, circuits, keys, store, tenant_id=tenant_id)
        router.opening, router.rates = opening, rates
        if session:
            router.session = session
            router.sticky = _sticky(raw[-1] if len(raw) == len(names) else None)
        await router._route()
        return router

    async def _route(self) -> None:
        """Leave out the upstreams whose circuit is open (and half-open ones whose probe another request has),
        never all of them; the session's upstream first while it is usable (the others keep their order)."""
        now = self.state.clock()
        usable: set[int] = set()
        for upstream_id, circuit in self.circuits.items():
            state = circuit.state(now)
            if state == health.CLOSED:
                usable.add(upstream_id)
            elif state == health.HALF_OPEN:
                ttl = max(1.0, float(settings.ROUTING_CIRCUIT_COOLDOWN_SECONDS))
                if await self.state.claim(probe_name(upstream_id), "1", ttl):
                    usable.add(upstream_id)
        kept = tuple(t for t in self.original.targets if t.upstream_id in usable) or self.original.targets
        sticky = self.sticky[0] if self.sticky is not None else None
        first = next((i for i, t in enumerate(kept) if t.upstream_id == sticky), None)
        if first is None:  # a new session (or its upstream is not usable): by quality when the route says so
            first = self._by_quality(kept)
        if first:
            kept = (kept[first], *kept[:first], *kept[first + 1 :])
        if kept != self.original.targets:
            self.plan = dataclasses.replace(self.original, targets=kept)

    def _by_quality(self, kept: tuple[UpstreamTarget, ...]) -> int:
        """The index in ``kept`` of a new session's first target: by live broken-turn rate
        (``infra.routing_quality.choose``) when the plan prefers quality, else 0."""
        if len(self.rates) != len(self.original.targets) or len(kept) < 2:
            return 0
        by_target = {(t.upstream_id, t.model): r for t, r in zip(self.original.targets, self.rates, strict=True)}
        explore = float(settings.ROUTING_QUALITY_EXPLORE)
        self.chosen_by_quality = True
        return choose([by_target.get((t.upstream_id, t.model), Rate()) for t in kept], self._rand.random(), explore)

    def circuit_of(self, upstream_id: int) -> str:
        """``closed``, ``open`` or ``half-open`` as this request saw it."""
        return self.circuits.get(upstream_id, Circuit()).state(self.state.clock())

    def pick(self, target: UpstreamTarget) -> UpstreamTarget:
        """``target`` with the key of its next attempt (``credential_encrypted`` and ``key_id`` set): the
        session's key while it is ok (the provider's prompt cache), else by weight among the healthy ones.
        An upstream with one key comes back unchanged."""
        if len(target.keys) < 2:
            return target
        uid, now = target.upstream_id, self.state.clock()
        states = {k[0]: self.keys.get((uid, k[0]), KeyState()) for k in target.keys}
        avoid = frozenset(self._avoid.get(uid, ()))
        held = self.sticky[1] if self.sticky is not None and self.sticky[0] == uid else None
        if held is not None and held in states and held not in avoid and states[held].state(now) == health.OK:
            chosen = held
        else:
            weights = [(k[0], k[2]) for k in target.keys]
            chosen = health.choose_key(weights, states, now, self._rand.random(), avoid)
        if chosen == target.key_id:
            return target
        secret = next(k[1] for k in target.keys if k[0] == chosen)
        return dataclasses.replace(target, credential_encrypted=secret, key_id=chosen)

    async def delivered(self, target: UpstreamTarget, turn: Turn | None = None) -> tuple[int, str] | None:
        """Keep ``target`` (its upstream and key) as the session's after it answered ``turn``; returns the
        session's earlier ``(upstream id, key id)`` when it moved from there (None: no session, kept, or new).

        A new conversation (``n:``, no session header) has no session yet: its first delivered turn starts
        its chain (``chain_session``, the loop breaker's rule), under which its second request finds it."""
        session = self.session or (chain_session(self.opening, turn) if self.opening and turn is not None else "")
        if not session:
            return None
        now = (target.upstream_id, target.key_id)
        before = self.sticky
        if before != now:
            name = session_name(session, self.original.route_id)
            await _remember(self.state, name, f"{now[0]}:{now[1]}", _SESSION_TTL)
            self.sticky = now
        return before if before is not None and before != now else None

    def moving(self, target: UpstreamTarget) -> tuple[int, str] | None:
        """What ``delivered(target)`` will return, known at once (no await): the session's earlier
        ``(upstream id, key id)`` when an answer on ``target`` moves it from there, else None."""
        before = self.sticky
        return before if before is not None and before != (target.upstream_id, target.key_id) else None

    def move_finding(self, target: UpstreamTarget) -> Finding | None:
        """A ``session-moved`` finding when an answer on ``target`` moves the session (``moving``), naming the
        upstreams and keys (names from the plan; an upstream no longer in it by id), else None."""
        moved = self.moving(target)
        if moved is None:
            return None
        names = {t.upstream_id: t.name for t in self.original.targets}
        source = names.get(moved[0], f"upstream {moved[0]}")
        where = "key" if moved[0] == target.upstream_id else "upstream"
        return Finding(FindingKind.SESSION_MOVED, Severity.INFO, Action.IGNORED,
                       f"session moved to another {where} (its own failed; the provider's prompt cache starts "
                       f"over): from {source} key {moved[1]} to {target.name} key {target.key_id}")

    def another_key(self, target: UpstreamTarget) -> bool:
        """True when ``target``'s pool has a key that did not fail in this request."""
        avoid = self._avoid.get(target.upstream_id, set())
        return any(k[0] not in avoid for k in target.keys)

    async def observe(self, target: UpstreamTarget, decision: Decision) -> None:
        """Take an attempt's result on ``target`` (its ``key_id``): see the module docstring. Never raises."""
        try:
            await self._observe(target, decision)
        except Exception:  # noqa: BLE001 - advisory state: a failure here must not fail the request
            logger.exception("routing state not updated")

    async def _observe(self, target: UpstreamTarget, decision: Decision) -> None:
        uid, now = target.upstream_id, self.state.clock()
        failure = key_failure(decision)
        if failure is not None:
            self._avoid.setdefault(uid, set()).add(target.key_id)
            await self._key_failed(target, failure, decision, now)
            return
        if health_failure(decision):
            await self._circuit_failed(target, decision, now)
            return
        circuit = self.circuits.get(uid, Circuit())
        if circuit != Circuit():
            was = circuit.state(now)
            self.circuits[uid] = health.succeeded(circuit)
            await _remember(self.state, circuit_name(uid), self.circuits[uid].dumps(), _CIRCUIT_TTL)
            if was != health.CLOSED:
                self._changed(
                    target,
                    "circuit-closed",
                    "info",
                    f"upstream {target.name}: the circuit closed (a {was} circuit's call was answered)",
                )

    async def _key_failed(self, target: UpstreamTarget, failure: str, decision: Decision, now: float) -> None:
        uid, kid = target.upstream_id, target.key_id
        before = self.keys.get((uid, kid), KeyState())
        error = decision.error
        assert error is not None
        if failure == health.COOLING:
            seconds = error.retry_after if error.retry_after is not None else settings.ROUTING_KEY_COOLDOWN_SECONDS
            seconds = min(float(seconds), float(settings.ROUTING_KEY_COOLDOWN_MAX_SECONDS))
            after = health.cooled(before, now, seconds)
            ttl = after.until - now + _KEY_MEMORY
        else:
            after = health.disabled(before, now)
            ttl = float(settings.ROUTING_KEY_DISABLED_SECONDS)
        self.keys[(uid, kid)] = after
        await _remember(self.state, key_name(uid, kid), after.dumps(), max(1.0, ttl))
        if failure == health.DISABLED and not before.disabled:
            self._changed(
                target,
                "key-disabled",
                "error",
                f"upstream {target.name}: key {kid} was refused ({error.status}) and is disabled",
                detail=error.message,
            )

    async def _circuit_failed(self, target: UpstreamTarget, decision: Decision, now: float) -> None:
        uid = target.upstream_id
        fresh = Circuit.loads(await self.state.recall(circuit_name(uid)))  # other processes' failures too
        mine = self.circuits.get(uid, Circuit())
        before = fresh if fresh.failures >= mine.failures else mine
        after = health.failed(
            before,
            now,
            threshold=int(settings.ROUTING_CIRCUIT_FAILURES),
            cooldown=float(settings.ROUTING_CIRCUIT_COOLDOWN_SECONDS),
        )
        self.circuits[uid] = after
        await _remember(self.state, circuit_name(uid), after.dumps(), _CIRCUIT_TTL)
        if after.opened_until != before.opened_until:
            error = decision.error
            self._changed(
                target,
                "circuit-open",
                "error",
                f"upstream {target.name}: the circuit opened after {after.failures} failed call(s) in a "
                f"row; skipped for {settings.ROUTING_CIRCUIT_COOLDOWN_SECONDS:g} s",
                detail=error.message if error is not None else "",
            )

    def _changed(self, target: UpstreamTarget, event: str, severity: str, title: str, *, detail: str = "") -> None:
        from audit import records

        logger.warning("%s", title)
        records.routing_changed(
            event=event,
            severity=severity,
            tenant_id=self.tenant_id,
            upstream_id=target.upstream_id,
            title=title,
            detail=detail,
        )


async def _read_state(store: SharedState, names: list[str], plan: RoutePlan) -> tuple[list[str | None], list[Rate]]:
    """The values of ``names`` (``_recall``) and, when ``plan`` prefers quality, its targets' live rates
    (``proxy.routing.quality.rates``), read concurrently; failing open (nothing known)."""
    wanted = plan.prefer == "quality" and len(plan.targets) > 1
    try:
        if not wanted:
            return await _recall(store, names), []
        known = quality.cached(store, plan.targets)
        if known is not None or isinstance(store, MemoryState):  # no round trip for one of them: no task
            return await _recall(store, names), known or await quality.rates(store, plan.targets)
        raw, rates = await asyncio.gather(_recall(store, names), quality.rates(store, plan.targets))
        return raw, rates
    except Exception:  # noqa: BLE001 - routing state is advisory: fail open
        logger.exception("routing state not read")
        return [None] * len(names), []


def _sticky(raw: str | None) -> tuple[int, str] | None:
    """``(upstream id, key id)`` of a session's stored ``"<upstream id>:<key id>"``; None when malformed."""
    if not raw or len(raw) > 100 or ":" not in raw:
        return None
    upstream, key = raw.split(":", 1)
    return (int(upstream), key[:40]) if upstream.isdigit() and key else None


#: Per shared state (Redis): name -> (monotonic time read, value), this process's copy of what it read or
#: wrote less than ``ROUTING_STATE_CACHE_SECONDS`` ago (other processes' changes arrive within that).
_caches: weakref.WeakKeyDictionary[SharedState, dict[str, tuple[float, str | None]]] = weakref.WeakKeyDictionary()
_CACHE_MAX = 10_000


async def _recall(store: SharedState, names: list[str]) -> list[str | None]:
    """``store.recall_many(names)``, the values read or written here within ``ROUTING_STATE_CACHE_SECONDS``
    taken from this process's copy (no round trip when all are); process memory is read directly."""
    ttl = float(settings.ROUTING_STATE_CACHE_SECONDS)
    if isinstance(store, MemoryState) or ttl <= 0:
        return await store.recall_many(names)
    cache = _caches.setdefault(store, {})
    now = time.monotonic()
    missing = [n for n in names if (hit := cache.get(n)) is None or now - hit[0] >= ttl]
    if missing:
        values = await store.recall_many(missing)
        if len(cache) + len(missing) > _CACHE_MAX:
            cache.clear()
        cache.update((n, (now, v)) for n, v in zip(missing, values, strict=False))
    return [hit[1] if (hit := cache.get(n)) is not None else None for n in names]


async def _remember(store: SharedState, name: str, value: str, ttl: float) -> None:
    """``store.remember`` and this process's copy (``_recall``), the copy first: a request of this process
    that starts while the write is on its way (a session's next turn) reads the new value."""
    cache = _caches.get(store)
    if cache is not None:
        cache[name] = (time.monotonic(), value)
    await store.remember(name, value, ttl)
