"""What the fair shares cost per request on the event loop (issue 24's budget: the fair shares and bounds
cost at most 0.2 ms TTFT p50 and 5% CPU per request).

``.venv/bin/python bench/shares_micro.py [--calls N]`` prints microseconds per request (median of 5 runs)
of what a guarded request does with ``proxy.upstreams.shares``: the tenant's share held around the relay,
the upstream's share held around each upstream call (``Shares.slots`` + ``Slots.acquire`` + ``release``,
both uncontended, as every request under its share is), against an empty awaited step (the baseline).
No server: a measure of the CPU the shares add, which is all they add (no shared state, no round trip).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.upstreams.shares import Shares  # noqa: E402


async def _baseline(shares: Shares, tenant: int) -> None:
    return None


async def _shared(shares: Shares, tenant: int) -> None:
    slots = shares.slots("tenant", tenant, 100)
    if not await slots.acquire(1.0):
        raise RuntimeError("no tenant slot")
    try:
        async with shares.held("upstream", 7, 500, wait=1.0, what="upstream"):
            pass
    finally:
        slots.release()


async def _per_call(step: object, calls: int) -> float:
    shares = Shares()
    started = time.perf_counter()
    for i in range(calls):
        await step(shares, i % 50)  # type: ignore[operator]
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    for name, step in (("baseline", _baseline), ("shares", _shared)):
        runs = [asyncio.run(_per_call(step, args.calls)) for _ in range(5)]
        print(f"{name:10} {statistics.median(runs):8.2f} us/request")


if __name__ == "__main__":
    main()
