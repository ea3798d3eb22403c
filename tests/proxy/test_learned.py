"""Upstreams that configure themselves: a parameter refusal absorbed by one re-ask, the fix remembered
(in the process, in the database through the journal, in the principal, in Redis), the next request
sent right the first time. The relay runs against a scripted upstream (MockTransport at the HTTP seam);
Postgres and Redis are real."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from audit.models import Attempt, Finding, ProxyRequest
from audit.services import Batch, journal_batch_write
from proxy.guard.checks.request import prepare
from proxy.guard.protocols.emit_openai import OpenAIChatEmitter
from proxy.relay.loop import RelayCall
from proxy.upstreams.client import UpstreamClient
from proxy.upstreams.learned import LearnedLimits, RedisShare
from proxy.upstreams.refusals import Fix
from tenants import last_good
from tenants.auth import principal_for_key
from tenants.learned import LearnedFact
from tenants.models import UpstreamLearnedLimit
from tenants.services import provision
from tests.proxy.test_relay import CALL, DONE, FINISH_CALLS, TEXT, TOOLS, run

pytestmark = pytest.mark.django_db(transaction=True)

DEEPSEEK = {"error": {"message": "Invalid max_tokens value, the valid range of max_tokens is [1, 8192]",
                      "type": "invalid_request_error", "param": None, "code": "invalid_request_error"}}
TURN = [(0, TEXT("ok")), (0, CALL), (0, FINISH_CALLS), (0, DONE)]


def refusal(body: dict[str, Any], status: int = 400) -> httpx.Response:
    return httpx.Response(status, headers={"content-type": "application/json"},
                          stream=httpx.ByteStream(json.dumps(body).encode()))


def scripted(*answers: Any, seen: list[dict[str, Any]]) -> UpstreamClient:
    """A client whose k-th call answers ``answers[k]`` (a Response or a list of frames); bodies go to ``seen``."""
    calls = iter(answers)

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        answer = next(calls)
        if isinstance(answer, httpx.Response):
            return answer

        async def frames() -> AsyncIterator[bytes]:
            for _, data in answer:
                yield data

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=frames())

    return UpstreamClient(transport=httpx.MockTransport(handler))


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def tenant() -> Any:
    return provision(tenant_name=f"learned-{time.monotonic_ns()}", upstream_url="http://upstream.test/v1",
                     upstream_key="sk-learned-upstream-0001")


@pytest.fixture
def make_call(tenant: Any) -> Callable[..., RelayCall]:
    def make(*, max_tokens: int = 32000, model: str = "deepseek-chat", **extra: Any) -> RelayCall:
        principal = principal_for_key(tenant.raw_key or "", refresh=True)
        assert principal is not None
        plan = principal.resolve(model)
        assert plan is not None
        body = {"model": model, "stream": True, "max_tokens": max_tokens, "tools": TOOLS,
                "messages": [{"role": "user", "content": "hi"}], **extra}
        return RelayCall(principal=principal, plan=plan, request=prepare(body),
                         emitter=OpenAIChatEmitter(model=model, include_usage=False))

    return make


# ----- the store -----

NOW = time.time()


def fact(parameter: str = "max_tokens", limit: int | None = 8192, *, at: float = 100.0, ttl: float = 3600,
         model: str = "m") -> LearnedFact:
    """A fact learned ``at`` seconds after a fixed recent moment, holding ``ttl`` seconds."""
    return LearnedFact(1, model, parameter, limit, NOW + at, NOW + at + ttl)


def test_the_fact_learned_last_wins_and_a_tombstone_stays() -> None:
    store = LearnedLimits()
    store.absorb([fact(limit=8192, at=100)])
    store.absorb([fact(limit=4096, at=50)])
    assert store.fixes(1, "m") == (Fix("max_tokens", 8192),)
    store.absorb([LearnedFact(1, "m", "max_tokens", 8192, NOW + 200, NOW - 1)])  # forgotten later (expired now)
    assert store.fixes(1, "m") == ()
    store.absorb([fact(limit=8192, at=150)])  # an older copy cannot bring it back
    assert store.fixes(1, "m") == ()


def test_facts_apply_per_model_and_expire() -> None:
    store = LearnedLimits()
    store.learn(1, "a", Fix("max_tokens", 8192), ttl=60)
    store.learn(1, "b", Fix("stream_options"), ttl=-1)
    assert store.fixes(1, "a") == (Fix("max_tokens", 8192),)
    assert store.fixes(1, "b") == () and store.fixes(2, "a") == ()


def test_facts_a_principal_carries_are_merged_once_per_tuple() -> None:
    store = LearnedLimits()
    carried = (fact(limit=8192),)
    assert store.fixes(1, "m", carried) == (Fix("max_tokens", 8192),)
    store.absorb([fact(limit=1000, at=300)])
    assert store.fixes(1, "m", carried) == (Fix("max_tokens", 1000),), "the same tuple is not merged again"


def test_a_fact_survives_json() -> None:
    one = fact(parameter="tool_choice=required", limit=None)
    assert LearnedFact.from_json(one.to_json()) == one
    assert LearnedFact.from_json("not json") is None and LearnedFact.from_json({"model": "m"}) is None


def test_last_good_keeps_the_learned_limits_of_a_principal(tenant: Any) -> None:
    UpstreamLearnedLimit.objects.create(upstream=tenant.upstream, model="deepseek-chat", parameter="max_tokens",
                                        value=8192, expires_at=timezone.now() + timedelta(days=7))
    principal = principal_for_key(tenant.raw_key or "", refresh=True)
    assert principal is not None and principal.default_target is not None
    assert [(f.parameter, f.limit) for f in principal.default_target.learned] == [("max_tokens", 8192)]
    assert last_good.loads(last_good.dumps(principal)) == principal


# ----- the relay: one 400 absorbed, the fact remembered, the next request right -----

async def test_a_deepseek_budget_refusal_is_absorbed_remembered_and_not_repeated(make_call: Any, tenant: Any) -> None:
    seen: list[dict[str, Any]] = []
    client = scripted(refusal(DEEPSEEK), TURN, TURN, seen=seen)
    recorder, response = await run(await sync_to_async(make_call)(), client)
    assert recorder.status == 200 and recorder.tool_names() == ["get_weather"], "the client sees its answer"
    assert [b["max_tokens"] for b in seen] == [32000, 8192]
    attempts = await sync_to_async(list)(Attempt.objects.filter(request_id=response.request_id).order_by("number"))
    assert [(a.upstream_status, a.outcome) for a in attempts] == [(400, "upstream-error"), (200, "normalized")]
    finding = await sync_to_async(Finding.objects.get)(attempt=attempts[0])
    assert finding.kind == "upstream-parameter-refused" and "max_tokens <= 8192 (remembered)" in finding.detail
    assert "valid range of max_tokens is [1, 8192]" in finding.detail

    await run(await sync_to_async(make_call)(), client)
    assert [b["max_tokens"] for b in seen] == [32000, 8192, 8192], "the next request goes right the first time"
    row = await sync_to_async(UpstreamLearnedLimit.objects.get)(upstream=tenant.upstream)
    assert (row.model, row.parameter, row.value) == ("deepseek-chat", "max_tokens", 8192)
    assert timedelta(days=6) < row.expires_at - timezone.now() <= timedelta(days=7)


async def test_another_process_learns_it_from_the_principal(make_call: Any) -> None:
    seen: list[dict[str, Any]] = []
    await run(await sync_to_async(make_call)(), scripted(refusal(DEEPSEEK), TURN, seen=seen))
    fresh: list[dict[str, Any]] = []
    await run(await sync_to_async(make_call)(), scripted(TURN, seen=fresh))  # a new client: another process
    assert [b["max_tokens"] for b in fresh] == [8192]


async def test_a_window_shared_with_the_prompt_is_fixed_for_that_request_only(make_call: Any) -> None:
    window = {"object": "error", "message": "This model's maximum context length is 16384 tokens. However, you "
              "requested 32100 tokens (100 in the messages, 32000 in the completion). Please reduce the length "
              "of the messages or completion.", "type": "BadRequestError", "param": None, "code": 400}
    seen: list[dict[str, Any]] = []
    client = scripted(refusal(window), TURN, refusal(window), TURN, seen=seen)
    await run(await sync_to_async(make_call)(), client)
    await run(await sync_to_async(make_call)(), client)
    assert [b["max_tokens"] for b in seen] == [32000, 16284, 32000, 16284]
    assert not await sync_to_async(UpstreamLearnedLimit.objects.exists)()


async def test_an_unknown_refusal_reaches_the_client_as_before(make_call: Any) -> None:
    seen: list[dict[str, Any]] = []
    unknown = {"error": {"message": "Bad request: something else", "type": "invalid_request_error"}}
    recorder, response = await run(await sync_to_async(make_call)(), scripted(refusal(unknown), seen=seen))
    assert recorder.status == 400 and b"something else" in recorder.body
    assert len(seen) == 1
    row = await sync_to_async(ProxyRequest.objects.get)(id=response.request_id)
    assert row.outcome == "upstream-error"


async def test_a_fix_that_does_not_help_ends_with_the_second_answer(make_call: Any) -> None:
    seen: list[dict[str, Any]] = []
    other = {"error": {"message": "tools param requires --jinja flag", "type": "server_error", "code": 400}}
    recorder, _ = await run(await sync_to_async(make_call)(), scripted(refusal(DEEPSEEK), refusal(other), seen=seen))
    assert recorder.status == 400 and b"--jinja" in recorder.body
    assert [b["max_tokens"] for b in seen] == [32000, 8192]


async def test_two_refusals_of_one_request_are_both_fixed(make_call: Any) -> None:
    seen: list[dict[str, Any]] = []
    choice = {"error": {"message": "deepseek-reasoner does not support this tool_choice",
                        "type": "invalid_request_error"}}
    recorder, _ = await run(await sync_to_async(make_call)(tool_choice="required"),
                            scripted(refusal(DEEPSEEK), refusal(choice), TURN, seen=seen))
    assert recorder.status == 200
    assert [(b["max_tokens"], b.get("tool_choice")) for b in seen] == [(32000, "required"), (8192, "required"),
                                                                       (8192, None)]


# ----- the journal writer and the admin's edits -----

def _learned_record(upstream_id: int, limit: int | None, at: float) -> dict[str, Any]:
    return {"t": "learned", "fact": {"upstream_id": upstream_id, "model": "m", "parameter": "max_tokens",
                                     "limit": limit, "learned_at": at, "expires_at": at + 3600, "detail": "x"}}


def test_the_writer_keeps_the_fact_learned_last_and_a_later_admin_edit(tenant: Any) -> None:
    upstream_id = tenant.upstream.pk
    now = time.time()
    journal_batch_write(Batch.of([_learned_record(upstream_id, 8192, now - 10), _learned_record(upstream_id, 4096,
                                                                                                now - 20)]))
    row = UpstreamLearnedLimit.objects.get(upstream_id=upstream_id)
    assert row.value == 8192
    row.value, row.learned_at = 16000, timezone.now()  # an admin raised it
    row.save()
    journal_batch_write(Batch.of([_learned_record(upstream_id, 8192, now - 5)]))  # learned before the edit
    assert UpstreamLearnedLimit.objects.get(upstream_id=upstream_id).value == 16000
    journal_batch_write(Batch.of([_learned_record(upstream_id, 8000, time.time() + 1)]))
    assert UpstreamLearnedLimit.objects.get(upstream_id=upstream_id).value == 8000


def test_the_writer_drops_facts_of_deleted_upstreams(tenant: Any) -> None:
    journal_batch_write(Batch.of([_learned_record(10**9, 8192, time.time())]))
    assert not UpstreamLearnedLimit.objects.exists()


# ----- Redis -----

@pytest.fixture
def redis_url() -> str:
    import redis

    url = "redis://127.0.0.1:6379/13"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).flushdb()
    except redis.exceptions.ConnectionError:
        pytest.fail("Redis on 127.0.0.1:6379 is needed for these tests")
    return url


async def test_processes_share_facts_through_redis(redis_url: str) -> None:
    one, other = RedisShare(redis_url), RedisShare(redis_url)
    learned = LearnedLimits().learn(7, "m", Fix("max_tokens", 8192), ttl=60)
    await one.publish(learned)
    await one.publish(dataclasses.replace(learned, limit=1, learned_at=learned.learned_at - 1))  # older: kept out
    store = LearnedLimits()
    store.absorb(await other.pull())
    assert store.fixes(7, "m") == (Fix("max_tokens", 8192),)
    await one.aclose()
    await other.aclose()


async def test_an_unreachable_redis_is_no_failure() -> None:
    share = RedisShare("redis://127.0.0.1:9/0")
    await share.publish(fact())
    assert await share.pull() == []
    await share.aclose()


async def test_a_sibling_client_follows_what_another_learned_through_redis(make_call: Any, redis_url: str,
                                                                          settings: Any) -> None:
    """With REDIS_URL, a process that never saw the refusal (and whose principal predates it) sends the
    fixed body within the sync interval."""
    settings.REDIS_URL, settings.UPSTREAM_LEARNED_SYNC_SECONDS = redis_url, 0.05
    before = await sync_to_async(make_call)()  # the sibling's principal: read before anything was learned
    seen_a: list[dict[str, Any]] = []
    seen_b: list[dict[str, Any]] = []
    client_a, client_b = scripted(refusal(DEEPSEEK), TURN, seen=seen_a), scripted(TURN, TURN, seen=seen_b)
    await run(before, client_b)  # the sibling's first request: it starts following Redis
    await run(await sync_to_async(make_call)(), client_a)
    target = before.plan.target(0)
    for _ in range(100):
        if client_b.learned.fixes(target.upstream_id, target.model):
            break
        await asyncio.sleep(0.02)
    await run(before, client_b)
    assert [b["max_tokens"] for b in seen_a] == [32000, 8192]
    assert [b["max_tokens"] for b in seen_b] == [32000, 8192], "the second request went right the first time"
    await client_a.aclose()
    await client_b.aclose()
    # With REDIS_URL the relay's shared state (limits, retry budget, loop breaker) opened a Redis client on
    # this test's event loop too: close it here, while the loop runs.
    from infra.shared_state import get_state

    await get_state().close()
