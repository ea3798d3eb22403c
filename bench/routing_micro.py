"""What the routing choice costs per request on the event loop (issue 21's budget: key, health and
affinity choice add at most 0.2 ms to TTFT p50).

``.venv/bin/python bench/routing_micro.py [--calls N]`` prints microseconds per call (median of 5 runs) of:

- ``choose``: ``infra.routing_quality.choose`` over two targets' rates (the pure choice by quality);
- ``choose_key``: ``infra.routing_health.choose_key`` over a 3-key pool;
- ``route-new``: ``Router.read`` + ``pick`` of a new session on a route of two targets with a 3-key pool
  each, ``prefer=quality``, over the in-process shared state (everything but the Redis round trip, which
  the request makes concurrently with the limits' own and which the rates' per-process copy skips);
- ``route-sticky``: the same for a session that already has its upstream and key;
- ``route-single``: ``Router.read`` + ``pick`` of a one-target, one-key route (the baseline).

No Redis, no server: a measure of the CPU the choice adds, not of a network round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from infra.routing_health import KeyState, choose_key  # noqa: E402
from infra.routing_quality import Rate, choose  # noqa: E402
from infra.shared_state import MemoryState  # noqa: E402
from proxy.guard.policy import GuardPolicy  # noqa: E402
from proxy.routing.router import Router  # noqa: E402
from tenants.principal import RoutePlan, UpstreamTarget  # noqa: E402


def target(upstream_id: int, keys: int) -> UpstreamTarget:
    pool = tuple((str(k), f"enc-{upstream_id}-{k}", 1) for k in range(keys))
    return UpstreamTarget(upstream_id=upstream_id, name=f"u{upstream_id}", base_url="http://u.test/v1", model="m",
                          credential_encrypted=pool[0][1], extra_headers_encrypted="", connect_timeout=1,
                          first_byte_timeout=1, idle_timeout=1, keys=pool if keys > 1 else (), key_id="0")


def per_call(run: Callable[[], object], calls: int) -> float:
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


async def per_call_async(run: Callable[[int], Awaitable[object]], calls: int) -> float:
    runs = []
    for r in range(5):
        start = time.perf_counter()
        for i in range(calls):
            await run(r * calls + i)
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


async def routed(calls: int) -> dict[str, float]:
    state = MemoryState()
    two = RoutePlan("m", 1, (target(1, 3), target(2, 3)), None, GuardPolicy(), prefer="quality")
    one = RoutePlan("m", 2, (target(3, 1),), None, GuardPolicy())

    async def new(i: int) -> object:
        router = await Router.read(two, state=state, session=f"h:{i:032x}")
        return router.pick(router.plan.targets[0])

    sticky = "h:" + "ab" * 16
    first = await Router.read(two, state=state, session=sticky)
    await first.delivered(first.pick(first.plan.targets[0]))

    async def kept(_: int) -> object:
        router = await Router.read(two, state=state, session=sticky)
        return router.pick(router.plan.targets[0])

    async def single(_: int) -> object:
        router = await Router.read(one, state=state)
        return router.pick(router.plan.targets[0])

    return {"route-new": await per_call_async(new, calls), "route-sticky": await per_call_async(kept, calls),
            "route-single": await per_call_async(single, calls)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20_000)
    calls = parser.parse_args().calls
    rates = [Rate(60, 100), Rate(5, 100)]
    keys = [("0", 1), ("1", 1), ("2", 1)]
    states = {"1": KeyState(until=2e9)}
    figures = {"choose": per_call(lambda: choose(rates, 0.5, 0.1), calls),
               "choose_key": per_call(lambda: choose_key(keys, states, 1.8e9, 0.5), calls)}
    figures.update(asyncio.run(routed(calls // 4)))
    for name, us in figures.items():
        print(f"{name:>14}: {us:7.2f} us per call")


if __name__ == "__main__":
    main()
