"""Validation of costly tool calls off the event loop, in worker processes killed at their deadline.

The guard core validates a tool call inline when its estimated cost (the schema's static cost x the
JSON values of the arguments, ``proxy.guard.checks.schema_bounds``) is within ``SCHEMA_INLINE_COST``; above
it, ``AttemptGuard.finish()`` returns ``Pending`` checks and the paths hand them here. Each check runs
in a ``pebble.ProcessPool`` worker (a ``forkserver`` context: no fork of Daphne's threads), awaited
with ``asyncio.wrap_future`` so the event loop never waits on it. A worker still busy at
``SCHEMA_VALIDATION_DEADLINE_SECONDS`` is terminated by pebble and replaced (a thread could not be
stopped); its check gets an ``unfinished`` verdict, which the guard turns into a fatal
``SCHEMA_VALIDATION_UNFINISHED`` finding (the attempt is retried or the request fails, per policy).
At most ``SCHEMA_POOL_WORKERS`` checks run at once, process-wide; a check waiting for a worker longer
than its deadline is unfinished too, so a burst cannot queue work without bound.

Schemas too large to check against their metaschema on the event loop (``ChatRequest.unchecked``) are
checked here too, before any upstream call (``check_schemas``; past the deadline: a 400).

Also here: ``schema_bounds()``, the ``SchemaBounds`` of the settings, and the byte bound of the
compiled-schema cache (applied when the bounds are first read).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from django.conf import settings
from pebble import ProcessPool

from proxy.guard.checks.request import ChatRequest, schema_refused
from proxy.guard.checks.schema_bounds import SchemaBounds
from proxy.guard.checks.validate import (
    Offloaded,
    Verdict,
    compile_schema,
    configure_cache,
    offloaded_verdict,
    schema_check,
)
from proxy.guard.decisions.attempt import AttemptGuard
from proxy.guard.events import Done, Event, Pending
from proxy.guard.turn import Decision
from proxy.upstreams import shares

T = TypeVar("T")

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
            max_cost=settings.SCHEMA_MAX_COST, inline_cost=settings.SCHEMA_INLINE_COST,
            inline_check_nodes=settings.SCHEMA_INLINE_CHECK_NODES, max_request_cost=settings.SCHEMA_MAX_REQUEST_COST)
    return _bounds


def _worker_start(cache_bytes: int) -> None:
    """A worker process's start: its own compiled-schema cache, bounded like the server's."""
    configure_cache(cache_bytes)


def _noop() -> None:
    """A task that makes the pool start its workers."""


def pool() -> ProcessPool:
    """The process-wide validation pool, started on first use (``SCHEMA_POOL_WORKERS`` processes).

    Blocking the first time (the fork server and the workers start, ~0.5 s): call it from a thread
    (``_run`` does). Workers fork from a server that has imported the validator, so a killed worker's
    replacement starts in milliseconds."""
    global _pool
    with _lock:
        if _pool is None or not _pool.active:
            context: Any = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["proxy.guard.checks.validate"])
            _pool = ProcessPool(max_workers=settings.SCHEMA_POOL_WORKERS, context=context,
                                initializer=_worker_start, initargs=(settings.SCHEMA_CACHE_BYTES,))
            _pool.schedule(_noop)  # starts the workers here, not on the caller's next schedule
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


async def _run(fn: Callable[..., T], *args: Any) -> T | str:
    """``fn(*args)`` in a pool worker: its result, or why there is none (a phrase: "took longer than
    2 s and was stopped", "could not run: ..."). Killed past
    ``SCHEMA_VALIDATION_DEADLINE_SECONDS`` of running; given up past twice that of waiting for a
    worker. A tenant has at most ``SCHEMA_POOL_TENANT_SHARE`` checks in the pool at once (its others
    wait their turn, within the same bound), so one tenant's flood of fresh schemas never holds every
    worker (issue 24 item 3). Never raises (except ``CancelledError``, after cancelling the task)."""
    deadline = settings.SCHEMA_VALIDATION_DEADLINE_SECONDS
    tenant = shares.current_tenant()
    if tenant is None:
        return await _scheduled(fn, args, deadline)
    slots = shares.SHARES.slots("pool", tenant, settings.SCHEMA_POOL_TENANT_SHARE)
    started = time.monotonic()
    if not await slots.acquire(2 * deadline):
        return f"took longer than {deadline:g} s and was stopped (waiting for this tenant's share of the pool)"
    try:
        return await _scheduled(fn, args, deadline, waited=time.monotonic() - started)
    finally:
        slots.release()


async def _scheduled(fn: Callable[..., T], args: tuple[Any, ...], deadline: float, *, waited: float = 0.0) -> T | str:
    """``fn(*args)`` scheduled in the pool with ``deadline`` (``_run``); ``waited`` seconds already spent."""
    try:
        running = _pool if _pool is not None and _pool.active else await asyncio.to_thread(pool)
        future = running.schedule(fn, args=args, timeout=deadline)
    except Exception as exc:  # noqa: BLE001 -- a pool that cannot start: no result, never a crash
        return f"could not run: the validation pool is unavailable ({type(exc).__name__})"
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout=max(deadline, 2 * deadline - waited))
    except (FutureTimeout, TimeoutError):
        future.cancel()  # type: ignore[no-untyped-call]  # queued: never runs; running: killed
        return f"took longer than {deadline:g} s and was stopped"
    except asyncio.CancelledError:
        future.cancel()  # type: ignore[no-untyped-call]
        raise
    except Exception as exc:  # noqa: BLE001 -- the worker died (ProcessExpired) or could not run it
        return f"could not run: the validation worker failed ({type(exc).__name__})"


async def verdict(check: Offloaded) -> Verdict:
    """The verdict of one check from a pool worker (``_run``'s bounds), ``unfinished`` without one."""
    result = await _run(offloaded_verdict, check.schema, check.arguments)
    if isinstance(result, Verdict):
        return result
    return Verdict("unfinished", f"validation {result}" if isinstance(result, str) else "validation gave no verdict")


async def check_schemas(request: ChatRequest) -> None:
    """Check the request's schemas too large to check on the event loop (``ChatRequest.unchecked``)
    against their metaschemas in the pool, at once, and compile them into this process's cache;
    ``RequestInvalid`` (the ``check`` bound) for a schema whose check did not finish in time."""
    if not request.unchecked:
        return
    results = await asyncio.gather(*(_run(schema_check, key) for _, _, key in request.unchecked))
    for (name, position, key), result in zip(request.unchecked, results, strict=True):
        if not isinstance(result, tuple):
            raise schema_refused(name, position, "check", f"checking it against its metaschema {result}")
        compile_schema(json.loads(key), result)


async def verdicts(checks: tuple[Offloaded, ...]) -> dict[tuple[str, str], Verdict]:
    """The verdicts of ``checks`` (run at once, each bounded as ``verdict``), by ``(schema, arguments)``."""
    results = await asyncio.gather(*(verdict(c) for c in checks))
    return {(c.schema, c.arguments): v for c, v in zip(checks, results, strict=True)}


async def finish(guard: AttemptGuard) -> list[Event]:
    """``guard.finish()``'s events, ending with ``Done``: ``Pending`` checks are run in the pool (the
    ``Pending`` events themselves are not returned)."""
    events: list[Event] = []
    for round_ in range(3):
        final = guard.finish()
        last = final[-1]
        events.extend(final[:-1])
        if not isinstance(last, Pending):
            events.append(last)
            return events
        if round_ < 2:
            guard.supply(await verdicts(last.checks))
        else:  # the same checks asked again: never loop, the calls count as unvalidated
            guard.supply({(c.schema, c.arguments): Verdict("unfinished", "validation gave no verdict")
                          for c in last.checks})
    final = guard.finish()
    events.extend(e for e in final if not isinstance(e, Pending))
    return events


async def decision(guard: AttemptGuard | Decision) -> Decision:
    """The decision of a guard that has read a whole answer (``completion_guard``), or ``guard`` itself
    when it already is one; pending checks run in the pool."""
    if isinstance(guard, Decision):
        return guard
    done = (await finish(guard))[-1]
    assert isinstance(done, Done)
    return done.decision
