"""The tenant retry budget (issue 14, item 2): retries for broken upstream output are capped per tenant.

Each request counts one upstream call in the tenant's ``calls`` window, each retry asked for broken
model output one in its ``retries`` window (sliding windows of ``RETRY_BUDGET_WINDOW_SECONDS``, 10
minutes by default, in the shared state: ``infra.shared_state``, so every process counts into the
same windows). A retry is allowed while ``retries < max(RETRY_BUDGET_MIN_RETRIES, percent / 100 *
calls)``, ``percent`` the tenant's ``GuardPolicy.retry_budget_percent`` (50 by default: retries add at
most half again to the tenant's upstream calls); the floor keeps a small or new tenant's first broken
answers retried. Past it, the relay makes no further attempt for broken output: the request gets its
exhaustion answer after one attempt, and a ``retry-budget-spent`` finding makes the incident.

Counting a request is off the byte path (gathered per process, added every ``FLUSH_SECONDS`` by a
background task: a retry sees its own process's latest requests, other processes' within a quarter
second); checking a retry is two shared-state
calls (read both windows, then count the retry), so concurrent retries may overshoot the budget by
the handful in flight. The shared state fails open: when it cannot be asked, the retry is allowed.
Retries caused by an unreachable or failing upstream (timeouts, 5xx, 429) are not in this budget:
they have their own bound (the retry deadline, ``RETRY_DEADLINE_SECONDS``, per request).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from django.conf import settings

from infra.background import schedule
from infra.shared_state import Window, get_state
from proxy.guard.findings import Action, Finding, FindingKind, Severity

logger = logging.getLogger(__name__)


def _windows(tenant_id: int) -> tuple[Window, Window]:
    period = settings.RETRY_BUDGET_WINDOW_SECONDS
    return (Window(f"retry-budget:{tenant_id}:calls", period, None, cost=0),
            Window(f"retry-budget:{tenant_id}:retries", period, None, cost=0))


#: Requests counted in this process and not yet added to the shared state, per tenant.
_pending: dict[int, int] = {}
#: Seconds requests are gathered before one shared-state call adds them (off the byte path).
FLUSH_SECONDS = 0.25


def count_request(tenant_id: int) -> None:
    """Count one request of ``tenant_id`` in its upstream calls: gathered in this process and added to the
    shared state by one background call per ``FLUSH_SECONDS`` (no round trip per request; never raises)."""
    global _flushing
    _pending[tenant_id] = _pending.get(tenant_id, 0) + 1
    loop = asyncio.get_running_loop()
    if _flushing is None or _flushing.done() or _flushing.get_loop() is not loop:  # none due on this loop
        _flushing = loop.create_task(_flush())
        schedule(_flushing)


async def _flush() -> None:
    await asyncio.sleep(FLUSH_SECONDS)
    counts = dict(_pending)
    _pending.clear()
    await get_state().add([(_windows(tenant)[0], n) for tenant, n in counts.items()])


_flushing: asyncio.Task[None] | None = None


@dataclass(frozen=True, slots=True)
class BudgetCheck:
    """A retry check: ``allowed``, and the window's ``calls`` and ``retries`` so far and the ``allowance``."""

    allowed: bool
    calls: int
    retries: int
    allowance: int

    def finding(self, percent: int) -> Finding:
        """The ``retry-budget-spent`` finding of a refused retry."""
        return Finding(FindingKind.RETRY_BUDGET_SPENT, Severity.WARNING, Action.IGNORED,
                       f"the tenant's retry budget is spent: {self.retries} retries for broken output on "
                       f"{self.calls} requests in the last {settings.RETRY_BUDGET_WINDOW_SECONDS / 60:g} minutes "
                       f"(budget: {percent}% of requests, at least {settings.RETRY_BUDGET_MIN_RETRIES}); "
                       f"no further attempt was made")


async def take_retry(tenant_id: int, percent: int) -> BudgetCheck:
    """Ask for one retry for broken output: counted and allowed while the budget lasts (see the module)."""
    calls, retries = _windows(tenant_id)
    verdict = await get_state().admit([calls, retries])
    if verdict.fail_open or len(verdict.usage) != 2:
        return BudgetCheck(True, 0, 0, 0)
    used_calls = verdict.usage[0].used + _pending.get(tenant_id, 0)  # with this process's not yet added
    used_retries = verdict.usage[1].used
    allowance = max(settings.RETRY_BUDGET_MIN_RETRIES, used_calls * percent // 100)
    if used_retries >= allowance:
        return BudgetCheck(False, used_calls, used_retries, allowance)
    await get_state().add([(retries, 1)])
    return BudgetCheck(True, used_calls, used_retries + 1, allowance)
