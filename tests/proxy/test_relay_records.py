"""What the relay leaves behind besides the response: metrics labelled by route and upstream names, frame
counts per attempt, and what the client received (``ProxyRequest.delivered``), shown on the request page.

Against a scripted upstream (``httpx.MockTransport``) and the real database, as ``test_relay.py``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from prometheus_client import REGISTRY

from audit.models import Attempt, ProxyRequest
from proxy.guard.checks.request import prepare
from proxy.guard.policy import Exhaustion
from proxy.guard.protocols.emit_openai import OpenAIChatEmitter
from proxy.relay.loop import RelayCall
from tenants.auth import principal_for_key
from tenants.services import provision
from tests.proxy.test_relay import (  # noqa: F401 - _close_thread_connections is an autouse fixture
    BROKEN,
    CALL,
    DONE,
    FINISH_CALLS,
    SECRET,
    TEXT,
    TOOLS,
    _close_thread_connections,
    run,
    upstream,
)

pytestmark = pytest.mark.django_db(transaction=True)

ROUTE = "coder-route"


@pytest.fixture
def routed() -> Any:
    """A tenant with route ``coder-route`` to its upstream ``default`` (which also serves other names)."""
    done = provision(tenant_name="records-tests", upstream_url="http://upstream.test/v1", upstream_key=SECRET,
                     routes={ROUTE: "upstream-model"})
    principal = principal_for_key(done.raw_key or "")
    assert principal is not None

    def make(*, model: str = ROUTE, stream: bool = True, **policy: Any) -> RelayCall:
        plan = principal.resolve(model)
        assert plan is not None
        plan = dataclasses.replace(plan, policy=dataclasses.replace(plan.policy, **policy))
        body: dict[str, Any] = {"model": model, "stream": stream, "tools": TOOLS,
                                "messages": [{"role": "user", "content": "hi"}]}
        return RelayCall(principal=principal, plan=plan, request=prepare(body),
                         emitter=OpenAIChatEmitter(model=model, include_usage=False))

    make.slug = principal.slug  # type: ignore[attr-defined]
    return make


def answer(status: int, body: dict[str, Any]) -> httpx.Response:
    """A JSON answer the upstream client reads as a stream (as a real transport's)."""
    return httpx.Response(status, headers={"content-type": "application/json"},
                          stream=httpx.ByteStream(json.dumps(body).encode()))


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def usable(labels: dict[str, str]) -> float:
    return sum(sample("toolrelay_upstream_attempts_total", **labels, outcome=o) for o in ("clean", "normalized"))


async def test_it_labels_every_series_with_the_route_and_upstream_names(routed: Any) -> None:
    """A request retried once: the attempts, the retry (cause broken_output), the request and its added
    latency carry ``route="coder-route"`` and ``upstream="default"``, never the client's model string."""
    labels = {"tenant": routed.slug, "route": ROUTE, "upstream": "default", "path": "guarded"}
    before = {
        "retry": sample("toolrelay_upstream_attempts_total", **labels, outcome="retry"),
        "usable": usable(labels),
        "retries": sample("toolrelay_retries_total", **labels, cause="broken_output"),
        "requests": sample("toolrelay_requests_total", **labels, outcome="recovered-by-retry"),
        "added": sample("toolrelay_added_latency_seconds_count", **labels),
        "ttfb": sample("toolrelay_upstream_ttfb_seconds_count", upstream="default"),
    }
    await run(routed(), upstream([(0, BROKEN)], [(0, CALL), (0, FINISH_CALLS), (0, DONE)]))
    assert sample("toolrelay_upstream_attempts_total", **labels, outcome="retry") == before["retry"] + 1
    assert usable(labels) == before["usable"] + 1
    assert sample("toolrelay_retries_total", **labels, cause="broken_output") == before["retries"] + 1
    assert sample("toolrelay_requests_total", **labels, outcome="recovered-by-retry") == before["requests"] + 1
    assert sample("toolrelay_added_latency_seconds_count", **labels) == before["added"] + 1
    assert sample("toolrelay_upstream_ttfb_seconds_count", upstream="default") == before["ttfb"] + 2


async def test_it_counts_an_upstream_error_retry_and_the_default_route(routed: Any) -> None:
    """A 503 then a good answer for a model only the default upstream serves: ``route="default"``,
    cause ``upstream_error``; no added latency for a request that failed is ever observed."""
    labels = {"tenant": routed.slug, "route": "default", "upstream": "default", "path": "guarded"}
    before = sample("toolrelay_retries_total", **labels, cause="upstream_error")
    failure = answer(503, {"error": {"message": "overloaded"}})
    await run(routed(model="other-model"), upstream(failure, [(0, CALL), (0, FINISH_CALLS),
                                                                                     (0, DONE)]))
    assert sample("toolrelay_retries_total", **labels, cause="upstream_error") == before + 1


async def test_it_counts_frames_of_guarded_and_non_stream_attempts(routed: Any) -> None:
    """Guarded attempts count their SSE data frames; a non-stream attempt that got a body counts one."""
    _, streamed = await run(routed(), upstream([(0, TEXT("a")), (0, CALL), (0, FINISH_CALLS), (0, DONE)]))
    completion = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "done"}}]}
    _, whole = await run(routed(stream=False), upstream(answer(200, completion)))
    frames = await sync_to_async(lambda: {a.request_id: a.frames for a in Attempt.objects.all()})()
    assert frames[streamed.request_id] == 4
    assert frames[whole.request_id] == 1


async def _page(request_id: Any) -> str:
    def fetch() -> str:
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.create_superuser("root-records", "r@example.com", "pw-records-1234")
        client = Client()
        client.force_login(user)
        return client.get(f"/admin/audit/proxyrequest/{request_id}/change/").content.decode()
    return await sync_to_async(fetch)()


async def test_the_request_page_shows_the_turn_a_guarded_request_delivered(routed: Any) -> None:
    """The canonical turn (tool call name and arguments) is stored and shown; the upstream credential an
    upstream echoed is redacted from it."""
    echo = TEXT(f"key {SECRET}")
    _, response = await run(routed(), upstream([(0, echo), (0, CALL), (0, FINISH_CALLS), (0, DONE)]))
    row = await sync_to_async(ProxyRequest.objects.get)(id=response.request_id)
    assert row.delivered is not None and row.delivered["kind"] == "turn"
    call = row.delivered["choices"][0]["tool_calls"][0]
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})
    assert SECRET not in json.dumps(row.delivered)
    page = await _page(response.request_id)
    assert "What the client received" in page and "get_weather" in page and "Paris" in page


async def test_the_request_page_shows_the_exhaustion_answer(routed: Any) -> None:
    """Retries ran out after the commit: the terminal assistant message is what the page shows."""
    broken = [(0, TEXT("Working on it")), (0, BROKEN)]
    _, response = await run(routed(max_retries=1, exhaustion=Exhaustion.MESSAGE), upstream(broken, broken))
    row = await sync_to_async(ProxyRequest.objects.get)(id=response.request_id)
    assert row.outcome == "exhausted"
    assert row.delivered is not None and row.delivered["kind"] == "exhausted"
    assert "No tool was run" in row.delivered["message"]
    page = await _page(response.request_id)
    assert "Retries ran out; the client got a terminal assistant message" in page


async def test_the_request_page_shows_the_terminal_error_by_default(routed: Any) -> None:
    """The default ``fail`` policy: the page says the client got an in-stream error, with its message."""
    broken = [(0, TEXT("Working on it")), (0, BROKEN)]
    _, response = await run(routed(max_retries=1), upstream(broken, broken))
    row = await sync_to_async(ProxyRequest.objects.get)(id=response.request_id)
    assert row.outcome == "exhausted" and row.delivered is not None and row.delivered["as_error"] is True
    assert "No tool was run" in row.delivered["message"]
    assert "Retries ran out; the client got an in-stream error" in await _page(response.request_id)


async def test_the_request_page_shows_the_error_the_client_got(routed: Any) -> None:
    """A 400 from the upstream (not retryable) reaches the client as an HTTP error; the page says which."""
    refusal = answer(400, {"error": {"message": "bad request: messages[0] is invalid",
                                     "type": "invalid_request_error"}})
    recorder, response = await run(routed(), upstream(refusal))
    assert recorder.status == 400
    row = await sync_to_async(ProxyRequest.objects.get)(id=response.request_id)
    assert row.delivered is not None and row.delivered["kind"] == "error"
    assert row.delivered["status"] == 400 and "messages[0] is invalid" in row.delivered["message"]
    page = await _page(response.request_id)
    assert "An error, HTTP 400" in page


async def test_pass_through_leaves_delivered_unset(routed: Any) -> None:
    """Bytes forwarded unchanged are not summarised: ``delivered`` stays None."""
    principal_call = routed()
    body = {"model": ROUTE, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    call = dataclasses.replace(principal_call, request=prepare(body))
    _, response = await run(call, upstream([(0, TEXT("hello")), (0, DONE)]))
    row = await sync_to_async(ProxyRequest.objects.get)(id=response.request_id)
    assert row.path == "pass-through" and row.delivered is None


def _usage_chunk(usage: Any) -> bytes:
    return b"data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                   "choices": [], "usage": usage}).encode() + b"\n\n"


async def test_every_attempt_and_request_carries_its_cost_and_waste(routed: Any) -> None:
    """Issue 19 items 1 and 3: a broken attempt without usage is estimated and wasted; the delivered one is
    priced from DeepSeek's cache fields; nonsense usage is a finding, never a count."""
    from billing import book
    from billing.cost import Price

    book.reset(book.PriceBook((Price("upstream-model", input=1.0, output=2.0, cache_read=0.1),),
                              loaded=float("inf")))
    usage = {"prompt_tokens": 100, "completion_tokens": 10, "prompt_cache_hit_tokens": 80,
             "prompt_cache_miss_tokens": 20}
    call = routed()
    call.prompt_estimate = 40
    _, response = await run(call, upstream([(0, TEXT("partial")), (0, BROKEN)],
                                           [(0, CALL), (0, FINISH_CALLS), (0, _usage_chunk(usage)), (0, DONE)]))
    rows = await sync_to_async(lambda: (ProxyRequest.objects.get(id=response.request_id),
                                        list(Attempt.objects.filter(request_id=response.request_id))))()
    request, (broken, good) = rows
    assert broken.usage_estimated and broken.prompt_tokens == 40 and float(broken.cost_usd) > 0
    assert not good.usage_estimated and (good.prompt_tokens, good.cache_read_tokens) == (100, 80)
    assert float(good.cost_usd) == pytest.approx((20 * 1.0 + 80 * 0.1 + 10 * 2.0) / 1e6)
    assert float(request.delivered_usd) == pytest.approx(float(good.cost_usd))
    assert float(request.wasted_usd) == pytest.approx(float(broken.cost_usd))
    assert float(request.cost_usd) == pytest.approx(float(good.cost_usd) + float(broken.cost_usd))
    assert request.usage_estimated and not request.unpriced and request.cache_read_tokens == 80

    _, bad = await run(routed(), upstream([(0, CALL), (0, FINISH_CALLS),
                                           (0, _usage_chunk({"prompt_tokens": 10**20, "completion_tokens": -3})),
                                           (0, DONE)]))
    attempt = await sync_to_async(lambda: Attempt.objects.get(request_id=bad.request_id))()
    kinds = await sync_to_async(lambda: list(attempt.findings.values_list("kind", flat=True)))()
    assert kinds.count("usage-invalid") == 2 and attempt.usage_estimated
    assert 0 <= attempt.prompt_tokens < 10**9

    book.reset(book.PriceBook((), loaded=float("inf")))  # no price at all: unpriced, never $0
    _, free = await run(routed(), upstream([(0, CALL), (0, FINISH_CALLS), (0, _usage_chunk(usage)), (0, DONE)]))
    unpriced = await sync_to_async(lambda: ProxyRequest.objects.get(id=free.request_id))()
    assert unpriced.unpriced and unpriced.cost_usd == 0
