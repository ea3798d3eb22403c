"""Money budgets on the request path (issue 19 item 4): reserve, settle, refuse, the soft threshold; in
process memory and in real Redis (the same Lua call as every other window)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from infra.shared_state import MemoryState, RedisState, SharedState
from proxy.policy import limits as policy
from proxy.policy.limits import LimitExceeded, admit
from tenants.limits import Limits

NOW = 1_800_000_000.0 - (1_800_000_000.0 % 86400)  # a UTC midnight (a Friday)
REDIS_URL = "redis://127.0.0.1:6379/3"
COST = 25e-6  # 11 input + 7 output tokens at $1 / $2 per million


@pytest.fixture(params=["memory", "redis"])
async def state(request: pytest.FixtureRequest) -> AsyncIterator[SharedState]:
    policy._reported.clear()
    clock = lambda: NOW + 3600  # noqa: E731
    if request.param == "memory":
        yield MemoryState(clock=clock)
        return
    made = RedisState(REDIS_URL, prefix=f"test:{uuid.uuid4().hex}:", clock=clock, timeout=1.0, cooldown=1.0)
    yield made
    await made.close()


async def _served(state: SharedState, tenant: Limits, *, reserve: float = 44e-6, cost: float = COST,
                  key: Limits | None = None, member: tuple[int, Limits] | None = None) -> policy.Admission:
    admission = await admit((1, 2, tenant, key or Limits()), estimate=30, state=state, reserve_usd=reserve,
                            member=member)
    await admission.settle(18, usd=cost)
    return admission


async def test_a_daily_budget_serves_until_spent_then_refuses_with_budget_spent_and_reset(state: SharedState) -> None:
    budget = Limits(daily_usd=0.0001)
    served = [await _served(state, budget) for _ in range(4)]  # 25, 50, 75, 100 micro-dollars
    assert all(a.counted for a in served)
    with pytest.raises(LimitExceeded) as refused:
        await _served(state, budget)
    exc = refused.value
    assert (exc.code, exc.type, exc.quota, exc.retry_after, exc.limit) == (
        "insufficient_quota", "insufficient_quota", True, None, "daily_usd")
    assert "the tenant's daily budget is $0.0001 per day (UTC), $0.0001 spent" in exc.message
    assert "resets at 2027-01-16T00:00:00Z" in exc.message or "resets at " in exc.message
    assert "(in 82800 s)" in exc.message


async def test_reservations_in_flight_hold_the_budget(state: SharedState) -> None:
    budget = Limits(weekly_usd=0.0001)
    held = [await admit((1, 2, budget, Limits()), estimate=30, state=state, reserve_usd=50e-6) for _ in range(2)]
    with pytest.raises(LimitExceeded) as refused:  # 100 reserved: nothing more until they settle
        await admit((1, 2, budget, Limits()), estimate=30, state=state, reserve_usd=50e-6)
    assert "weekly budget" in refused.value.message and "per week (UTC)" in refused.value.message
    for admission in held:
        await admission.settle(10, usd=10e-6)  # they cost less than reserved: room again
    await admit((1, 2, budget, Limits()), estimate=30, state=state, reserve_usd=50e-6)


async def test_key_and_member_budgets_apply_within_the_tenant(state: SharedState) -> None:
    member = (7, Limits(monthly_usd=0.00005))
    await _served(state, Limits(), member=member)
    await _served(state, Limits(), member=member)
    with pytest.raises(LimitExceeded) as refused:
        await _served(state, Limits(), member=member)
    assert "your personal monthly budget" in refused.value.message
    await _served(state, Limits(), key=Limits(daily_usd=1.0))  # another holder: its own window
    with pytest.raises(LimitExceeded) as by_key:
        await _served(state, Limits(), key=Limits(daily_usd=0.00001), member=(8, Limits(daily_usd=1.0)))
        await _served(state, Limits(), key=Limits(daily_usd=0.00001))
    assert "this key's daily budget" in by_key.value.message


async def test_soft_threshold_leaves_one_finding_per_budget_and_window(state: SharedState) -> None:
    budget = Limits(daily_usd=0.0001)
    findings: list[Any] = []
    for _ in range(4):
        findings += (await _served(state, budget)).findings
    assert [f.kind.value for f in findings] == ["money-budget-threshold"]
    assert "the tenant's daily budget passed 80%" in findings[0].detail
    policy._reported.clear()  # another process: the shared one-shot window still holds
    with pytest.raises(LimitExceeded):
        await _served(state, budget)
    assert (await admit((1, 2, Limits(daily_usd=1.0), Limits()), estimate=1, state=state)).findings == ()


async def test_each_holder_sets_its_own_soft_threshold(state: SharedState) -> None:
    """``money_soft_percent``: the tenant's 40% fires on the first request (44 of 100 micro-dollars reserved);
    the member's 95% on the same spend does not, until its budget is nearly spent; each once."""
    tenant = Limits(daily_usd=0.0001, money_soft_percent=40)
    member = (9, Limits(daily_usd=0.0001, money_soft_percent=95))
    first = (await _served(state, tenant, member=member)).findings
    assert [f.detail.split(" budget ")[0] for f in first] == ["the tenant's daily"]
    assert "passed 40%" in first[0].detail
    seen = [[f.detail for f in (await _served(state, Limits(daily_usd=1.0), member=member)).findings]
            for _ in range(3)]  # spent or reserved at admission: 69, 94, then 119 micro-dollars
    assert seen[:2] == [[], []]
    assert seen[2] == ["your personal daily budget passed 95%: $0.000119 of $0.0001 spent or reserved"]


async def test_a_budget_window_sets_its_own_soft_threshold(state: SharedState) -> None:
    """``daily_usd_soft_percent`` 30 fires the daily budget at the first request (44 of 100 micro-dollars),
    while the monthly budget, without its own, keeps the holder's ``money_soft_percent`` 95."""
    tenant = Limits(daily_usd=0.0001, monthly_usd=0.0001, money_soft_percent=95, daily_usd_soft_percent=30)
    first = (await _served(state, tenant)).findings
    assert [f.detail.split(":")[0] for f in first] == ["the tenant's daily budget passed 30%"]
    assert tenant.soft_percent("monthly_usd") == 95 and tenant.soft_percent("weekly_usd") == 95
    assert Limits(weekly_usd_soft_percent=60).soft_percent("weekly_usd") == 60
    assert Limits().soft_percent("daily_usd") is None  # MONEY_SOFT_PERCENT then


async def test_unpriced_requests_reserve_nothing_and_a_bad_cost_keeps_the_reservation(state: SharedState) -> None:
    budget = Limits(daily_usd=0.0001)
    admission = await admit((1, 2, budget, Limits()), estimate=30, state=state, reserve_usd=float("nan"))
    assert admission.reserved == 0
    await admission.settle(10, usd=float("inf"))
    second = await admit((1, 2, budget, Limits()), estimate=30, state=state, reserve_usd=100e-6)
    await second.settle(None, usd=None)  # no cost known: the reservation stands
    with pytest.raises(LimitExceeded):
        await admit((1, 2, budget, Limits()), estimate=30, state=state, reserve_usd=1e-6)
