"""A person's limits hold over all their keys together (``proxy.policy.limits.admit(member=...)``)."""

from __future__ import annotations

import pytest

from infra.shared_state import MemoryState
from proxy.policy.limits import LimitExceeded, admit
from tenants.limits import Limits

NOW = 1_800_000_000.0 - (1_800_000_000.0 % 86400)


async def test_a_members_rpm_holds_across_their_keys() -> None:
    """Two keys of one member, a member rpm of 1: the second key's request is refused, naming the member."""
    state = MemoryState(clock=lambda: NOW + 10)
    await admit((1, 2, Limits(), Limits()), estimate=1, state=state, member=(7, Limits(rpm=1)))
    with pytest.raises(LimitExceeded) as refused:
        await admit((1, 3, Limits(), Limits()), estimate=1, state=state, member=(7, Limits(rpm=1)))
    assert refused.value.code == "rpm" and "your personal limit is 1" in refused.value.message
    # another member of the same tenant is not affected
    await admit((1, 4, Limits(), Limits()), estimate=1, state=state, member=(8, Limits(rpm=1)))


async def test_a_members_daily_tokens_are_a_quota() -> None:
    """Spent: a quota refusal (429 insufficient_quota type, not retryable)."""
    state = MemoryState(clock=lambda: NOW + 10)
    member = (7, Limits(daily_tokens=10))
    await admit((1, 2, Limits(), Limits()), estimate=10, state=state, member=member)
    with pytest.raises(LimitExceeded) as refused:
        await admit((1, 3, Limits(), Limits()), estimate=5, state=state, member=member)
    assert refused.value.quota and refused.value.code == "daily_tokens" and "your personal" in refused.value.message
