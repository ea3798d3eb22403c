"""Routing by live broken-turn rate: the choice (``infra.routing_quality``, with hypothesis), the retry's
target (``RoutePlan.next_index``), and the router over the in-process shared state (``proxy.routing``)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.routing_quality import Rate, choose, rate_of
from infra.shared_state import MemoryState
from proxy.guard.policy import GuardPolicy
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn
from proxy.routing import quality
from proxy.routing.router import Router
from tenants.principal import RoutePlan
from tests.proxy.test_routing import target

counts = st.floats(0, 1e6, allow_nan=False)
rates = st.builds(lambda t, share: Rate(t * share, t), counts, st.floats(0, 1))
unit = st.floats(0, 1, exclude_max=True)


@given(st.lists(rates, min_size=1, max_size=8), unit, st.floats(-1, 2))
def test_the_choice_is_the_best_target_or_an_explored_other_one(found: list[Rate], rand: float, explore: float) -> None:
    chosen = choose(found, rand, explore)
    assert 0 <= chosen < len(found)
    best = min(range(len(found)), key=lambda i: (found[i].value(), i))
    share = min(max(explore, 0.0), 0.5)
    if rand >= share or len(found) == 1:
        assert chosen == best
    else:
        assert chosen != best


@given(st.lists(rates, min_size=2, max_size=5), st.floats(0.01, 0.5))
def test_the_best_target_gets_all_but_the_exploration_share(found: list[Rate], explore: float) -> None:
    picks = [choose(found, i / 1000, explore) for i in range(1000)]
    best = min(range(len(found)), key=lambda i: (found[i].value(), i))
    assert abs(picks.count(best) / 1000 - (1 - explore)) <= 0.002
    assert {i for i in range(len(found)) if i != best} <= set(picks) or explore * 1000 < len(found)


@given(counts, counts, counts)
def test_the_smoothed_rate_is_in_0_1_and_grows_with_broken_turns(total: float, broken: float, more: float) -> None:
    low, high = rate_of(total, broken), rate_of(total, broken + more)
    assert 0 < low.value() < 1 and low.value() <= high.value()
    assert Rate().value() == 0.5 and Rate().observed() is None


@given(st.integers(1, 6), st.integers(-2, 8), st.booleans(), st.sampled_from(["next", "same"]))
def test_the_retry_goes_to_the_next_target_or_stays(count: int, index: int, broken: bool, where: str) -> None:
    plan = RoutePlan("m", 1, tuple(target(i) for i in range(count)), None, GuardPolicy(), retry_target=where)
    after = plan.next_index(index, broken=broken)
    assert 0 <= after < count
    here = min(max(index, 0), count - 1)
    if broken and where == "same":
        assert after == here
    elif broken:
        assert after == (here + 1) % count  # another target whenever there is one
    else:
        assert after == min(here + 1, count - 1)  # an upstream error: onwards, the last repeating


def test_it_refuses_no_rates() -> None:
    with pytest.raises(ValueError):
        choose([], 0.5, 0.1)


def two() -> RoutePlan:
    return RoutePlan("m", 1, (target(1, "0", "7", "9"), target(2, "0", "5")), None, GuardPolicy(), prefer="quality")


async def test_new_sessions_go_to_the_target_that_breaks_fewer_turns(settings: object) -> None:
    settings.ROUTING_QUALITY_CACHE_SECONDS = 0.0  # type: ignore[attr-defined]
    state = MemoryState()
    bad, good = two().targets
    for i in range(100):
        await quality.count(state, bad, broken=i % 10 < 6)
        await quality.count(state, good, broken=i % 20 == 0)
    rand = random.Random(7)
    firsts = []
    for i in range(1000):
        router = await Router.read(two(), state=state, session=f"h:{i:032x}")
        router._rand = rand
        firsts.append(router.plan.targets[0].upstream_id)
    assert 850 <= firsts.count(2) <= 950  # ROUTING_QUALITY_EXPLORE 0.1: about 900
    order = RoutePlan("m", 1, two().targets, None, GuardPolicy())
    assert (await Router.read(order, state=state)).plan.targets[0] == bad  # prefer=order: the route's order


async def test_a_session_keeps_its_target_even_when_another_one_is_better() -> None:
    state = MemoryState()
    bad, good = two().targets
    session = "h:" + "12" * 16
    first = await Router.read(two(), state=state, session=session)
    await first.delivered(dataclasses.replace(bad, key_id="7"))
    for _ in range(50):
        await quality.count(state, bad, broken=True)
    for _ in range(20):
        router = await Router.read(two(), state=state, session=session)
        assert router.plan.targets[0] == bad and router.pick(bad).key_id == "7"


async def test_a_new_conversation_keeps_the_upstream_and_key_of_its_first_answer() -> None:
    state = MemoryState()
    opening = "n:" + "34" * 16
    router = await Router.read(two(), state=state, session=opening)
    assert router.session == ""
    chosen = router.pick(router.plan.targets[0])
    turn = Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("call_1", "run", "{}")], finish_reason="tool_calls")])
    assert await router.delivered(chosen, turn) is None
    from proxy.guard.decisions.loops import chain_session

    chained = chain_session(opening, turn)
    for _ in range(10):
        later = await Router.read(two(), state=state, session=chained)
        assert later.plan.targets[0].upstream_id == chosen.upstream_id
        assert later.pick(later.plan.targets[0]).key_id == chosen.key_id
