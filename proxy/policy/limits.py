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
back, in one shared-state call made after the answer ended (off the first byte's path). The checks of
one principal's limits are made once per UTC day (``_plan``) and reused with each request's costs. An
answer without usage is settled from an estimate (``tokens_of``) and counted as such in
``toolrelay_limits_tokens_total{source="estimate"}``.

Money (``daily_usd`` / ``weekly_usd`` / ``monthly_usd`` on the tenant, the key and the key's member): the
request's estimated cost (``reserve_usd``: its input estimate and a bounded output estimate at the price
in force, ``billing.book``) is counted at admission in the same call as every other window, in
nano-dollars per UTC day, ISO week and month, so requests in flight hold their reservation; ``settle``
corrects it to the real cost of every attempt. A budget refuses once what was spent and reserved reaches
it (the request that crosses it is served: concurrency overshoots by at most the requests already
admitted), with ``insufficient_quota`` naming the budget, the amount spent and the reset time. Past
``MONEY_SOFT_PERCENT`` of a budget the admission carries one ``money-budget-threshold`` finding per budget
and window (a one-shot window in the shared state, so once across processes): the tenant's alert rule
and the live feed pick it up from the audit.

Headers (OpenAI's names: ``x-ratelimit-limit-requests`` / ``-remaining-requests`` / ``-reset-requests``
and the ``-tokens`` variants, reset as a duration such as ``12s``; Anthropic's for Anthropic clients:
``anthropic-ratelimit-requests-limit`` / ``-remaining`` / ``-reset``, reset as an RFC 3339 time) are
computed from the tighter of the key's and the tenant's windows, on every answer and on the 429.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings

from billing.book import price_book
from infra import metrics
from infra.shared_state import Lease, SharedState, Verdict, Window, WindowUsage, get_state
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from tenants.limits import MONEY_NAMES, Limits

#: How often this process renews the concurrency leases of its requests in flight (a fraction of
#: ``LIMITS_LEASE_SECONDS``: a lease whose process died expires within that many seconds).
RENEW_FRACTION = 1 / 3
#: How often a request queued for a concurrency slot asks again (seconds), unless woken sooner.
QUEUE_POLL_SECONDS = 0.05


#: Nano-dollars per USD: money windows count whole nano-dollars (a token at $0.01 per million is 10).
NANO = 1_000_000_000


class LimitExceeded(Exception):
    """A request over a limit: ``code`` names it (``rpm``, ``tpm``, ``concurrency``, ``daily_tokens``,
    ``monthly_tokens``; ``insufficient_quota`` for a money budget); ``limit`` the limit's name (``daily_usd``
    ...); ``quota`` True for a spent budget (``insufficient_quota``, not retryable); ``retry_after`` in seconds
    (None when retrying cannot help); ``headers`` the rate-limit headers."""

    def __init__(self, code: str, message: str, *, quota: bool, retry_after: float | None,
                 headers: list[tuple[bytes, bytes]], limit: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.quota, self.retry_after, self.headers = code, message, quota, retry_after, headers
        self.limit = limit or code

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
    #: A money budget's soft threshold (percent; None: ``MONEY_SOFT_PERCENT``).
    soft: int | None = None


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


def _periods(now: float) -> dict[str, tuple[str, float, str]]:
    """Per money limit its bucket, reset time (Unix seconds) and the period's name, at ``now``."""
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    monday = day - timedelta(days=day.weekday())
    month, month_end = _month_bounds(day)
    return {"daily_usd": (day.strftime("%Y-%m-%d"), (day + timedelta(days=1)).timestamp(), "day (UTC)"),
            "weekly_usd": (monday.strftime("%G-W%V"), (monday + timedelta(days=7)).timestamp(), "week (UTC)"),
            "monthly_usd": (month, month_end.timestamp(), "month (UTC)")}


def _money_checks(holder: str, holder_id: int, who: str, limits: Limits, *, reserve: int, now: float) -> list[_Check]:
    """The money windows of one holder (nano-dollars, fixed calendar buckets, budgets: not strict)."""
    checks = []
    for name, (bucket, reset_at, _) in _periods(now).items():
        budget = getattr(limits, name)
        if budget is not None:
            checks.append(_Check(who, name, Window(f"{holder}:{holder_id}:{name}", 86400 * 31, round(budget * NANO),
                                                   reserve, strict=False, sliding=False, bucket=bucket,
                                                   reset_at=reset_at), soft=limits.soft_percent(name)))
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
    #: The money windows and what each counted at admission (nano-dollars).
    money_windows: tuple[Window, ...] = ()
    reserved: int = 0
    #: Request-level findings of the admission (a budget past its soft threshold).
    findings: tuple[Finding, ...] = ()

    @property
    def counted(self) -> bool:
        """True when something was counted or held (a principal without limits: nothing to settle)."""
        return bool(self.token_windows or self.leases or self.money_windows)

    async def settle(self, used: int | None, *, tenant: str = "", usd: float | None = None) -> None:
        """Correct the token counts to ``used`` (None: the estimate stands), the money reservation to ``usd``
        (None: the reservation stands) and give the leases back; once. One shared-state call for all of it
        (``SharedState.settle``: one round trip in Redis), made after the answer ended."""
        if self.settled:
            return
        self.settled = True
        source = "estimate" if used is None else "usage"
        metrics.LIMITS_TOKENS.labels(tenant=metrics.bounded("tenant", tenant), source=source).inc(
            self.estimate if used is None else used)
        delta = 0 if used is None else used - self.estimate
        adjust = [(w, delta) for w in self.token_windows] if delta else []
        spent = self.reserved if usd is None or not math.isfinite(usd) else max(0, round(usd * NANO))
        if spent != self.reserved:
            adjust += [(w, spent - self.reserved) for w in self.money_windows]
        if self.leases:
            _renewer.drop(self.leases)
        if adjust or self.leases:
            await self.state.settle(adjust, self.leases)
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


_NO_LIMITS = Limits()


async def admit(principal_limits: tuple[int, int, Limits, Limits], *, estimate: int, anthropic: bool = False,
                state: SharedState | None = None, reserve_usd: float = 0.0,
                member: tuple[int, Limits] | None = None) -> Admission:
    """Admit one request of key ``api_key_id`` in tenant ``tenant_id`` (``principal_limits`` =
    ``(tenant_id, api_key_id, tenant limits, key limits)``) costing ``estimate`` tokens and an estimated
    ``reserve_usd`` (for the money budgets); ``LimitExceeded`` when over a limit (after the concurrency
    queue). Its leases last ``LIMITS_LEASE_SECONDS`` and are renewed while the request runs (``_Renewer``).
    ``anthropic`` picks Anthropic's header names. ``member``: ``(membership id, its limits)`` of a person's key,
    whose limits and money budgets hold over all their keys together."""
    tenant_id, key_id, tenant_limits, key_limits = principal_limits
    state = state or get_state()
    member_id, member_limits = member if member is not None else (0, _NO_LIMITS)
    if not tenant_limits.any and not key_limits.any and not member_limits.any:
        return Admission(state, estimate)
    now = state.clock()
    reserve = max(0, round(reserve_usd * NANO)) if math.isfinite(reserve_usd) else 0
    plan = _plan(tenant_id, key_id, member_id, tenant_limits, key_limits, member_limits, now)
    windows, leases = plan.costed(estimate, reserve)
    verdict = await state.admit(windows, leases)
    if isinstance(verdict.refused, Lease):
        verdict = await _queued(state, verdict.refused, windows, leases)
    headers = rate_headers(verdict.usage, anthropic=anthropic, now=now)
    if verdict.refused is not None:
        raise _exceeded(plan.check_of(verdict.refused, windows, leases), verdict, estimate, headers)
    tokens = tuple(windows[i] for i in plan.tokens)
    money = tuple(windows[i] for i in plan.money)
    if leases:
        _renewer.add(state, leases)
    findings = await _thresholds(state, plan.windowed, verdict.usage) if money else ()
    return Admission(state, estimate, tokens, leases, headers, money_windows=money, reserved=reserve,
                     findings=findings)


#: The windows ``settle`` corrects by the tokens used (rpm counts requests, not tokens).
_TOKEN_CODES = frozenset({"tpm", "daily_tokens", "monthly_tokens"})


class _Plan:
    """The checks of one principal's limits in one UTC day (``start`` <= now < ``end``), as templates:
    ``windowed`` (in the order of the request's windows) and ``leased``; ``tokens`` and ``money`` index the
    windows ``settle`` corrects. Each request's windows are the templates with its own costs (``costed``)."""

    __slots__ = ("end", "leased", "money", "start", "tokens", "windowed")

    def __init__(self, start: float, end: float, templates: Sequence[_Check]) -> None:
        self.start, self.end = start, end
        self.windowed = tuple(c for c in templates if c.window is not None)
        self.leased = tuple(c for c in templates if c.lease is not None)
        self.tokens = tuple(i for i, c in enumerate(self.windowed) if c.code in _TOKEN_CODES)
        self.money = tuple(i for i, c in enumerate(self.windowed) if c.code in MONEY_NAMES)

    def costed(self, estimate: int, reserve: int) -> tuple[tuple[Window, ...], tuple[Lease, ...]]:
        """The request's windows (rpm counts 1: the template itself; the token windows ``estimate``; the money
        ones ``reserve``) and its leases (a new holder each)."""
        windows = []
        for c in self.windowed:
            w = c.window
            assert w is not None
            if c.code == "rpm":
                windows.append(w)
            else:
                cost = reserve if c.code in MONEY_NAMES else estimate
                windows.append(Window(w.name, w.period, w.limit, cost, w.strict, w.sliding, w.bucket, w.reset_at))
        leases = tuple(Lease(c.lease.name, c.lease.limit, c.lease.ttl, _holder())
                       for c in self.leased if c.lease is not None)
        return tuple(windows), leases

    def check_of(self, refused: Window | Lease, windows: Sequence[Window], leases: Sequence[Lease]) -> _Check:
        """The check (holder and limit) of the window or lease a request was refused by."""
        for c, w in zip(self.windowed, windows, strict=True):
            if w is refused:
                return _Check(c.who, c.code, window=w)
        c = next(c for c, lease in zip(self.leased, leases, strict=True) if lease is refused)
        return _Check(c.who, c.code, lease=refused if isinstance(refused, Lease) else None)


_plans: dict[tuple[Any, ...], _Plan] = {}
#: Lease holders: this process's random prefix and a counter (unique across processes, cheaper than a uuid4 each).
_HOLDER_PREFIX = uuid.uuid4().hex[:16]
_holders = itertools.count()


def _holder() -> str:
    return f"{_HOLDER_PREFIX}{next(_holders)}"


def _plan(tenant_id: int, key_id: int, member_id: int, tenant_limits: Limits, key_limits: Limits,
          member_limits: Limits, now: float) -> _Plan:
    """The cached plan of these limits at ``now`` (made again past the UTC day, or for another lease ttl)."""
    ttl = float(settings.LIMITS_LEASE_SECONDS)
    cache = (tenant_id, key_id, member_id, tenant_limits, key_limits, member_limits, ttl)
    plan = _plans.get(cache)
    if plan is not None and plan.start <= now < plan.end:
        return plan
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    templates = (*_checks("k", key_id, "key", key_limits, estimate=0, lease_ttl=ttl, now=now),
                 *_checks("m", member_id, "member", member_limits, estimate=0, lease_ttl=ttl, now=now),
                 *_checks("t", tenant_id, "tenant", tenant_limits, estimate=0, lease_ttl=ttl, now=now),
                 *_money_checks("k", key_id, "key", key_limits, reserve=0, now=now),
                 *_money_checks("m", member_id, "member", member_limits, reserve=0, now=now),
                 *_money_checks("t", tenant_id, "tenant", tenant_limits, reserve=0, now=now))
    if len(_plans) > 10_000:
        _plans.clear()
    plan = _plans[cache] = _Plan(day.timestamp(), (day + timedelta(days=1)).timestamp(), templates)
    return plan


def reservation_usd(target: Any, body: dict[str, Any], estimate: int) -> float:
    """The USD a request reserves against money budgets: ``estimate`` input tokens and its output budget
    (``max_tokens`` / ``max_completion_tokens``, at most ``BILLING_OUTPUT_ESTIMATE_TOKENS``) at the price in
    force for its first target (``billing.book``); 0 when unpriced."""
    cap = int(settings.BILLING_OUTPUT_ESTIMATE_TOKENS)
    asked = next((v for k in ("max_tokens", "max_completion_tokens", "max_output_tokens")
                  if isinstance(v := body.get(k), int) and not isinstance(v, bool) and v > 0), cap)
    usd = price_book().estimate(estimate, min(asked, cap), model=target.model, upstream=target.name)
    return usd or 0.0


#: Money budgets (window name, bucket) whose soft threshold this process already reported.
_reported: set[tuple[str, str | None]] = set()


async def _thresholds(state: SharedState, checks: Sequence[_Check],
                     usage: Sequence[WindowUsage]) -> tuple[Finding, ...]:
    """One ``money-budget-threshold`` finding per money budget that reached its soft threshold (the budget's
    own, else the holder's ``money_soft_percent``, else ``MONEY_SOFT_PERCENT``) in its window, the first time
    across every process (a one-shot window per budget and bucket)."""
    found = []
    windowed = [c for c in checks if c.window is not None]  # in the order of ``usage``
    for check, u in zip(windowed, usage, strict=True):
        w = u.window
        percent = float(settings.MONEY_SOFT_PERCENT if check.soft is None else check.soft)
        if check.code not in MONEY_NAMES or not w.limit or u.used < percent / 100 * w.limit \
                or (w.name, w.bucket) in _reported:
            continue
        if len(_reported) > 10_000:
            _reported.clear()
        _reported.add((w.name, w.bucket))
        once = Window(f"{w.name}:soft", w.period, 1, 1, strict=True, sliding=False, bucket=w.bucket,
                      reset_at=w.reset_at)
        if (await state.admit([once])).admitted:
            found.append(Finding(FindingKind.MONEY_BUDGET_THRESHOLD, Severity.WARNING, Action.IGNORED,
                                 f"{_whose(check.who)} {_PERIOD[check.code]} budget passed "
                                 f"{percent:g}%: {_usd(u.used)} of {_usd(w.limit)} spent or "
                                 f"reserved"))
    return tuple(found)


_PERIOD = {"daily_usd": "daily", "weekly_usd": "weekly", "monthly_usd": "monthly"}


def _whose(who: str) -> str:
    return {"key": "this key's", "member": "your personal"}.get(who, "the tenant's")


def _usd(nano: int) -> str:
    return f"${nano / NANO:,.6f}".rstrip("0").rstrip(".") if nano else "$0"


async def count_refused(principal_limits: tuple[int, int, Limits, Limits], *, state: SharedState | None = None) -> None:
    """Count a request refused before admission (malformed, past a bound, an unknown model) in its key's
    and tenant's requests-per-minute windows, so refusals cost a client its rate like any request
    (issue 24 item 3). Nothing when neither sets ``rpm``; fails open like every shared-state call."""
    tenant_id, key_id, tenant_limits, key_limits = principal_limits
    windows = [Window(f"{holder}:{holder_id}:rpm", 60, limits.rpm, 1)
               for holder, holder_id, limits in (("k", key_id, key_limits), ("t", tenant_id, tenant_limits))
               if limits.rpm is not None]
    if windows:
        await (state or get_state()).add([(w, 1) for w in windows])


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
    whose = _whose(check.who)
    usage = next((u for u in verdict.usage if u.window is check.window), None)
    if check.lease is not None:
        return LimitExceeded("concurrency", f"too many concurrent requests: {whose} limit is {check.lease.limit} "
                             f"at once (waited {settings.LIMITS_CONCURRENCY_WAIT_SECONDS:g} s for a slot)",
                             quota=False, retry_after=1.0, headers=headers)
    assert check.window is not None and usage is not None and check.window.limit is not None
    limit = check.window.limit
    if check.code in MONEY_NAMES:
        reset_at = check.window.reset_at or 0.0
        at = datetime.fromtimestamp(reset_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return LimitExceeded("insufficient_quota", f"money budget spent: {whose} {_PERIOD[check.code]} budget is "
                             f"{_usd(limit)} per {_periods(0)[check.code][2]}, {_usd(usage.used)} spent or reserved; "
                             f"it resets at {at} (in {math.ceil(usage.reset)} s)", quota=True, retry_after=None,
                             headers=headers, limit=check.code)
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
