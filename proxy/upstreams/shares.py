"""Fair shares of this process's upstream connections (issue 24 item 3).

One ``httpx`` pool (``UPSTREAM_MAX_CONNECTIONS``) serves every tenant and upstream of a process: without
shares, one tenant's long streams (a reasoning model's, or a flood of slow ones) took every connection
and every other tenant's request waited ~50 s for one. So, per process:

- a tenant has at most ``UPSTREAM_TENANT_CONNECTIONS`` requests talking to upstreams at once (the
  default tenant concurrency, whatever limits it has or lacks); a request over it waits up to
  ``LIMITS_CONCURRENCY_WAIT_SECONDS`` in the tenant's queue (first come, first served), then gets a 429
  ``concurrency`` (``proxy.edge.consumers.relay``);
- an upstream has at most ``UPSTREAM_UPSTREAM_CONNECTIONS`` calls open at once; a call over it waits as
  long, then fails like an unreachable upstream (retryable, ``UpstreamBusy``).

Both are counts in this process's memory (no shared state, no round trip): O(1) per request. ``Slots``
is the primitive (also the per-tenant share of the validation pool, ``proxy.relay.schema_pool``); the
current request's tenant is a context variable (``enter``), as the hop count is.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import AsyncIterator

_tenant: contextvars.ContextVar[int | None] = contextvars.ContextVar("toolrelay_tenant", default=None)


def enter(tenant_id: int) -> None:
    """Record ``tenant_id`` as the current request's tenant (its context)."""
    _tenant.set(tenant_id)


def current_tenant() -> int | None:
    """The current request's tenant id (None outside a request)."""
    return _tenant.get()


class SharesExhausted(Exception):
    """No slot came free within the wait: ``limit`` slots of ``what`` were all in use."""

    def __init__(self, what: str, limit: int, waited: float) -> None:
        super().__init__(f"{what}: all {limit} in use (waited {waited:g} s)")
        self.what, self.limit, self.waited = what, limit, waited


class Slots:
    """At most ``limit`` holders at once, the others served first come, first served.

    Not bound to an event loop until someone waits (each waiter's future is made on its running loop).
    ``acquire(wait)`` returns True with a slot, False when none came free in ``wait`` seconds;
    ``release()`` hands the slot to the oldest live waiter. Cancellation never leaks a slot."""

    __slots__ = ("limit", "used", "_waiters")

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.used = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def idle(self) -> bool:
        """Nobody holds or waits for a slot."""
        return not self.used and not self._waiters

    async def acquire(self, wait: float) -> bool:
        if self.used < self.limit and not self._waiters:
            self.used += 1
            return True
        if wait <= 0:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait((waiter,), timeout=wait)
        except BaseException:
            self._give_up(waiter)
            raise
        if waiter.done() and not waiter.cancelled():
            return True  # handed over by release(): ``used`` already counts it
        self._give_up(waiter)
        return False

    def _give_up(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done() and not waiter.cancelled():
            self.release()  # handed over while leaving: pass it on
            return
        waiter.cancel()
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.used = max(0, self.used - 1)


class Shares:
    """``Slots`` per key (a tenant id, an upstream id), made on first use and forgotten when idle."""

    def __init__(self) -> None:
        self._slots: dict[tuple[str, int], Slots] = {}

    def slots(self, kind: str, key: int, limit: int) -> Slots:
        """The slots of ``(kind, key)`` with ``limit`` (a changed setting applies to new holders)."""
        slots = self._slots.get((kind, key))
        if slots is None:
            if len(self._slots) > 10_000:
                for name in [n for n, s in self._slots.items() if s.idle]:
                    del self._slots[name]
            slots = self._slots[(kind, key)] = Slots(limit)
        slots.limit = max(1, limit)
        return slots

    @contextlib.asynccontextmanager
    async def held(self, kind: str, key: int, limit: int, *, wait: float, what: str) -> AsyncIterator[None]:
        """Hold one slot of ``(kind, key)`` for the block; ``SharesExhausted`` after ``wait`` seconds
        without one (``what`` names it for the message)."""
        slots = self.slots(kind, key, limit)
        if not await slots.acquire(wait):
            raise SharesExhausted(what, slots.limit, wait)
        try:
            yield
        finally:
            slots.release()


#: The process's shares (the event loop's; plain counters).
SHARES = Shares()
