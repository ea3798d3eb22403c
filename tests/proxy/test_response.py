"""``ClientResponse``: the one writer to the client refuses out-of-order writes and owns the error path.

Driven with a recording ASGI ``send`` (no server): what matters here is the order of messages.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from proxy.edge.protocols import ANTHROPIC_MESSAGES, OPENAI_CHAT
from proxy.edge.response import ClientResponse, Phase, ResponseStateError
from proxy.guard.protocols.emit_openai import OpenAIChatEmitter


class Sent(list[dict[str, Any]]):
    async def __call__(self, message: dict[str, Any]) -> None:
        self.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m["body"] for m in self if m["type"] == "http.response.body")


def make(sent: Sent, *, anthropic: bool = False) -> ClientResponse:
    protocol = ANTHROPIC_MESSAGES if anthropic else OPENAI_CHAT
    response = ClientResponse(sent, error_body=protocol.error_body)
    response.emitter = OpenAIChatEmitter(model="m", include_usage=False)
    return response


async def test_it_goes_through_its_phases_once() -> None:
    """start -> send -> end, each once; the request id goes out as a header."""
    sent = Sent()
    r = make(sent)
    assert r.phase is Phase.NOT_STARTED
    await r.start(200, [(b"content-type", b"text/plain")])
    await r.send(b"a")
    await r.end(b"b")
    assert r.phase is Phase.ENDED and r.status == 200 and r.ttft is not None
    assert dict(sent[0]["headers"])[b"x-request-id"] == str(r.request_id).encode()
    assert [m.get("more_body") for m in sent[1:]] == [True, False] and sent.body == b"ab"


@pytest.mark.parametrize("wrong", ["body-before-start", "start-twice", "body-after-end", "end-twice",
                                   "json-after-start"])
async def test_it_refuses_out_of_order_writes(wrong: str) -> None:
    """Every write the phase does not allow raises, and nothing is sent for it."""
    sent = Sent()
    r = make(sent)
    if wrong != "body-before-start":
        await r.start(200, [])
    if wrong in ("body-after-end", "end-twice"):
        await r.end()
    before = len(sent)
    with pytest.raises(ResponseStateError):
        if wrong in ("body-before-start", "body-after-end"):
            await r.send(b"x")
        elif wrong == "start-twice":
            await r.start(200, [])
        elif wrong == "end-twice":
            await r.end()
        else:
            await r.send_json(200, {})
    assert len(sent) == before


async def test_it_answers_errors_in_the_clients_protocol_before_the_commit() -> None:
    """Before the commit an error is an HTTP status with the protocol's body, the request id in the message
    and ``x-should-retry: false``."""
    sent = Sent()
    r = make(sent, anthropic=True)
    await r.error(404, "no such model", type="not_found_error")
    headers = dict(sent[0]["headers"])
    assert sent[0]["status"] == 404 and headers[b"x-should-retry"] == b"false"
    body = json.loads(sent.body)
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert str(r.request_id) in body["error"]["message"] and r.ended


async def test_it_puts_errors_in_stream_after_the_commit() -> None:
    """After the commit the same call ends the stream with the emitter's in-stream error."""
    sent = Sent()
    r = make(sent)
    await r.commit_stream()
    await r.error(502, "upstream failed", type="upstream_error", code="upstream_failed")
    assert sent[0]["status"] == 200 and r.ended
    assert b'"error"' in sent.body and b"upstream failed" in sent.body and str(r.request_id).encode() in sent.body


async def test_it_answers_an_internal_failure_in_every_phase() -> None:
    """``fail_internal``: a 500 before the commit, an in-stream error after it, nothing once ended."""
    sent = Sent()
    r = make(sent)
    await r.fail_internal()
    assert sent[0]["status"] == 500 and b"server_error" in sent.body
    sent2 = Sent()
    r2 = make(sent2)
    await r2.commit_stream()
    await r2.fail_internal()
    assert sent2[0]["status"] == 200 and b"toolrelay internal error" in sent2.body and r2.ended
    count = len(sent2)
    await r2.fail_internal()
    assert len(sent2) == count


async def test_it_commits_at_the_deadline_and_keeps_the_stream_alive() -> None:
    """``hold``: nothing before the commit deadline, then a 200 with a keep-alive, then one per interval."""
    sent = Sent()
    r = make(sent)
    r.hold(0.05, 0.05)
    await asyncio.sleep(0.02)
    assert sent == []
    await asyncio.sleep(0.25)
    r.release()
    assert sent[0]["status"] == 200
    assert sent.body.count(b": keepalive") >= 3
    await r.end()
    assert r.ended


async def test_it_finishes_a_response_left_open() -> None:
    """``finish`` ends a committed response with an empty last part and does nothing otherwise."""
    sent = Sent()
    r = make(sent)
    await r.finish()
    assert sent == []
    await r.start(200, [])
    await r.finish()
    assert r.ended and sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
