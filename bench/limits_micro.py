"""What the limits cost one request, piece by piece, against a real Redis (issue 19's budget: the limits
add at most 0.3 ms to TTFT p50).

``.venv/bin/python bench/limits_micro.py [--redis URL] [--calls N]`` (default ``redis://127.0.0.1:6379/0``,
keys under a fresh prefix, deleted at the end) prints, for the limits of ``make bench``'s limits phase (every
limit on the tenant, money budgets on its member, rpm / tpm / concurrency and money on the key, a price on
every model):

- the Redis round trips of one request at admission and at settle (counted at the connection: a
  pipeline or a script call is one);
- microseconds per request (median of 5 runs of N) of ``admit`` and of ``settle`` with Redis (and the
  microseconds Redis itself spent per script call, from its ``INFO commandstats``), the same
  against the in-process twin (``MemoryState``: the Python around the round trip), one bare ``PING``
  through the same client (the floor of a round trip from asyncio), and the money reservation's price.

No server, no HTTP: the part of the request path that is the limits' own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

import redis.asyncio.connection  # noqa: E402

from billing import book  # noqa: E402
from billing.cost import Price  # noqa: E402
from infra.shared_state import MemoryState, RedisState, SharedState  # noqa: E402
from proxy.policy import limits  # noqa: E402
from tenants.limits import Limits  # noqa: E402

BIG = 10**9
MONEY = {"daily_usd": float(BIG), "weekly_usd": float(BIG), "monthly_usd": float(BIG)}
TENANT = Limits(rpm=BIG, tpm=BIG, concurrency=100_000, daily_tokens=BIG, monthly_tokens=BIG, **MONEY)
MEMBER = Limits(**MONEY)
KEY = Limits(rpm=BIG, tpm=BIG, concurrency=100_000, **MONEY)

#: Round trips sent on any redis-py asyncio connection (a pipeline or a script call is one).
sent = 0
_send = redis.asyncio.connection.AbstractConnection.send_packed_command


async def _counting_send(self: Any, command: Any, check_health: bool = True) -> None:
    global sent
    sent += 1
    await _send(self, command, check_health)


redis.asyncio.connection.AbstractConnection.send_packed_command = _counting_send  # type: ignore[method-assign]


class _Target:
    model, name = "bench-model", "bench-upstream"


async def one(state: SharedState) -> tuple[limits.Admission, int, int]:
    """One request's admission and settle; the round trips each made."""
    global sent
    before = sent
    admission = await limits.admit((1, 2, TENANT, KEY), estimate=900, state=state, reserve_usd=0.0012,
                                   member=(3, MEMBER))
    admitted = sent - before
    before = sent
    await admission.settle(1000, tenant="bench", usd=0.0011)
    return admission, admitted, sent - before


async def per_call(run: Callable[[], Awaitable[object]], calls: int) -> float:
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            await run()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


async def main(url: str, calls: int) -> None:
    book.reset(book.PriceBook((Price(model="*", input=1.0, output=2.0),), loaded=time.monotonic()))
    prefix = f"bench-limits-{uuid.uuid4().hex[:8]}:"
    redis_state = RedisState(url, prefix=prefix, timeout=1.0)
    memory = MemoryState()
    try:
        await one(redis_state)  # connect, load the scripts
        _, admitted, settled = await one(redis_state)
        print(f"round trips per request: admission {admitted}, settle {settled}")
        admissions: list[limits.Admission] = []

        async def admit_only(state: SharedState) -> None:
            admissions.append(await limits.admit((1, 2, TENANT, KEY), estimate=900, state=state,
                                                 reserve_usd=0.0012, member=(3, MEMBER)))

        async def settle_only() -> None:
            await admissions.pop().settle(1000, tenant="bench", usd=0.0011)

        client = redis_state._client()  # noqa: SLF001 - the same client and pool as the state's calls
        before = await _script_stats(client)
        rows = []
        for label, state in (("redis", redis_state), ("memory", memory)):
            rows.append((f"admit ({label})", await per_call(lambda s=state: admit_only(s), calls)))
            admissions.reverse()
            rows.append((f"settle ({label})", await per_call(settle_only, calls)))
            admissions.clear()
            if label == "redis":
                calls_made, usec = (a - b for a, b in zip(await _script_stats(client), before, strict=True))
                rows.append(("  of which in Redis, per script call", usec / max(1, calls_made)))
        rows.append(("PING (redis-py asyncio, wait_for)", await per_call(
            lambda: asyncio.wait_for(client.ping(), timeout=1.0), calls)))
        body = {"model": "bench-model", "max_tokens": 1024}
        rows.append(("reservation_usd", await per_call(
            lambda: _sync(limits.reservation_usd, _Target(), body, 900), calls)))
        for label, us in rows:
            print(f"{label:40s} {us:8.1f} us")
    finally:
        async for key in redis_state._client().scan_iter(match=prefix + "*"):  # noqa: SLF001
            await redis_state._client().delete(key)  # noqa: SLF001
        await redis_state.close()


async def _script_stats(client: Any) -> tuple[int, int]:
    """EVALSHA calls and microseconds spent in them, from the server's INFO (every client's)."""
    stats = (await client.info("commandstats")).get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


async def _sync(fn: Callable[..., object], *args: object) -> object:
    return fn(*args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(main(args.redis, args.calls))
