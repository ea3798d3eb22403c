"""Validation of costly tool calls off the event loop, in worker processes killed at their deadline.

The guard core validates a tool call inline when its estimated cost (the schema's static cost x the
JSON values of the arguments, ``proxy.guard.schema_bounds``) is within ``SCHEMA_INLINE_COST``; above
it, ``AttemptGuard.finish()`` returns ``Pending`` checks and the paths hand them here. Each check runs
in a ``pebble.ProcessPool`` worker (a ``forkserver`` context: no fork of Daphne's threads), awaited
with ``asyncio.wrap_future`` so the event loop never waits on it. A worker still busy at
``SCHEMA_VALIDATION_DEADLINE_SECONDS`` is terminated by pebble and replaced (a thread could not be
stopped); its check gets an ``unfinished`` verdict, which the guard turns into a fatal
``SCHEMA_VALIDATION_UNFINISHED`` finding (the attempt is retried or the request fails, per policy).
At most ``SCHEMA_POOL_WORKERS`` checks run at once, process-wide; a check waiting for a worker longer
than its deadline is unfinished too, so a burst cannot queue work without bound.

Also here: ``schema_bounds()``, the ``SchemaBounds`` of the settings, and the byte bound of the
compiled-schema cache (applied when the bounds are first read).
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from django.conf import settings
from pebble import ProcessPool

from proxy.guard.attempt import AttemptGuard
from proxy.guard.events import Done, Event, Pending
from proxy.guard.schema_bounds import SchemaBounds
from proxy.guard.turn import Decision
from proxy.guard.validate import Offloaded, Verdict, configure_cache, offloaded_verdict

_lock = threading.Lock()
_pool: ProcessPool | None = None
_bounds: SchemaBounds | None = None


def schema_bounds() -> SchemaBounds:
    """The schema bounds of the settings (``SCHEMA_*``, config/settings.py), read once per process; the
    first call also bounds the compiled-schema cache to ``SCHEMA_CACHE_BYTES``."""
    global _bounds
    if _bounds is None:
        configure_cache(settings.SCHEMA_CACHE_BYTES)
        _bounds = SchemaBounds(
            max_depth=settings.SCHEMA_MAX_DEPTH, max_bytes=settings.SCHEMA_MAX_BYTES,
            max_nodes=settings.SCHEMA_MAX_NODES, max_enum=settings.SCHEMA_MAX_ENUM,
            max_branches=settings.SCHEMA_MAX_BRANCHES, max_refs=settings.SCHEMA_MAX_REFS,
            max_cost=settings.SCHEMA_MAX_COST, inline_cost=settings.SCHEMA_INLINE_COST)
    return _bounds


def _worker_start(cache_bytes: int) -> None:
    """A worker process's start: its own compiled-schema cache, bounded like the server's."""
    configure_cache(cache_bytes)


def pool() -> ProcessPool:
    """The process-wide validation pool, started on first use (``SCHEMA_POOL_WORKERS`` processes)."""
    global _pool
    with _lock:
        if _pool is None or not _pool.active:
            context: Any = multiprocessing.get_context("forkserver")
            _pool = ProcessPool(max_workers=settings.SCHEMA_POOL_WORKERS, context=context,
                                initializer=_worker_start, initargs=(settings.SCHEMA_CACHE_BYTES,))
        return _pool


def shutdown() -> None:
    """Stop the pool's workers now (at exit, and in tests); the next check starts a new pool."""
    global _pool
    with _lock:
        running, _pool = _pool, None
    if running is not None:
        running.stop()  # type: ignore[no-untyped-call]
        running.join(timeout=5)


atexit.register(shutdown)


async def verdict(check: Offloaded) -> Verdict:
    """The verdict of one check from a pool worker, within ``SCHEMA_VALIDATION_DEADLINE_SECONDS`` of
    running (the worker is killed past it) and as long again of waiting for a worker: else
    ``unfinished``. Never raises (except ``CancelledError``, after cancelling the check)."""
    deadline = settings.SCHEMA_VALIDATION_DEADLINE_SECONDS
    try:
        future = pool().schedule(offloaded_verdict, args=(check.schema, check.arguments), timeout=deadline)
    except Exception as exc:  # noqa: BLE001 -- a pool that cannot start: no verdict, never a crash
        return Verdict("unfinished", f"the validation pool is unavailable ({type(exc).__name__})")
    try:
        result = await asyncio.wait_for(asyncio.wrap_future(future), timeout=2 * deadline)
    except (FutureTimeout, TimeoutError):
        future.cancel()  # type: ignore[no-untyped-call]  # queued: never runs; running: killed
        return Verdict("unfinished", f"validation took longer than {deadline:g} s and was stopped")
    except asyncio.CancelledError:
        future.cancel()  # type: ignore[no-untyped-call]
        raise
    except Exception as exc:  # noqa: BLE001 -- the worker died (ProcessExpired) or could not run it
        return Verdict("unfinished", f"the validation worker failed ({type(exc).__name__})")
    return result if isinstance(result, Verdict) else Verdict("unfinished", "the validation worker answered nothing")


async def verdicts(checks: tuple[Offloaded, ...]) -> dict[tuple[str, str], Verdict]:
    """The verdicts of ``checks`` (run at once, each bounded as ``verdict``), by ``(schema, arguments)``."""
    results = await asyncio.gather(*(verdict(c) for c in checks))
    return {(c.schema, c.arguments): v for c, v in zip(checks, results, strict=True)}


async def finish(guard: AttemptGuard) -> list[Event]:
    """``guard.finish()``'s events, ending with ``Done``: ``Pending`` checks are run in the pool (the
    ``Pending`` events themselves are not returned)."""
    events: list[Event] = []
    while True:
        final = guard.finish()
        last = final[-1]
        events.extend(final[:-1])
        if not isinstance(last, Pending):
            events.append(last)
            return events
        guard.supply(await verdicts(last.checks))


async def decision(guard: AttemptGuard | Decision) -> Decision:
    """The decision of a guard that has read a whole answer (``completion_guard``), or ``guard`` itself
    when it already is one; pending checks run in the pool."""
    if isinstance(guard, Decision):
        return guard
    done = (await finish(guard))[-1]
    assert isinstance(done, Done)
    return done.decision
