"""Credential pools and circuits: the rules (``infra.routing_health``, with hypothesis) and the request's
router over the in-process shared state on a fake clock (``proxy.routing.router``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra import routing_health as health
from infra.routing_health import Circuit, KeyState
from infra.shared_state import MemoryState
from proxy.guard.policy import GuardPolicy
from proxy.guard.turn import Decision, Outcome, UpstreamError
from proxy.routing.router import Router
from tenants.principal import RoutePlan, UpstreamTarget

NOW = 1_800_000_000.0

states = st.one_of(
    st.just(KeyState()),
    st.builds(KeyState, until=st.floats(NOW - 100, NOW + 100), failed_at=st.floats(NOW - 100, NOW)),
    st.builds(KeyState, disabled=st.just(True), failed_at=st.floats(NOW - 100, NOW)),
)
pools = st.dictionaries(
    st.text("abcdef", min_size=1, max_size=3), st.tuples(st.integers(0, 5), states), min_size=1, max_size=6
)


@given(pools, st.floats(0, 1), st.sets(st.text("abcdef", min_size=1, max_size=3)))
def test_a_key_is_always_chosen_and_never_an_unusable_one_while_an_ok_one_exists(
    pool: dict[str, tuple[int, KeyState]], rand: float, avoid: set[str]
) -> None:
    weights = [(k, w) for k, (w, _) in pool.items()]
    found = {k: s for k, (_, s) in pool.items()}
    chosen = health.choose_key(weights, found, NOW, rand, frozenset(avoid))
    assert chosen in pool
    ok = {k for k, s in found.items() if s.state(NOW) == health.OK}
    if ok:
        assert chosen in ok
        if ok - avoid:
            assert chosen not in avoid
    else:  # every key benched: the least-recently-failed one, cooling before disabled
        unavoided = [k for k in found if k not in avoid] or list(found)
        best = min(unavoided, key=lambda k: (found[k].disabled, found[k].failed_at))
        assert (found[chosen].disabled, found[chosen].failed_at) == (found[best].disabled, found[best].failed_at)


def test_keys_are_chosen_by_weight() -> None:
    weights = [("a", 1), ("b", 3)]
    picks = [health.choose_key(weights, {}, NOW, i / 100) for i in range(100)]
    assert picks.count("a") == 25 and picks.count("b") == 75


def test_a_429_cools_a_key_and_a_401_disables_it() -> None:
    cooling = health.cooled(KeyState(), NOW, 5)
    assert cooling.state(NOW) == health.COOLING and cooling.state(NOW + 6) == health.OK
    assert health.disabled(cooling, NOW).state(NOW + 1e6) == health.DISABLED
    assert KeyState.loads(cooling.dumps()) == cooling
    assert KeyState.loads("not json") == KeyState() == KeyState.loads('{"u": "x"}')


def test_the_circuit_opens_half_opens_and_closes() -> None:
    c = Circuit()
    for _ in range(2):
        c = health.failed(c, NOW, threshold=3, cooldown=10)
        assert c.state(NOW) == health.CLOSED
    c = health.failed(c, NOW, threshold=3, cooldown=10)
    assert c.state(NOW + 9) == health.OPEN and c.state(NOW + 10) == health.HALF_OPEN
    reopened = health.failed(c, NOW + 11, threshold=3, cooldown=10)  # the probe failed
    assert reopened.state(NOW + 20) == health.OPEN and reopened.state(NOW + 21) == health.HALF_OPEN
    assert health.succeeded(reopened).state(NOW) == health.CLOSED
    assert Circuit.loads(reopened.dumps()) == reopened and Circuit.loads(None) == Circuit()


# ----- the router -----


def target(upstream_id: int, *keys: str) -> UpstreamTarget:
    pool = tuple((k, f"enc-{k}", 1) for k in keys)
    return UpstreamTarget(
        upstream_id=upstream_id,
        name=f"u{upstream_id}",
        base_url="http://u.test/v1",
        model="m",
        credential_encrypted=pool[0][1] if pool else "",
        extra_headers_encrypted="",
        connect_timeout=1,
        first_byte_timeout=1,
        idle_timeout=1,
        keys=pool if len(pool) > 1 else (),
        key_id=keys[0] if keys else "0",
    )


def plan(*targets: UpstreamTarget) -> RoutePlan:
    return RoutePlan("m", 1, targets, None, GuardPolicy(max_retries=2))


def error(status: int, type_: str = "upstream_error", retry_after: float | None = None) -> Decision:
    return Decision(
        Outcome.UPSTREAM_ERROR, None, (), error=UpstreamError(status, "x", type=type_, retry_after=retry_after)
    )


OK = Decision(Outcome.CLEAN, None, ())


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def state(clock: Clock) -> MemoryState:
    return MemoryState(clock=clock)


@pytest.fixture
def changes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the router journals (the journal is not what these tests are about)."""
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr("audit.records.routing_changed", lambda **kw: seen.append(kw))
    return seen


async def test_a_429_moves_the_next_requests_to_the_other_key(
    state: MemoryState, clock: Clock, changes: list[dict[str, Any]]
) -> None:
    pooled = target(1, "0", "7")
    first = await Router.read(plan(pooled), state=state)
    used = first.pick(pooled)
    await first.observe(used, error(429, retry_after=20))
    other = "7" if used.key_id == "0" else "0"
    assert first.pick(pooled).key_id == other  # the retry of the same request
    for _ in range(20):
        assert (await Router.read(plan(pooled), state=state)).pick(pooled).key_id == other
    clock.now += 21
    seen = {(await Router.read(plan(pooled), state=state)).pick(pooled).key_id for _ in range(50)}
    assert seen == {"0", "7"}
    assert changes == []


async def test_a_refused_key_is_disabled_with_an_incident_and_the_last_key_is_never_benched(
    state: MemoryState, changes: list[dict[str, Any]]
) -> None:
    pooled = target(1, "0", "7")
    router = await Router.read(plan(pooled), state=state)
    for key in ("0", "7"):
        await router.observe(dataclasses.replace(pooled, key_id=key), error(401))
    assert [c["event"] for c in changes] == ["key-disabled", "key-disabled"]
    again = await Router.read(plan(pooled), state=state)
    assert again.pick(pooled).key_id == "0"  # both disabled: the least-recently-failed one still goes


async def test_consecutive_failures_open_the_circuit_and_a_probe_closes_it(
    state: MemoryState, clock: Clock, changes: list[dict[str, Any]], settings: Any
) -> None:
    settings.ROUTING_CIRCUIT_FAILURES, settings.ROUTING_CIRCUIT_COOLDOWN_SECONDS = 3, 10.0
    dead, spare = target(1), target(2)
    for kind in ("upstream_unavailable", "upstream_timeout", "upstream_error"):
        router = await Router.read(plan(dead, spare), state=state)
        assert router.plan.targets == (dead, spare)
        await router.observe(dead, error(503 if kind == "upstream_error" else 502, kind))
    assert [c["event"] for c in changes] == ["circuit-open"]
    skipping = await Router.read(plan(dead, spare), state=state)
    assert skipping.plan.targets == (spare,)
    assert (await Router.read(plan(dead), state=state)).plan.targets == (dead,)  # never the last route
    clock.now += 10
    probe = await Router.read(plan(dead, spare), state=state)
    assert probe.plan.targets == (dead, spare)  # this request is the probe
    assert (await Router.read(plan(dead, spare), state=state)).plan.targets == (spare,)  # one probe only
    await probe.observe(dead, OK)
    assert changes[-1]["event"] == "circuit-closed"
    assert (await Router.read(plan(dead, spare), state=state)).plan.targets == (dead, spare)


async def test_misconfiguration_and_broken_output_do_not_count_towards_the_circuit(
    state: MemoryState, changes: list[dict[str, Any]], settings: Any
) -> None:
    settings.ROUTING_CIRCUIT_FAILURES = 1
    up = target(1)
    router = await Router.read(plan(up, target(2)), state=state)
    await router.observe(up, error(502, "upstream_misconfigured"))
    await router.observe(up, Decision(Outcome.RETRY, None, ()))
    await router.observe(up, error(400))
    assert (await Router.read(plan(up, target(2)), state=state)).plan.targets[0] == up
    assert changes == []


async def test_a_session_keeps_its_upstream_and_key_while_healthy_and_moves_only_on_failure(
    state: MemoryState, changes: list[dict[str, Any]]
) -> None:
    pooled, spare = target(1, "0", "7", "9"), target(2)
    session = "h:" + "ab" * 16
    used = set()
    for _ in range(20):  # a 20-turn session: one upstream, one key
        router = await Router.read(plan(pooled, spare), state=state, session=session)
        chosen = router.pick(router.plan.targets[0])
        used.add((chosen.upstream_id, chosen.key_id))
        assert await router.delivered(chosen) is None  # new, then kept: never a move
    assert len(used) == 1
    ((_, held),) = used
    router = await Router.read(plan(pooled, spare), state=state, session=session)
    first = router.pick(pooled)
    await router.observe(first, error(429, retry_after=60))  # the session's key cools: it moves, recorded
    second = router.pick(pooled)
    assert second.key_id != held
    moved = router.move_finding(second)  # the request's finding, known before its finish record
    assert moved is not None and (moved.kind.value, moved.severity.value) == ("session-moved", "info")
    assert "to another key (its own failed" in moved.detail and f"key {held} to " in moved.detail
    assert moved.detail.endswith(f"key {second.key_id}")
    assert await router.delivered(second) == (1, held)
    assert router.move_finding(second) is None  # kept from now on
    later = await Router.read(plan(pooled, spare), state=state, session=session)
    assert later.pick(pooled).key_id == second.key_id  # and stays on the new key
    other = await Router.read(plan(pooled, spare), state=state, session="n:" + "cd" * 16)
    assert other.session == ""  # a new conversation has no session of its own to keep


async def test_a_session_moved_to_a_fallback_stays_there_while_it_is_healthy(state: MemoryState) -> None:
    primary, spare = target(1), target(2)
    session = "c:" + "ef" * 16
    router = await Router.read(plan(primary, spare), state=state, session=session)
    assert await router.delivered(spare) is None  # answered by the fallback (the primary failed)
    again = await Router.read(plan(primary, spare), state=state, session=session)
    assert again.plan.targets == (spare, primary)
