"""Fair shares (issue 24 item 3): ``proxy.upstreams.shares.Slots`` and refused requests counted in the
key's rate (``proxy.policy.limits.count_refused``). Over real sockets: tests/e2e/test_fair_shares.py."""

from __future__ import annotations

import asyncio

import pytest

from infra.shared_state import MemoryState
from proxy.policy.limits import LimitExceeded, admit, count_refused
from proxy.upstreams.shares import Shares, Slots
from tenants.limits import Limits


async def test_slots_serve_in_arrival_order_and_time_out() -> None:
    slots = Slots(1)
    assert await slots.acquire(0)
    order: list[int] = []

    async def wait(n: int) -> None:
        if await slots.acquire(5):
            order.append(n)
            await asyncio.sleep(0)
            slots.release()

    waiters = [asyncio.ensure_future(wait(n)) for n in range(3)]
    await asyncio.sleep(0)
    assert not await slots.acquire(0.01), "a newcomer never jumps the queue"
    slots.release()
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2] and slots.idle


async def test_a_cancelled_or_timed_out_waiter_never_leaks_a_slot() -> None:
    slots = Slots(1)
    assert await slots.acquire(0)
    gone = asyncio.ensure_future(slots.acquire(5))
    await asyncio.sleep(0)
    gone.cancel()
    assert not await slots.acquire(0.01)
    slots.release()
    assert slots.idle and await slots.acquire(0) and slots.used == 1
    slots.release()
    assert slots.idle


async def test_shares_are_per_key() -> None:
    shares = Shares()
    a, b = shares.slots("tenant", 1, 2), shares.slots("tenant", 2, 2)
    assert await a.acquire(0) and await a.acquire(0) and not await a.acquire(0)
    assert await b.acquire(0), "tenant 2 is not held up by tenant 1"


async def test_refused_requests_count_against_the_keys_rate() -> None:
    state = MemoryState()
    who = (1, 2, Limits(), Limits(rpm=3))
    for _ in range(3):
        await count_refused(who, state=state)
    with pytest.raises(LimitExceeded) as refused:
        await admit(who, estimate=1, state=state)
    assert refused.value.code == "rpm"


async def test_a_principal_without_rpm_costs_no_state_call() -> None:
    class Refusing(MemoryState):
        async def add(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("no call expected")

    await count_refused((1, 2, Limits(tpm=5), Limits()), state=Refusing())
