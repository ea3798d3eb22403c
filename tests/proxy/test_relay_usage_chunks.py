"""An upstream that sends ``usage`` on every chunk (some vLLM builds, DashScope, gateways in front of
them): the Anthropic translation must keep each block open until its content ends. CLIProxyAPI 5419: a
translator closed the ``tool_use`` block at the first chunk carrying usage and lost every argument delta
after it (issue 23 item 3)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from proxy.edge.protocols import ANTHROPIC_MESSAGES
from proxy.edge.response import ClientResponse
from proxy.guard.protocols.emit_anthropic import AnthropicMessagesEmitter
from proxy.relay.loop import Relay, drain_background
from tests.proxy.guard.test_emit_anthropic import final_message
from tests.proxy.test_relay import DONE, Recorder, make_request, upstream  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

ARGUMENTS = ['{"ci', 'ty": "Pa', 'ris"}']


def with_usage(delta: dict[str, Any], completion: int, finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            "usage": {"prompt_tokens": 42, "completion_tokens": completion, "total_tokens": 42 + completion}}
    return f"data: {json.dumps(body)}\n\n".encode()


def frames() -> list[tuple[float, bytes]]:
    out = [with_usage({"role": "assistant", "content": "Checking."}, 1)]
    out.append(with_usage({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                           "function": {"name": "get_weather", "arguments": ARGUMENTS[0]}}]}, 2))
    out += [with_usage({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}, 3 + i)
            for i, a in enumerate(ARGUMENTS[1:])]
    out += [with_usage({}, 9, "tool_calls"), DONE]
    return [(0, f) for f in out]


async def test_usage_on_every_chunk_never_closes_a_block_early(make_request: Any) -> None:  # noqa: F811
    request = make_request()
    request = dataclasses.replace(request, emitter=AnthropicMessagesEmitter(model="m", input_tokens=42))
    recorder = Recorder()
    await Relay(request, ClientResponse(recorder, error_body=ANTHROPIC_MESSAGES.error_body),
                upstream(frames())).run()
    await drain_background()
    events = [json.loads(line[6:]) for line in recorder.body.decode().splitlines() if line.startswith("data: ")]
    message = final_message(recorder.body)  # anthropic-python's own MessageStream over these bytes
    [tool] = [b for b in message.content if b.type == "tool_use"]
    assert tool.input == {"city": "Paris"}
    starts = [e["index"] for e in events if e["type"] == "content_block_start"]
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert starts == stops == sorted(starts), "each block opened once and closed once, in order"
    tool_index = next(e["index"] for e in events if e["type"] == "content_block_start"
                      and e["content_block"]["type"] == "tool_use")
    deltas = [e for e in events if e["type"] == "content_block_delta" and e["index"] == tool_index]
    stop_at = next(i for i, e in enumerate(events) if e["type"] == "content_block_stop" and e["index"] == tool_index)
    assert all(events.index(d) < stop_at for d in deltas)
    assert json.loads("".join(d["delta"]["partial_json"] for d in deltas)) == json.loads("".join(ARGUMENTS))
    assert events[0]["message"]["usage"]["input_tokens"] == 42
    final = next(e for e in events if e["type"] == "message_delta")
    assert final["delta"]["stop_reason"] == "tool_use" and final["usage"]["output_tokens"] == 9

