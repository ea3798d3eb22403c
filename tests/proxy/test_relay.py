"""The relay against a scripted upstream (httpx.MockTransport at the HTTP seam) and a recording client.

What is checked here and not end to end: timing rules (commit deadline, keep-alives), the text rule
after a retry, re-asking an upstream that rejects ``stream_options``, and closing the upstream on
cancellation. The database is real (audit rows are written as in production).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from audit.journal_writer import drained
from audit.models import ProxyRequest
from proxy.edge.protocols import OPENAI_CHAT
from proxy.edge.response import ClientResponse
from proxy.guard.checks.request import prepare
from proxy.guard.policy import Exhaustion
from proxy.guard.protocols.emit_openai import OpenAIChatEmitter
from proxy.relay.loop import Relay, RelayCall, drain_background
from proxy.upstreams.client import UpstreamClient
from tenants.auth import principal_for_key
from tenants.services import provision

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


TEXT = lambda text: chunk({"content": text})  # noqa: E731
CALL = chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                              "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]})
FINISH_CALLS = chunk({}, "tool_calls")
FINISH_STOP = chunk({}, "stop")
DONE = b"data: [DONE]\n\n"
SECRET = "sk-relay-upstream-secret-0001"
BROKEN = b"data: {not json\n\n"


class Recorder:
    """An ASGI ``send`` that records what the client would receive."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[bytes, bytes] = {}
        self.parts: list[bytes] = []
        self.ended = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert self.status is None, "headers sent twice"
            self.status, self.headers = message["status"], dict(message["headers"])
            return
        assert self.status is not None, "body before headers"
        assert not self.ended, "body after the end"
        self.parts.append(message["body"])
        self.ended = not message["more_body"]

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)

    def said(self) -> str:
        """The text and the in-stream error messages, in order: what the client was told."""
        out = ""
        for line in self.body.split(b"\n"):
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                if isinstance(chunk.get("error"), dict):
                    out += chunk["error"].get("message") or ""
                for choice in chunk.get("choices", []):
                    out += choice.get("delta", {}).get("content") or ""
        return out

    def text(self) -> str:
        out = ""
        for line in self.body.split(b"\n"):
            if line.startswith(b"data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    out += choice.get("delta", {}).get("content") or ""
        return out

    def tool_names(self) -> list[str]:
        names = []
        for line in self.body.split(b"\n"):
            if line.startswith(b"data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    names += [c["function"]["name"] for c in choice.get("delta", {}).get("tool_calls") or []
                              if c.get("function", {}).get("name")]
        return names


Script = list[tuple[float, bytes]]


def upstream(*attempts: Script | httpx.Response, seen: list[dict[str, Any]] | None = None,
             closed: list[int] | None = None, pulled: list[int] | None = None) -> UpstreamClient:
    """An UpstreamClient whose k-th call answers ``attempts[k]``: a Response, or (delay, bytes) frames."""
    calls = iter(range(len(attempts)))

    async def handler(request: httpx.Request) -> httpx.Response:
        number = next(calls)
        if seen is not None:
            seen.append(json.loads(request.content))
        answer = attempts[number]
        if isinstance(answer, httpx.Response):
            return answer

        async def frames() -> AsyncIterator[bytes]:
            try:
                for delay, data in answer:
                    await asyncio.sleep(delay)
                    if pulled is not None:
                        pulled.append(number)
                    yield data
            finally:
                if closed is not None:
                    closed.append(number)

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=frames())

    return UpstreamClient(transport=httpx.MockTransport(handler))


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    """The relay writes audit rows from Channels' database thread; close that thread's connection after
    each test, or Postgres refuses to drop the test database at the end (another session open)."""
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def make_request() -> Callable[..., RelayCall]:
    done = provision(tenant_name="relay-tests", upstream_url="http://upstream.test/v1", upstream_key=SECRET)
    principal = principal_for_key(done.raw_key or "")
    assert principal is not None

    def make(*, tools: bool = True, **policy: Any) -> RelayCall:
        plan = principal.resolve("m")
        assert plan is not None
        plan = dataclasses.replace(plan, policy=dataclasses.replace(plan.policy, **policy))
        body: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        if tools:
            body["tools"] = TOOLS
        return RelayCall(principal=principal, plan=plan, request=prepare(body),
                         emitter=OpenAIChatEmitter(model="m", include_usage=False))

    return make


def client_response(recorder: Recorder) -> ClientResponse:
    return ClientResponse(recorder, error_body=OPENAI_CHAT.error_body)


async def run(request: RelayCall, client: UpstreamClient) -> tuple[Recorder, ClientResponse]:
    recorder = Recorder()
    response = client_response(recorder)
    await Relay(request, response, client).run()
    await drain_background()
    assert await sync_to_async(drained)()
    return recorder, response


async def test_it_commits_at_the_deadline_and_keeps_the_connection_alive_while_holding(make_request: Any) -> None:
    request = make_request(commit_deadline=0.05, keepalive_interval=0.05)
    recorder, response = await run(request, upstream([(0.3, CALL), (0, FINISH_CALLS), (0, DONE)]))
    assert recorder.status == 200
    first_call = recorder.body.index(b"get_weather")
    assert b": keepalive" in recorder.body[:first_call]
    assert recorder.body.count(b": keepalive") >= 3
    assert recorder.tool_names() == ["get_weather"]


async def test_it_does_not_commit_before_the_deadline_when_nothing_is_ready(make_request: Any) -> None:
    request = make_request(commit_deadline=5.0)
    recorder, response = await run(request, upstream([(0.1, CALL), (0, FINISH_CALLS), (0, DONE)]))
    assert b": keepalive" not in recorder.body
    assert recorder.body.endswith(DONE)


async def test_it_sends_only_the_tool_calls_of_a_retry_after_text_was_streamed(make_request: Any) -> None:
    request = make_request()
    recorder, response = await run(request, upstream([(0, TEXT("Let me check")), (0, BROKEN)],
                                           [(0, TEXT("Something else")), (0, CALL), (0, FINISH_CALLS), (0, DONE)]))
    assert recorder.text() == "Let me check"
    assert recorder.tool_names() == ["get_weather"]
    assert recorder.body.endswith(DONE)


async def test_it_continues_text_after_a_retry_minus_the_common_prefix(make_request: Any) -> None:
    request = make_request()
    retry = [(0, TEXT("Hello world")), (0, TEXT(", done.")), (0, FINISH_STOP), (0, DONE)]
    recorder, response = await run(request, upstream([(0, TEXT("Hello wor")), (0, BROKEN)], retry))
    assert recorder.text() == "Hello world, done."
    row = await sync_to_async(ProxyRequest.objects.get)(id=response.request_id)
    assert (row.outcome, row.attempts) == ("recovered-by-retry", 2)


async def test_it_aborts_a_broken_attempt_without_reading_the_rest(make_request: Any) -> None:
    pulled: list[int] = []
    request = make_request()
    slow_tail = [(0, BROKEN), *[(0.2, TEXT("never read")) for _ in range(20)]]
    started = asyncio.get_running_loop().time()
    client = upstream(slow_tail, [(0, CALL), (0, FINISH_CALLS), (0, DONE)], pulled=pulled)
    recorder, response = await run(request, client)
    assert recorder.tool_names() == ["get_weather"]
    assert b"never read" not in recorder.body
    assert pulled.count(0) == 1, "nothing was read from the broken attempt after its first bad frame"
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_it_asks_again_without_stream_options_when_the_upstream_rejects_them(make_request: Any) -> None:
    seen: list[dict[str, Any]] = []
    error = {"error": {"message": "unknown field stream_options", "type": "invalid_request_error"}}
    rejection = httpx.Response(400, headers={"content-type": "application/json"},
                               stream=httpx.ByteStream(json.dumps(error).encode()))
    request = make_request()
    recorder, response = await run(request, upstream(rejection, [(0, CALL), (0, FINISH_CALLS), (0, DONE)], seen=seen))
    assert recorder.tool_names() == ["get_weather"]
    assert seen[0]["stream_options"] == {"include_usage": True}
    assert "stream_options" not in seen[1]


async def test_it_closes_the_upstream_when_the_client_goes_away(make_request: Any) -> None:
    closed: list[int] = []
    request = make_request(tools=False)
    client = upstream([(0.05, TEXT(f"t{i}")) for i in range(100)], closed=closed)
    recorder = Recorder()
    response = client_response(recorder)
    task = asyncio.ensure_future(Relay(request, response, client).run())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await drain_background()
    assert await sync_to_async(drained)()
    assert closed == [0]
    row = await sync_to_async(ProxyRequest.objects.get)(id=response.request_id)
    assert row.outcome == "client-cancelled"


async def test_by_default_exhaustion_after_the_commit_is_the_terminal_error(make_request: Any) -> None:
    """Policy ``fail`` (the default): the streamed text stays, then the error chunk agents do not retry,
    no ``finish_reason`` and no ``[DONE]`` (so no client reads the turn as a success)."""
    request = make_request(max_retries=1)
    broken = [(0, TEXT("Working on it")), (0, BROKEN)]
    recorder, response = await run(request, upstream(broken, broken))
    assert recorder.status == 200
    assert recorder.text() == "Working on it"
    error = json.loads(recorder.body.rstrip().rsplit(b"\n", 1)[-1][6:])["error"]
    assert error["code"] == "upstream_failed" and "No tool was run" in error["message"]
    assert recorder.tool_names() == []
    assert b'"finish_reason"' not in recorder.body and not recorder.body.endswith(DONE)


async def test_it_answers_exhaustion_in_stream_after_the_commit(make_request: Any) -> None:
    request = make_request(max_retries=1, exhaustion=Exhaustion.MESSAGE)
    broken = [(0, TEXT("Working on it")), (0, BROKEN)]
    recorder, response = await run(request, upstream(broken, broken))
    assert recorder.status == 200
    assert "[toolrelay]" in recorder.text()
    assert recorder.text().startswith("Working on it\n\n[toolrelay]"), "set apart from the streamed text"
    assert "No tool was run" in recorder.text()
    assert recorder.tool_names() == []
    assert b'"finish_reason":"stop"' in recorder.body
    assert recorder.body.endswith(DONE)


async def test_it_reports_an_error_in_stream_once_the_commit_deadline_committed(make_request: Any) -> None:
    async def late_rejection() -> AsyncIterator[bytes]:
        await asyncio.sleep(0.05)
        yield json.dumps({"error": {"message": "context length exceeded", "type": "invalid_request_error"}}).encode()

    request = make_request(commit_deadline=0.0)
    slow = upstream(httpx.Response(400, headers={"content-type": "application/json"}, content=late_rejection()))
    recorder, response = await run(request, slow)
    assert recorder.status == 200
    assert b'"error"' in recorder.body and b"context length exceeded" in recorder.body
    assert recorder.ended


async def test_it_never_relays_or_records_an_upstream_credential_echoed_back(make_request: Any) -> None:
    from audit.models import Attempt, Finding

    echo = {"error": {"message": f"Incorrect API key provided: Bearer {SECRET}", "type": "invalid_request_error",
                      "code": "invalid_api_key"}}
    refused = httpx.Response(401, headers={"content-type": "application/json"},
                             stream=httpx.ByteStream(json.dumps(echo).encode()))
    request = make_request()
    recorder, response = await run(request, upstream(refused))
    assert recorder.status == 502, "the upstream refused toolrelay's credential, not the client's key"
    assert b"upstream_auth_failed" in recorder.body
    assert SECRET.encode() not in recorder.body and b"[redacted]" in recorder.body

    def stored() -> str:
        rows = [*Attempt.objects.filter(request_id=response.request_id).values_list("abort_reason", flat=True),
                *Finding.objects.filter(request_id=response.request_id).values_list("detail", "fragment"),
                *ProxyRequest.objects.filter(id=response.request_id).values_list("error", flat=True)]
        return json.dumps(rows)

    text = await sync_to_async(stored)()
    assert "Incorrect API key" in text and SECRET not in text


async def test_it_answers_a_clear_502_when_the_stored_credential_does_not_decrypt(make_request: Any) -> None:
    seen: list[dict[str, Any]] = []
    request = make_request()
    broken = dataclasses.replace(request.plan.targets[0], credential_encrypted="not-a-fernet-token")
    request.plan = dataclasses.replace(request.plan, targets=(broken,))
    recorder, response = await run(request, upstream([(0, DONE)], seen=seen))
    assert recorder.status == 502
    assert b"cannot be decrypted" in recorder.body and b"upstream_misconfigured" in recorder.body
    assert recorder.headers[b"x-should-retry"] == b"false"
    assert seen == [], "nothing was sent upstream, and there was no retry"


async def test_it_records_why_a_pass_through_stream_broke_off_after_the_commit(make_request: Any) -> None:
    """A pass-through stream that breaks after bytes were forwarded ends with an in-stream error, and the
    audit keeps why (outcome and error text), with the attempt's status 200."""
    from audit.models import Attempt

    async def handler(request: httpx.Request) -> httpx.Response:
        async def frames() -> AsyncIterator[bytes]:
            yield TEXT("partial")
            raise httpx.ReadError("connection reset by peer")

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=frames())

    request = make_request(tools=False)
    recorder, response = await run(request, UpstreamClient(transport=httpx.MockTransport(handler)))
    assert recorder.status == 200 and recorder.ended
    assert b"partial" in recorder.body and b"broke off" in recorder.body
    row = await sync_to_async(ProxyRequest.objects.get)(id=response.request_id)
    assert row.outcome == "upstream-error" and "broke" in row.error
    attempt = await sync_to_async(Attempt.objects.get)(request_id=response.request_id)
    assert attempt.upstream_status == 200 and attempt.outcome == "upstream-error"


async def test_it_audits_the_refused_stream_options_call_as_an_attempt_of_its_own(make_request: Any) -> None:
    """The upstream client's own re-ask is on record: two attempts, the refusal first, and only one of
    the policy's retries is not spent on it."""
    from audit.models import Attempt

    error = {"error": {"message": "unknown field stream_options", "type": "invalid_request_error"}}
    rejection = httpx.Response(400, headers={"content-type": "application/json"},
                               stream=httpx.ByteStream(json.dumps(error).encode()))
    request = make_request(max_retries=0)
    recorder, response = await run(request, upstream(rejection, [(0, CALL), (0, FINISH_CALLS), (0, DONE)]))
    assert recorder.tool_names() == ["get_weather"]
    attempts = await sync_to_async(list)(Attempt.objects.filter(request_id=response.request_id).order_by("number"))
    assert [(a.number, a.upstream_status, a.outcome) for a in attempts] == [(0, 400, "upstream-error"),
                                                                           (1, 200, "normalized")]
