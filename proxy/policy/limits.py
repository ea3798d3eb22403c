"""The limits on the request path: admit a request against its key's and its tenant's limits, then settle.

``admit(principal, estimate=...)`` checks every limit set on the key and on its tenant
in one shared-state call (``infra.shared_state``): requests and tokens per minute (sliding windows),
tokens per UTC day and month (calendar buckets), and concurrency (leases). Over a limit it raises
``LimitExceeded`` (HTTP 429 in the client's protocol, with ``Retry-After`` and the rate-limit headers);
over the concurrency cap the request first waits in its key's queue (first come, first served in
this process, at most ``LIMITS_CONCURRENCY_WAIT_SECONDS``). A principal without limits costs nothing
(no shared-state call).

Tokens: ``estimate`` (the request's input tokens: its body's bytes / 4, as ``proxy.edge.protocols`` counts) is
counted at admission; ``Admission.settle(used)`` corrects the minute, day and month counts by the difference once
the answer's usage is known (every attempt's, retries included: they cost), and gives the leases
back. An answer without usage is settled from an estimate (``tokens_of``) and counted as such in
``toolrelay_limits_tokens_total{source="estimate"}``.

Headers (OpenAI's names: ``x-ratelimit-limit-requests`` / ``-remaining-requests`` / ``-reset-requests``
and the ``-tokens`` variants, reset as a duration such as ``12s``; Anthropic's for Anthropic clients:
``anthropic-ratelimit-requests-limit`` / ``-remaining`` / ``-reset``, reset as an RFC 3339 time) are
computed from the tighter of the key's and the tenant's windows, on every answer and on the 429.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings

from infra import metrics
from infra.shared_state import Lease, SharedState, Verdict, Window, WindowUsage, get_state
from tenants.limits import Limits

#: How often this process renews the concurrency leases of its requests in flight (a fraction of
#: ``LIMITS_LEASE_SECONDS``: a lease whose process died expires within that many seconds).
RENEW_FRACTION = 1 / 3
#: How often a request queued for a concurrency slot asks again (seconds), unless woken sooner.
QUEUE_POLL_SECONDS = 0.05


class LimitExceeded(Exception):
    """A request over a limit: ``code`` names it (``rpm``, ``tpm``, ``concurrency``, ``daily_tokens``,
    ``monthly_tokens``); ``quota`` True for a spent budget (``insufficient_quota``, not retryable);
    ``retry_after`` in seconds (None when retrying cannot help); ``headers`` the rate-limit headers."""

    def __init__(self, code: str, message: str, *, quota: bool, retry_after: float | None,
                 headers: list[tuple[bytes, bytes]]) -> None:
        super().__init__(message)
        self.code, self.message, self.quota, self.retry_after, self.headers = code, message, quota, retry_after, headers

    @property
    def type(self) -> str:
        """The error ``type`` in OpenAI's shape."""
        return "insufficient_quota" if self.quota else "rate_limit_exceeded"


@dataclass(frozen=True, slots=True)
class _Check:
    """One limit of one holder (``who``: ``key`` or ``tenant``) as shared-state windows or a lease."""

    who: str
    code: str
    window: Window | None = None
    lease: Lease | None = None


def _month_bounds(now: datetime) -> tuple[str, datetime]:
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (start + timedelta(days=32)).replace(day=1)
    return start.strftime("%Y-%m"), following


def _checks(holder: str, holder_id: int, who: str, limits: Limits, *, estimate: int, lease_ttl: float,
            now: float) -> list[_Check]:
    base = f"{holder}:{holder_id}"
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    month, month_end = _month_bounds(day)
    checks = []
    if limits.rpm is not None:
        checks.append(_Check(who, "rpm", Window(f"{base}:rpm", 60, limits.rpm, 1)))
    if limits.tpm is not None:
        checks.append(_Check(who, "tpm", Window(f"{base}:tpm", 60, limits.tpm, estimate)))
    if limits.daily_tokens is not None:
        checks.append(_Check(who, "daily_tokens", Window(
            f"{base}:day", 86400, limits.daily_tokens, estimate, strict=False, sliding=False,
            bucket=day.strftime("%Y-%m-%d"), reset_at=(day + timedelta(days=1)).timestamp())))
    if limits.monthly_tokens is not None:
        checks.append(_Check(who, "monthly_tokens", Window(
            f"{base}:month", 86400 * 31, limits.monthly_tokens, estimate, strict=False, sliding=False,
            bucket=month, reset_at=month_end.timestamp())))
    if limits.concurrency is not None:
        checks.append(_Check(who, "concurrency", lease=Lease(f"{base}:conc", limits.concurrency, lease_ttl)))
    return checks


@dataclass(slots=True)
class Admission:
    """An admitted request: what it counted (for ``settle``) and the headers its answer carries."""

    state: SharedState
    estimate: int
    token_windows: tuple[Window, ...] = ()
    leases: tuple[Lease, ...] = ()
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    settled: bool = False

    @property
    def counted(self) -> bool:
        """True when something was counted or held (a principal without limits: nothing to settle)."""
        return bool(self.token_windows or self.leases)

    async def settle(self, used: int | None, *, tenant: str = "") -> None:
        """Correct the token counts to ``used`` (None: the estimate stands) and give the leases back; once."""
        if self.settled:
            return
        self.settled = True
        source = "estimate" if used is None else "usage"
        metrics.LIMITS_TOKENS.labels(tenant=metrics.bounded("tenant", tenant), source=source).inc(
            self.estimate if used is None else used)
        delta = 0 if used is None else used - self.estimate
        if delta and self.token_windows:
            await self.state.add([(w, delta) for w in self.token_windows])
        if self.leases:
            _renewer.drop(self.leases)
            await self.state.release(self.leases)
            for lease in self.leases:
                _queue(lease.name).wake()


class _Renewer:
    """Keeps the leases of this process's requests in flight alive: every ``LIMITS_LEASE_SECONDS`` / 3 one
    ``renew`` call for all of them (one round trip), so a lease lasts as long as its request and a dead
    process's leases expire within ``LIMITS_LEASE_SECONDS``."""

    def __init__(self) -> None:
        self.held: dict[tuple[int, str], tuple[SharedState, Lease]] = {}
        self.task: asyncio.Task[None] | None = None

    def add(self, state: SharedState, leases: Sequence[Lease]) -> None:
        for lease in leases:
            self.held[(id(state), lease.holder)] = (state, lease)
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.task = loop.create_task(self._run())

    def drop(self, leases: Sequence[Lease]) -> None:
        holders = {lease.holder for lease in leases}
        for key in [k for k in self.held if k[1] in holders]:
            del self.held[key]

    async def _run(self) -> None:
        while self.held:
            await asyncio.sleep(float(settings.LIMITS_LEASE_SECONDS) * RENEW_FRACTION)
            by_state: dict[int, tuple[SharedState, list[Lease]]] = {}
            for state, lease in list(self.held.values()):
                by_state.setdefault(id(state), (state, []))[1].append(lease)
            for state, leases in by_state.values():
                await state.renew(leases)  # fails open (never raises): the leases then expire on their own


_renewer = _Renewer()


class _KeyQueue:
    """The requests of one key waiting for a concurrency slot in this process: served in arrival order
    (``asyncio.Lock`` wakes its waiters first in, first out); a release in this process wakes the head."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.released = asyncio.Event()
        self.waiting = 0

    def wake(self) -> None:
        self.released.set()


_queues: dict[str, _KeyQueue] = {}


def _queue(name: str) -> _KeyQueue:
    queue = _queues.get(name)
    if queue is None:
        if len(_queues) > 10_000:  # forget idle queues (no waiter, lock free)
            for idle in [n for n, q in _queues.items() if not q.waiting and not q.lock.locked()]:
                del _queues[idle]
        queue = _queues[name] = _KeyQueue()
    return queue


async def admit(principal_limits: tuple[int, int, Limits, Limits], *, estimate: int, anthropic: bool = False,
                state: SharedState | None = None) -> Admission:
    """Admit one request of key ``api_key_id`` in tenant ``tenant_id`` (``principal_limits`` =
    ``(tenant_id, api_key_id, tenant limits, key limits)``) costing ``estimate`` tokens; ``LimitExceeded``
    when over a limit (after the concurrency queue). Its leases last ``LIMITS_LEASE_SECONDS`` and are
    renewed while the request runs (``_Renewer``).
    ``anthropic`` picks Anthropic's header names."""
    tenant_id, key_id, tenant_limits, key_limits = principal_limits
    state = state or get_state()
    if not tenant_limits.any and not key_limits.any:
        return Admission(state, estimate)
    now = state.clock()
    ttl = float(settings.LIMITS_LEASE_SECONDS)
    checks = [*_checks("k", key_id, "key", key_limits, estimate=estimate, lease_ttl=ttl, now=now),
              *_checks("t", tenant_id, "tenant", tenant_limits, estimate=estimate, lease_ttl=ttl, now=now)]
    windows = tuple(c.window for c in checks if c.window is not None)
    leases = tuple(c.lease for c in checks if c.lease is not None)
    verdict = await state.admit(windows, leases)
    if isinstance(verdict.refused, Lease):
        verdict = await _queued(state, verdict.refused, windows, leases)
    headers = rate_headers(verdict.usage, anthropic=anthropic, now=now)
    if verdict.refused is not None:
        check = next(c for c in checks if verdict.refused in (c.window, c.lease))
        raise _exceeded(check, verdict, estimate, headers)
    tokens = tuple(w for w in windows if not w.name.endswith(":rpm"))
    if leases:
        _renewer.add(state, leases)
    return Admission(state, estimate, tokens, leases, headers)


async def _queued(state: SharedState, lease: Lease, windows: Sequence[Window], leases: Sequence[Lease]) -> Verdict:
    """Wait in ``lease``'s queue for a slot, asking again until admitted, refused by another limit, or
    ``LIMITS_CONCURRENCY_WAIT_SECONDS`` passed (then the last refusal)."""
    queue = _queue(lease.name)
    end = time.monotonic() + float(settings.LIMITS_CONCURRENCY_WAIT_SECONDS)
    queue.waiting += 1
    verdict = Verdict(lease, (), ())
    try:
        await asyncio.wait_for(queue.lock.acquire(), timeout=max(0.0, end - time.monotonic()))
    except TimeoutError:
        queue.waiting -= 1
        return await state.admit(windows, [*leases])  # one last try: a slot may have freed meanwhile
    try:
        while True:
            queue.released.clear()
            verdict = await state.admit(windows, leases)
            left = end - time.monotonic()
            if not isinstance(verdict.refused, Lease) or left <= 0:
                return verdict
            try:
                await asyncio.wait_for(queue.released.wait(), timeout=min(QUEUE_POLL_SECONDS, left))
            except TimeoutError:
                pass
    finally:
        queue.waiting -= 1
        queue.lock.release()


def _exceeded(check: _Check, verdict: Verdict, estimate: int, headers: list[tuple[bytes, bytes]]) -> LimitExceeded:
    whose = "this key's" if check.who == "key" else "the tenant's"
    usage = next((u for u in verdict.usage if u.window is check.window), None)
    if check.lease is not None:
        return LimitExceeded("concurrency", f"too many concurrent requests: {whose} limit is {check.lease.limit} "
                             f"at once (waited {settings.LIMITS_CONCURRENCY_WAIT_SECONDS:g} s for a slot)",
                             quota=False, retry_after=1.0, headers=headers)
    assert check.window is not None and usage is not None and check.window.limit is not None
    limit = check.window.limit
    if check.code in ("daily_tokens", "monthly_tokens"):
        period = "day (UTC)" if check.code == "daily_tokens" else "month (UTC)"
        return LimitExceeded(check.code, f"token budget spent: {whose} limit is {limit} tokens per {period}; "
                             f"it renews in {math.ceil(usage.reset)} s", quota=True, retry_after=None,
                             headers=headers)
    if check.code == "tpm" and estimate > limit:
        return LimitExceeded("tpm", f"request too large: about {estimate} input tokens, {whose} limit is {limit} "
                             "tokens per minute", quota=True, retry_after=None, headers=headers)
    unit = "requests" if check.code == "rpm" else "tokens"
    return LimitExceeded(check.code, f"rate limit reached: {whose} limit is {limit} {unit} per minute, "
                         f"{usage.used} used; retry in {max(1, math.ceil(usage.reset))} s",
                         quota=False, retry_after=max(1.0, usage.reset), headers=headers)


def _tightest(usage: Iterable[WindowUsage], suffix: str) -> WindowUsage | None:
    found = [u for u in usage if u.window.name.endswith(suffix) and u.window.limit is not None]
    return min(found, key=lambda u: (u.remaining or 0, -u.reset)) if found else None


def rate_headers(usage: Iterable[WindowUsage], *, anthropic: bool, now: float) -> list[tuple[bytes, bytes]]:
    """The rate-limit headers of the tightest requests and tokens windows (module docstring)."""
    usage = list(usage)
    headers: list[tuple[bytes, bytes]] = []
    for suffix, unit in ((":rpm", "requests"), (":tpm", "tokens")):
        tight = _tightest(usage, suffix)
        if tight is None:
            continue
        values = (str(tight.window.limit), str(tight.remaining))
        if anthropic:
            at = datetime.fromtimestamp(now + tight.reset, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            names = [f"anthropic-ratelimit-{unit}-{p}" for p in ("limit", "remaining", "reset")]
            headers += [(n.encode(), v.encode()) for n, v in zip(names, (*values, at), strict=True)]
        else:
            names = [f"x-ratelimit-{p}-{unit}" for p in ("limit", "remaining", "reset")]
            reset = f"{max(1, math.ceil(tight.reset))}s"
            headers += [(n.encode(), v.encode()) for n, v in zip(names, (*values, reset), strict=True)]
    return headers
