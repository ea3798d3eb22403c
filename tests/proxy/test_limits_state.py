"""The shared state of the limits: the same tests against real Redis and the in-process fallback."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.shared_state import Lease, MemoryState, RedisState, SharedState, Window

REDIS_URL = "redis://127.0.0.1:6379/3"  # a DB of its own; keys under a prefix unique per test


class Clock:
    """A clock the test moves (Unix seconds)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["memory", "redis"])
async def state(request: pytest.FixtureRequest, clock: Clock) -> AsyncIterator[SharedState]:
    """Each implementation, on a fake clock."""
    made: SharedState
    if request.param == "memory":
        made = MemoryState(clock=clock)
    else:
        made = RedisState(REDIS_URL, prefix=f"test:{uuid.uuid4().hex}:", clock=clock, timeout=1.0, cooldown=1.0)
    yield made
    await made.close()


def rpm(limit: int | None, cost: int = 1) -> Window:
    return Window("k:1:rpm", 60, limit, cost)


async def test_it_admits_up_to_the_limit_then_refuses_naming_the_window(state: SharedState) -> None:
    for n in range(3):
        verdict = await state.admit([rpm(3)])
        assert verdict.admitted and verdict.usage[0].used == n + 1
    refused = await state.admit([rpm(3)])
    assert refused.refused == rpm(3) and refused.usage[0].used == 3 and refused.usage[0].remaining == 0
    assert 0 < refused.usage[0].reset <= 60


async def test_it_counts_nothing_when_one_check_fails(state: SharedState) -> None:
    tenant, key = Window("t:1:rpm", 60, 10), Window("k:1:rpm", 60, 0)
    verdict = await state.admit([tenant, key])
    assert verdict.refused == key
    assert (await state.admit([tenant])).usage[0].used == 1  # the refused admission added nothing


async def test_it_slides_the_window(state: SharedState, clock: Clock) -> None:
    clock.now = 1_800_000_000.0 - (1_800_000_000.0 % 60)  # the start of a bucket
    for _ in range(4):
        assert (await state.admit([rpm(4)])).admitted
    clock.now += 60 + 15  # a quarter into the next bucket: 3/4 of the previous one still counts
    verdict = await state.admit([rpm(4)])
    assert verdict.refused is None and verdict.usage[0].used == 3 + 1
    clock.now += 60  # the one admitted a bucket ago still counts 3/4 (a fraction, rounded up: 1)
    assert (await state.admit([rpm(4)])).usage[0].used == 1 + 1
    clock.now += 120  # two buckets on: nothing left
    assert (await state.admit([rpm(4)])).usage[0].used == 1


async def test_a_count_just_before_a_bucket_boundary_still_counts_just_after(state: SharedState,
                                                                           clock: Clock) -> None:
    """Right after a boundary the previous bucket weighs almost fully: never dropped by rounding."""
    clock.now = 1_800_000_000.0 - (1_800_000_000.0 % 60) + 59.9
    assert (await state.admit([rpm(1)])).admitted
    clock.now += 0.2
    assert (await state.admit([rpm(1)])).refused is not None


async def test_a_budget_serves_the_request_that_crosses_it_then_refuses(state: SharedState) -> None:
    budget = Window("k:1:daily", 86400, 100, cost=80, strict=False, sliding=False, bucket="2026-12-01")
    assert (await state.admit([budget])).admitted
    assert (await state.admit([budget])).admitted  # 80 used < 100: served, now 160
    assert (await state.admit([budget])).refused == budget


async def test_zero_blocks_and_none_only_counts(state: SharedState) -> None:
    assert (await state.admit([rpm(0)])).refused == rpm(0)
    for _ in range(5):
        assert (await state.admit([rpm(None)])).admitted
    assert (await state.admit([rpm(None)])).usage[0].remaining is None


async def test_it_corrects_counts_afterwards_never_below_zero(state: SharedState) -> None:
    tpm = Window("k:1:tpm", 60, 1000, cost=300)
    await state.admit([tpm])
    await state.add([(tpm, 450)])  # the answer's usage was larger than the estimate
    assert (await state.admit([Window("k:1:tpm", 60, 1000, cost=0)])).usage[0].used == 750
    await state.add([(tpm, -5000)])
    assert (await state.admit([Window("k:1:tpm", 60, 1000, cost=0)])).usage[0].used == 0


async def test_leases_cap_concurrency_and_free_on_release_or_expiry(state: SharedState, clock: Clock) -> None:
    first, second, third = (Lease("k:1:conc", 2, ttl=30) for _ in range(3))
    assert (await state.admit([], [first])).admitted
    assert (await state.admit([], [second])).held == (2,)
    assert (await state.admit([], [third])).refused == third
    await state.release([first])
    assert (await state.admit([], [third])).admitted
    clock.now += 31  # the holders died: their slots expire
    assert (await state.admit([], [Lease("k:1:conc", 1, ttl=30)])).admitted


async def test_a_renewed_lease_outlives_its_ttl_an_expired_one_is_not_taken_again(state: SharedState,
                                                                                   clock: Clock) -> None:
    kept, lapsed = Lease("k:1:conc", 2, ttl=30), Lease("k:1:conc", 2, ttl=30)
    await state.admit([], [kept])
    await state.admit([], [lapsed])
    clock.now += 20
    await state.renew([kept])
    clock.now += 20  # 40 s after admission: the renewed one holds, the other expired
    await state.renew([lapsed])
    assert (await state.admit([], [Lease("k:1:conc", 2, ttl=30)])).held == (2,)  # kept + the new one


async def test_a_refused_lease_counts_no_window(state: SharedState) -> None:
    await state.admit([], [Lease("k:1:conc", 1, ttl=30)])
    assert (await state.admit([rpm(5)], [Lease("k:1:conc", 1, ttl=30)])).refused is not None
    assert (await state.admit([rpm(5)])).usage[0].used == 1


async def test_values_and_lists_expire(state: SharedState, clock: Clock) -> None:
    await state.remember("session:a", "fp1", ttl=10)
    for n in range(5):
        await state.append("calls:a", f"c{n}", ttl=10, max_len=3)
    assert await state.recall("session:a") == "fp1"
    assert await state.recent("calls:a") == ["c2", "c3", "c4"]
    assert await state.recent("calls:a", 2) == ["c3", "c4"]
    assert await state.recall("nothing") is None and await state.recent("nothing") == []
    if isinstance(state, MemoryState):  # Redis expires on its own clock: checked below with a real TTL
        clock.now += 11
        assert await state.recall("session:a") is None and await state.recent("calls:a") == []


async def test_redis_expires_values_by_ttl() -> None:
    state = RedisState(REDIS_URL, prefix=f"test:{uuid.uuid4().hex}:", timeout=1.0)
    await state.remember("v", "x", ttl=0.05)
    await state.append("l", "x", ttl=0.05)
    await asyncio.sleep(0.2)
    assert await state.recall("v") is None and await state.recent("l") == []
    await state.close()


async def test_a_broadcast_reaches_subscribers(state: SharedState) -> None:
    got: list[str] = []
    state.subscribe("revoked", got.append)
    await asyncio.sleep(0.2)  # Redis: the listener subscribes
    await state.publish("revoked", "key:abc")
    await asyncio.to_thread(state.publish_sync, "revoked", "key:def")
    for _ in range(100):
        if len(got) == 2:
            break
        await asyncio.sleep(0.02)
    assert got == ["key:abc", "key:def"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=30), st.integers(0, 8))
def test_memory_never_admits_past_a_strict_limit(steps: list[tuple[int, int]], limit: int) -> None:
    """Whatever the sequence of costs and clock moves, what one bucket admitted never exceeds the limit."""
    clock = Clock(0.0)
    state = MemoryState(clock=clock)
    window_total = 0
    for cost, move in steps:
        clock.now += move  # seconds, within one fixed 3600 s bucket
        verdict = asyncio.run(state.admit([Window("w", 3600, limit, cost, sliding=False)]))
        if verdict.admitted:
            window_total += cost
        assert window_total <= limit
        assert verdict.usage[0].used == window_total


# ----- Redis down or frozen: fail open, quickly, never raise -----

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def private_redis() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of this test's own on a free port (never the shared one: the test stops it)."""
    port = _free_port()
    process = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],  # noqa: S603, S607
                               stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield url, process
    process.kill()
    process.wait()


def _fail_open_count(op: str) -> float:
    from infra.metrics import LIMITS_FAIL_OPEN

    return LIMITS_FAIL_OPEN.labels(op=op)._value.get()  # type: ignore[no-any-return]


async def _every_call(state: SharedState) -> list[Any]:
    verdict = await state.admit([rpm(0)], [Lease("c", 0, 5)])
    await state.add([(rpm(1), 5)])
    await state.release([Lease("c", 1, 5)])
    await state.renew([Lease("c", 1, 5)])
    await state.remember("a", "b", 5)
    recalled = await state.recall("a")
    await state.append("l", "x", 5)
    recent = await state.recent("l")
    await state.publish("c", "m")
    return [verdict, None, None, None, recalled, None, recent]


async def test_frozen_redis_fails_open_within_the_deadline(private_redis: tuple[str, Any]) -> None:
    url, process = private_redis
    state = RedisState(url, prefix="t:", timeout=0.05, cooldown=0.5)
    assert (await state.admit([rpm(0)])).refused is not None  # healthy: 0 blocks
    before = _fail_open_count("admit")
    process.send_signal(19)  # SIGSTOP: Redis accepts nothing, answers nothing
    try:
        started = time.monotonic()
        verdict = await state.admit([rpm(0)])
        assert time.monotonic() - started < 0.5  # bounded by the 50 ms deadline (generous bound)
        assert verdict.admitted and verdict.fail_open
        started = time.monotonic()
        results = await _every_call(state)  # the circuit is open: nothing is even tried
        assert time.monotonic() - started < 0.1
        assert results[0].admitted and results[4] is None and results[6] == []
        assert _fail_open_count("admit") >= before + 2
    finally:
        process.send_signal(18)  # SIGCONT
    await asyncio.sleep(0.6)  # the cooldown passes: Redis is asked again
    assert (await state.admit([rpm(0)])).refused is not None
    await state.close()


async def test_stopped_redis_fails_open_and_publish_sync_does_not_raise(private_redis: tuple[str, Any]) -> None:
    url, process = private_redis
    process.kill()
    process.wait()
    state = RedisState(url, prefix="t:", timeout=0.05, cooldown=0.5)
    results = await _every_call(state)
    assert results[0].admitted and results[0].fail_open
    state.publish_sync("c", "m")
    await state.close()


_STEP = st.tuples(st.sampled_from(["rpm", "tpm", "budget", "lease", "release", "add"]), st.integers(0, 40),
                  st.integers(0, 4))


@settings(max_examples=25, deadline=None)
@given(st.lists(_STEP, max_size=25))
def test_redis_and_memory_answer_alike(steps: list[tuple[str, int, int]]) -> None:
    """Any sequence of admissions, corrections, lease takes and releases and clock moves gets the same
    verdicts from both implementations (the memory fallback is no weaker than Redis)."""

    async def run(state: SharedState, clock: Clock) -> list[Any]:
        windows = {"rpm": Window("k:rpm", 60, 3), "tpm": Window("k:tpm", 60, 50, cost=10),
                   "budget": Window("k:day", 86400, 40, cost=15, strict=False, sliding=False, bucket="d",
                                    reset_at=clock.now + 86400)}
        leases = [Lease("k:c", 2, ttl=30, holder=f"h{n}") for n in range(5)]
        seen: list[Any] = []
        for op, seconds, n in steps:
            clock.now += seconds
            if op in windows:
                verdict = await state.admit([windows[op]])
                seen.append((verdict.admitted, [u.used for u in verdict.usage]))
            elif op == "lease":
                seen.append((await state.admit([], [leases[n]])).held)
            elif op == "release":
                await state.release([leases[n]])
            else:
                await state.add([(windows["tpm"], n * 7 - 10)])
        await state.close()
        return seen

    start = 1_800_000_000.0
    memory_clock, redis_clock = Clock(start), Clock(start)
    memory = asyncio.run(run(MemoryState(clock=memory_clock), memory_clock))
    shared = asyncio.run(run(RedisState(REDIS_URL, prefix=f"test:{uuid.uuid4().hex}:", clock=redis_clock,
                                        timeout=1.0), redis_clock))
    assert memory == shared
