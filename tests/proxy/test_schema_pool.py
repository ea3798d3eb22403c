"""The validation pool (issue 15, item 1): real worker processes, killed at their deadline; the event
loop keeps running while they work; the guarded path turns a killed validation into a finding."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.guard.checks.request import RequestInvalid, prepare
from proxy.guard.checks.schema_bounds import SchemaBounds
from proxy.guard.checks.validate import DEFAULT_CACHE_BYTES, Offloaded, _schema_key, cached_schema, configure_cache
from proxy.guard.decisions.attempt import AttemptGuard
from proxy.guard.events import Done, Pending
from proxy.guard.findings import FindingKind
from proxy.guard.policy import GuardPolicy
from proxy.relay import schema_pool
from tests.proxy.guard.test_schema_bounds import body, hostile, sse

#: Every branch of every level fails: validation explores all 2^15 paths (seconds, issue 15).
UNSATISFIABLE = {"type": "string", "not": {"type": "string"}}


@pytest.fixture(autouse=True)
def _pool(settings: Any) -> Iterator[None]:
    settings.SCHEMA_VALIDATION_DEADLINE_SECONDS = 0.5
    settings.SCHEMA_POOL_WORKERS = 1
    schema_pool.shutdown()
    yield
    schema_pool.shutdown()


def check(schema: dict[str, Any], arguments: str) -> Offloaded:
    return Offloaded("t0", _schema_key(schema), arguments, float("inf"))


async def _probe(stop: asyncio.Event) -> float:
    """The longest the event loop was away while ``stop`` was unset (seconds)."""
    worst, last = 0.0, time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        worst, last = max(worst, now - last), now
    return worst


async def test_a_validation_past_its_deadline_is_killed_and_the_loop_never_waits() -> None:
    await schema_pool.verdict(check({"type": "object"}, "{}"))  # the worker is up (forkserver start)
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe(stop))
    started = time.monotonic()
    verdict = await schema_pool.verdict(check(hostile(15, UNSATISFIABLE), '{"x":"a"}'))
    took = time.monotonic() - started
    stop.set()
    assert verdict.kind == "unfinished" and "longer than 0.5 s" in verdict.text
    assert took < 5.0  # the deadline, and the worker's replacement; never the 3+ s of the validation
    assert await probe < 0.25  # generous: the loop ran every 10 ms throughout
    # The killed worker was replaced: the pool still answers.
    assert (await schema_pool.verdict(check(hostile(3), '{"x":1}'))).kind == "violation"
    assert (await schema_pool.verdict(check(hostile(3), '{"x":"a"}'))).kind == "valid"


async def test_checks_of_one_turn_run_together(settings: Any) -> None:
    settings.SCHEMA_POOL_WORKERS = 2
    schema_pool.shutdown()
    checks = (check(hostile(10), '{"x":"a"}'), check(hostile(10), '{"x":2}'))
    verdicts = await schema_pool.verdicts(checks)
    assert [verdicts[(c.schema, c.arguments)].kind for c in checks] == ["valid", "violation"]


async def test_the_guarded_path_turns_a_killed_validation_into_a_retry_finding() -> None:
    request = prepare(body(hostile(15, UNSATISFIABLE)), bounds=SchemaBounds(max_refs=10**9, max_cost=10**9)).spec
    guard = AttemptGuard(request, GuardPolicy())
    guard.feed(sse("t0", '{"x":"a"}'))
    events = await schema_pool.finish(guard)
    done = events[-1]
    assert isinstance(done, Done) and not done.decision.usable
    kinds = [f.kind for f in done.decision.findings if f.fatal]
    assert kinds == [FindingKind.SCHEMA_VALIDATION_UNFINISHED]


async def test_the_guarded_path_delivers_a_costly_valid_call() -> None:
    request = prepare(body(hostile(12)), bounds=SchemaBounds(max_refs=10**9)).spec
    assert request.inline_cost < 16_383 * 2  # this call is over the inline budget: validated in the pool
    guard = AttemptGuard(request, GuardPolicy())
    guard.feed(sse("t0", json.dumps({"x": "fine"})))
    done = (await schema_pool.finish(guard))[-1]
    assert isinstance(done, Done) and done.decision.usable


def big(properties: int, **extra: Any) -> dict[str, Any]:
    """A plain but large schema: ``properties`` string properties (2020-12 unless ``$schema`` says)."""
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(properties)}, **extra}


async def test_a_large_new_schema_is_checked_in_the_pool_then_cached() -> None:
    schema = big(1_000, **{"$schema": "http://json-schema.org/draft-07/schema#"})
    request = prepare(body(schema))
    assert [(name, position) for name, position, _ in request.unchecked] == [("t0", 0)]
    assert cached_schema(schema) is None  # nothing compiled on the event loop
    await schema_pool.check_schemas(request)
    compiled = cached_schema(schema)
    assert compiled is not None and compiled.validator is not None
    assert prepare(body(schema)).unchecked == ()  # cached now: nothing left to check


async def test_a_schema_check_past_the_deadline_is_a_400_naming_the_check() -> None:
    request = prepare(body({"type": "object"}, big(4_900)))  # 9,801 values, ~0.4 ms each against 2020-12's metaschema
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe(stop))
    with pytest.raises(RequestInvalid) as caught:
        await schema_pool.check_schemas(request)
    stop.set()
    assert caught.value.param == "tools[1].function.parameters" and caught.value.code == "tool_schema_too_complex"
    assert "(check: checking it against its metaschema took longer than 0.5 s" in caught.value.message
    assert await probe < 0.25


async def test_an_evicted_large_schema_is_validated_in_the_pool_not_compiled_inline() -> None:
    schema = big(1_000, **{"$schema": "http://json-schema.org/draft-07/schema#"})
    request = prepare(body(schema))
    await schema_pool.check_schemas(request)
    configure_cache(DEFAULT_CACHE_BYTES)  # evicted (another request's schemas, a small cache)
    guard = AttemptGuard(request.spec, GuardPolicy())
    guard.feed(sse("t0", json.dumps({"p1": 5})))
    final = guard.finish()
    assert isinstance(final[-1], Pending) and final[-1].checks[0].estimate == float("inf")
    assert cached_schema(schema) is None
    guard2 = AttemptGuard(request.spec, GuardPolicy())
    guard2.feed(sse("t0", json.dumps({"p1": 5})))
    done = (await schema_pool.finish(guard2))[-1]
    assert isinstance(done, Done) and not done.decision.usable
    assert [f.kind for f in done.decision.findings if f.fatal] == [FindingKind.SCHEMA_VIOLATION]
