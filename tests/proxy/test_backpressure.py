"""The launcher's parts that need no server: the backpressure producer and its contract, the relay
waiting on it before each upstream read, the 413 body, the endpoint strings, the version check.

The launcher itself, with real sockets, is tested in ``tests/e2e/test_launcher.py``.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from proxy.edge.protocols import OPENAI_CHAT
from proxy.edge.response import ClientResponse
from proxy.edge.server.backpressure import Backpressure
from proxy.edge.server.compat import UnsupportedServer, check_supported, parse_version
from proxy.edge.server.listen import endpoint_strings
from proxy.edge.server.protocol import reason_phrase, too_large_response
from proxy.guard.checks.request import prepare
from proxy.guard.protocols.emit_openai import OpenAIChatEmitter
from proxy.relay.loop import Relay, RelayCall, drain_background
from proxy.upstreams.client import UpstreamClient
from tenants.auth import principal_for_key
from tenants.services import provision

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


# ----- Backpressure: the producer and its awaitable -----

async def test_wait_writable_returns_at_once_until_paused_then_waits_for_resume() -> None:
    bp = Backpressure()
    await asyncio.wait_for(bp.wait_writable(), 0.1)
    bp.pauseProducing()
    bp.pauseProducing()  # Twisted pauses again on every write while the buffer stays full
    assert bp.paused and bp.pauses == 1
    waiters = [asyncio.ensure_future(bp.wait_writable()) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert not any(w.done() for w in waiters)
    bp.resumeProducing()
    await asyncio.wait_for(asyncio.gather(*waiters), 0.5)
    assert not bp.paused


async def test_a_lost_connection_releases_the_waiters_for_good() -> None:
    bp = Backpressure()
    bp.pauseProducing()
    waiter = asyncio.ensure_future(bp.wait_writable())
    await asyncio.sleep(0)
    bp.stopProducing()
    await asyncio.wait_for(waiter, 0.5)


async def test_a_cancelled_waiter_does_not_disturb_the_others() -> None:
    bp = Backpressure()
    bp.pauseProducing()
    cancelled, kept = asyncio.ensure_future(bp.wait_writable()), asyncio.ensure_future(bp.wait_writable())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    bp.resumeProducing()
    await asyncio.wait_for(kept, 0.5)
    assert cancelled.cancelled()


async def test_client_response_ready_awaits_the_hook_only_when_there_is_one() -> None:
    async def send(message: dict[str, Any]) -> None:
        return None

    await asyncio.wait_for(ClientResponse(send, error_body=OPENAI_CHAT.error_body).ready(), 0.1)
    bp = Backpressure()
    bp.pauseProducing()
    response = ClientResponse(send, error_body=OPENAI_CHAT.error_body, writable=bp.wait_writable)
    waiter = asyncio.ensure_future(response.ready())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    bp.resumeProducing()
    await asyncio.wait_for(waiter, 0.5)


# ----- the relay waits on the hook before each upstream read -----

def _frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


FRAMES = [_frame({"role": "assistant", "content": ""}), *(_frame({"content": f"w{i} "}) for i in range(6)),
          _frame({}, "stop"), b"data: [DONE]\n\n"]


@pytest.fixture
async def relay_call() -> AsyncIterator[Any]:
    done = await sync_to_async(provision)(tenant_name="bp-tests", upstream_url="http://upstream.test/v1",
                                          upstream_key="sk-bp-upstream")
    principal = await sync_to_async(principal_for_key)(done.raw_key or "")
    assert principal is not None

    def make(*, tools: bool) -> RelayCall:
        plan = principal.resolve("m")
        assert plan is not None
        body: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        if tools:
            body["tools"] = TOOLS
        return RelayCall(principal=principal, plan=plan, request=prepare(body),
                         emitter=OpenAIChatEmitter(model="m", include_usage=False))

    yield make
    await drain_background()
    await sync_to_async(connections.close_all)()


def _counting_upstream(pulled: list[int]) -> UpstreamClient:
    """One streamed answer of ``FRAMES``, one frame per body chunk; ``pulled`` counts the reads."""

    async def handler(request: httpx.Request) -> httpx.Response:
        async def frames() -> AsyncIterator[bytes]:
            for data in FRAMES:
                pulled.append(1)
                yield data

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=frames())

    return UpstreamClient(transport=httpx.MockTransport(handler))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("tools", [False, True], ids=["pass-through", "guarded"])
async def test_the_relay_reads_no_further_upstream_while_the_client_is_not_writable(relay_call: Any,
                                                                                    tools: bool) -> None:
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    bp, pulled = Backpressure(), []
    bp.pauseProducing()  # the client's buffer is full from the start
    response = ClientResponse(send, error_body=OPENAI_CHAT.error_body, writable=bp.wait_writable)
    task = asyncio.ensure_future(Relay(relay_call(tools=tools), response, _counting_upstream(pulled)).run())
    await asyncio.sleep(0.2)
    assert len(pulled) == 1 and not task.done()  # one chunk read, then held before the next read
    bp.resumeProducing()
    await asyncio.wait_for(task, 5)
    assert len(pulled) == len(FRAMES) and response.ended
    assert b"w5" in b"".join(sent)


# ----- the 413, reason phrases, endpoints, versions -----

def test_status_lines_carry_the_rfc_reason_phrase_twisted_lacks() -> None:
    assert reason_phrase(429) == b"Too Many Requests" and reason_phrase(422) == b"Unprocessable Entity"
    assert reason_phrase(200) == b"OK" and reason_phrase(599) == b"Unknown Status"


def test_the_413_is_a_complete_response_in_the_clients_protocol() -> None:
    for path, shape in ((b"/v1/chat/completions", "openai"), (b"/v1/messages?beta=true", "anthropic")):
        raw = too_large_response(path, 1000)
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = dict(line.split(b": ", 1) for line in lines[1:])
        assert lines[0] == b"HTTP/1.1 413 Request Entity Too Large"
        assert headers[b"x-should-retry"] == b"false" and headers[b"connection"] == b"close"
        assert int(headers[b"content-length"]) == len(body)
        error = json.loads(body)
        if shape == "openai":
            assert error == {"error": {"message": "request body larger than 1000 bytes",
                                       "type": "invalid_request_error", "param": None, "code": "request_too_large"}}
        else:
            assert error == {"type": "error", "error": {"type": "request_too_large",
                                                        "message": "request body larger than 1000 bytes"}}


def test_endpoint_strings_carry_the_backlog() -> None:
    assert endpoint_strings(host="127.0.0.1", port=8000, fd=None, backlog=1024) == [
        "tcp:port=8000:interface=127.0.0.1:backlog=1024"]
    assert endpoint_strings(host="::1", port=8000, fd=None, backlog=7) == [r"tcp:port=8000:interface=\:\:1:backlog=7"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(5)
        assert endpoint_strings(host=None, port=None, fd=sock.fileno(), backlog=64) == [f"fd:fileno={sock.fileno()}"]
        sock.getsockname()  # the inherited socket stays open and usable


def test_an_unsupported_daphne_is_refused_with_a_clear_message() -> None:
    check_supported("4.1.0")
    check_supported("4.2.3")
    check_supported()  # the installed one
    for version in ("4.0.0", "5.0.0", "garbage"):
        with pytest.raises(UnsupportedServer, match=r"supports Daphne >=4.1,<5"):
            check_supported(version)
    assert parse_version("4.2.3rc1") == (4, 2) and parse_version("x") == (0, 0)
