"""Admission of requests by their key's and tenant's limits (``proxy.policy.limits``), in process memory."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from infra.shared_state import MemoryState, Window, WindowUsage
from proxy.policy.limits import LimitExceeded, admit, rate_headers
from tenants.limits import Limits

NOW = 1_800_000_000.0 - (1_800_000_000.0 % 86400)  # a UTC midnight


@pytest.fixture
def state() -> MemoryState:
    return MemoryState(clock=lambda: NOW + 10)


NONE = Limits()


def who(tenant: Limits = NONE, key: Limits = NONE) -> tuple[int, int, Limits, Limits]:
    return (1, 2, tenant, key)


async def test_a_principal_without_limits_costs_no_state_call(state: MemoryState) -> None:
    class Refusing(MemoryState):
        async def admit(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("no call expected")

    admission = await admit(who(), estimate=100, state=Refusing())
    assert admission.headers == [] and admission.leases == ()


async def test_the_key_rpm_refuses_with_its_name_retry_after_and_headers(state: MemoryState) -> None:
    limits = who(key=Limits(rpm=2))
    first = await admit(limits, estimate=5, state=state)
    assert dict(first.headers)[b"x-ratelimit-remaining-requests"] == b"1"
    await admit(limits, estimate=5, state=state)
    with pytest.raises(LimitExceeded) as refused:
        await admit(limits, estimate=5, state=state)
    exc = refused.value
    assert (exc.code, exc.type, exc.quota) == ("rpm", "rate_limit_exceeded", False)
    assert exc.retry_after is not None and 1 <= exc.retry_after <= 60
    headers = dict(exc.headers)
    assert headers[b"x-ratelimit-limit-requests"] == b"2" and headers[b"x-ratelimit-remaining-requests"] == b"0"
    assert headers[b"x-ratelimit-reset-requests"].endswith(b"s")
    assert "this key's limit is 2 requests per minute" in exc.message


async def test_the_tenant_limit_holds_across_its_keys(state: MemoryState) -> None:
    await admit((1, 2, Limits(rpm=1), Limits()), estimate=1, state=state)
    with pytest.raises(LimitExceeded) as refused:
        await admit((1, 3, Limits(rpm=1), Limits()), estimate=1, state=state)
    assert "the tenant's limit" in refused.value.message


async def test_tokens_are_estimated_then_corrected_from_usage(state: MemoryState) -> None:
    limits = who(key=Limits(tpm=1000))
    admission = await admit(limits, estimate=400, state=state)
    await admission.settle(900)  # the answer used more than the estimate
    with pytest.raises(LimitExceeded) as refused:
        await admit(limits, estimate=200, state=state)
    assert refused.value.code == "tpm" and refused.value.retry_after is not None
    settled = await admit(limits, estimate=100, state=state)
    await settled.settle(None)  # no usage: the estimate stands
    assert dict(settled.headers)[b"x-ratelimit-remaining-tokens"] == b"0"


async def test_a_request_larger_than_the_tpm_is_not_retryable(state: MemoryState) -> None:
    with pytest.raises(LimitExceeded) as refused:
        await admit(who(key=Limits(tpm=100)), estimate=500, state=state)
    assert refused.value.quota and refused.value.retry_after is None


async def test_a_spent_daily_budget_is_insufficient_quota_not_retryable(state: MemoryState) -> None:
    limits = who(tenant=Limits(daily_tokens=1000))
    admission = await admit(limits, estimate=100, state=state)
    await admission.settle(1500)
    with pytest.raises(LimitExceeded) as refused:
        await admit(limits, estimate=1, state=state)
    exc = refused.value
    assert (exc.code, exc.type, exc.retry_after) == ("daily_tokens", "insufficient_quota", None)
    assert "renews in 86390 s" in exc.message


async def test_a_monthly_budget_refuses_too(state: MemoryState) -> None:
    with pytest.raises(LimitExceeded) as refused:
        await admit(who(key=Limits(monthly_tokens=0)), estimate=1, state=state)
    assert refused.value.code == "monthly_tokens" and refused.value.quota


async def test_zero_blocks(state: MemoryState) -> None:
    with pytest.raises(LimitExceeded):
        await admit(who(key=Limits(rpm=0)), estimate=1, state=state)


async def test_over_concurrency_waits_for_a_slot_in_arrival_order(state: MemoryState, settings: Any) -> None:
    settings.LIMITS_CONCURRENCY_WAIT_SECONDS = 5.0
    limits = who(key=Limits(concurrency=1))
    holder = await admit(limits, estimate=1, state=state)
    order: list[int] = []

    async def waiter(n: int) -> None:
        admission = await admit(limits, estimate=1, state=state)
        order.append(n)
        await asyncio.sleep(0.01)
        await admission.settle(1)

    tasks = []
    for n in range(3):
        tasks.append(asyncio.ensure_future(waiter(n)))
        await asyncio.sleep(0.01)  # queued in this order
    await holder.settle(1)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)
    assert order == [0, 1, 2]


async def test_over_concurrency_gets_429_after_the_bounded_wait(state: MemoryState, settings: Any) -> None:
    settings.LIMITS_CONCURRENCY_WAIT_SECONDS = 0.2
    limits = who(tenant=Limits(concurrency=1))
    await admit(limits, estimate=1, state=state)
    started = asyncio.get_running_loop().time()
    with pytest.raises(LimitExceeded) as refused:
        await admit(limits, estimate=1, state=state)
    assert refused.value.code == "concurrency" and refused.value.retry_after == 1.0
    assert 0.15 <= asyncio.get_running_loop().time() - started < 3


def test_anthropic_headers_carry_rfc3339_resets() -> None:
    usage = [WindowUsage(Window("k:1:rpm", 60, 10), 4, 30.0), WindowUsage(Window("t:1:rpm", 60, 5), 4, 20.0),
             WindowUsage(Window("k:1:tpm", 60, 100), 40, 30.0)]
    headers = dict(rate_headers(usage, anthropic=True, now=NOW))
    assert headers[b"anthropic-ratelimit-requests-limit"] == b"5"  # the tighter (tenant's) window
    assert headers[b"anthropic-ratelimit-requests-remaining"] == b"1"
    assert headers[b"anthropic-ratelimit-requests-reset"].endswith(b"Z")
    assert headers[b"anthropic-ratelimit-tokens-remaining"] == b"60"


async def test_leases_of_requests_in_flight_are_renewed_until_settled(settings: Any) -> None:
    """A request longer than the lease keeps its slot (renewed every third of ``LIMITS_LEASE_SECONDS``);
    once settled, renewals stop."""
    settings.LIMITS_LEASE_SECONDS = 0.3
    settings.LIMITS_CONCURRENCY_WAIT_SECONDS = 0.0
    state = MemoryState()
    limits = who(key=Limits(concurrency=1))
    admission = await admit(limits, estimate=1, state=state)
    await asyncio.sleep(0.8)  # more than twice the lease: held only because it was renewed
    with pytest.raises(LimitExceeded):
        await admit(limits, estimate=1, state=state)
    await admission.settle(1)
    again = await admit(limits, estimate=1, state=state)
    assert again.leases
    await again.settle(1)
