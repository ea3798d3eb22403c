"""The Anthropic Messages emitter, checked by anthropic-python itself.

Streams are read by the SDK's own client (``messages.stream`` over an ``httpx2.MockTransport``, the SDK's HTTP layer, so
its event-name dispatch and ``MessageStream`` accumulation run exactly as against a server) and by
``accumulate_event`` directly; the canonical-form rules of PROTOCOLS.md section 0 (items 2, 6, 9-12)
are asserted on the raw bytes.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic._streaming import SSEDecoder  # the SDK's decoder (private, but the one clients run)
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message

from proxy.guard.protocols.emit_anthropic import (
    ARGUMENT_SLICE,
    AnthropicMessagesEmitter,
    error_type,
    is_own_signature,
    thinking_signature,
)
from proxy.guard.protocols.translate_anthropic import translate_messages
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn, UpstreamError

USAGE = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150,
         "prompt_tokens_details": {"cached_tokens": 20}}


def emitter(**kwargs: Any) -> AnthropicMessagesEmitter:
    return AnthropicMessagesEmitter(model="my-model", message_id="msg_test", **kwargs)


def pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream(em: AnthropicMessagesEmitter, turn: Turn, size: int = 3) -> bytes:
    """The whole stream for ``turn``: reasoning, then content through ``text()``, then ``close``."""
    out = [em.open()]
    choice = turn.choices[0] if turn.choices else ChoiceTurn()
    for channel, text in (("reasoning", choice.reasoning), ("content", choice.content), ("refusal", choice.refusal)):
        out += [em.text(0, channel, p) for p in pieces(text or "", size)]  # type: ignore[arg-type]
    out.append(em.close(turn))
    return b"".join(out)


def events(data: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, parsed data) of every SSE event, decoded by anthropic-python."""
    return [(sse.event, json.loads(sse.data)) for sse in SSEDecoder().iter_bytes(iter([data]))]


def sdk_client(body: bytes, status: int = 200, content_type: str = "text/event-stream") -> anthropic.Anthropic:
    """An anthropic client whose every request is answered with ``body``."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers={"content-type": content_type}, content=body)

    return anthropic.Anthropic(api_key="k", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def final_message(data: bytes) -> Message:
    """The Message anthropic-python's ``messages.stream`` builds from ``data``."""
    with sdk_client(data) as client, client.messages.stream(
            model="my-model", max_tokens=100, messages=[{"role": "user", "content": "hi"}]) as s:
        return s.get_final_message()


def accumulated(data: bytes) -> Any:
    """The snapshot ``accumulate_event`` builds event by event (the SDK's accumulator, PROTOCOLS.md 2.3)."""
    snapshot = None
    bufs: dict[int, bytes] = {}
    for name, data_obj in events(data):
        if name in ("ping", "error"):
            continue
        snapshot = accumulate_event(event=data_obj, current_snapshot=snapshot, json_bufs=bufs)  # type: ignore[arg-type]
    return snapshot


def full_turn() -> Turn:
    return Turn(choices=[ChoiceTurn(
        reasoning="The user wants the weather in two cities.", content="Let me check both.",
        tool_calls=[ToolCall("call_1", "get_weather", '{"city":"Paris"}'),
                    ToolCall("call_2", "get_weather", '{"city":"Rome","unit":"celsius"}')],
        finish_reason="tool_calls")], usage=USAGE)


def test_it_streams_a_turn_the_sdk_accumulates_into_the_same_message() -> None:
    message = final_message(stream(emitter(), full_turn()))
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    thinking, text, first, second = message.content
    assert thinking.thinking == "The user wants the weather in two cities."  # type: ignore[union-attr]
    assert text.text == "Let me check both."  # type: ignore[union-attr]
    assert (first.id, first.name, first.input) == ("call_1", "get_weather", {"city": "Paris"})  # type: ignore[union-attr]
    assert second.input == {"city": "Rome", "unit": "celsius"}  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
    assert (message.id, message.model, message.role) == ("msg_test", "my-model", "assistant")
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens, message.usage.output_tokens) == (
        100, 20, 30)


def test_it_gives_accumulate_event_the_same_message() -> None:
    snapshot = accumulated(stream(emitter(), full_turn()))
    assert [b.type for b in snapshot.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert snapshot.content[3].input == {"city": "Rome", "unit": "celsius"}
    assert snapshot.usage.output_tokens == 30


def test_it_names_every_event_after_its_data_type_and_never_sends_done() -> None:
    """PROTOCOLS.md section 0 item 2 (event lines) and 5.3 (no ``[DONE]`` in Anthropic streams)."""
    em = emitter()
    data = em.open() + em.keepalive() + b"".join(em.text(0, "content", p) for p in pieces("hello")) + em.close(
        full_turn())
    assert b"[DONE]" not in data
    assert data.endswith(b"\n\n")
    raw_events = data.decode().split("\n\n")[:-1]
    for raw in raw_events:
        name_line, data_line = raw.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        assert json.loads(data_line[6:])["type"] == name_line[7:]
    names = [name for name, _ in events(data)]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]


def test_it_numbers_blocks_contiguously_from_zero_and_closes_each_before_the_next() -> None:
    """PROTOCOLS.md section 0 item 11."""
    starts: list[int] = []
    open_index: int | None = None
    for name, data in events(stream(emitter(), full_turn())):
        if name == "content_block_start":
            assert open_index is None, "blocks never interleave"
            open_index = data["index"]
            starts.append(data["index"])
        elif name == "content_block_delta":
            assert data["index"] == open_index
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
    assert starts == [0, 1, 2, 3]


def test_it_starts_blocks_with_the_empty_payloads_the_sdk_builds_on() -> None:
    """PROTOCOLS.md section 0 item 10: ``message_start.message.usage`` and empty block payloads."""
    found = events(stream(emitter(input_tokens=42), full_turn()))
    start = found[0][1]
    assert start["message"]["usage"]["input_tokens"] == 42 and start["message"]["content"] == []
    blocks = [data["content_block"] for name, data in found if name == "content_block_start"]
    assert blocks == [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": ""},
                      {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}},
                      {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {}}]


def test_it_signs_thinking_just_before_the_block_stop_with_a_signature_that_round_trips() -> None:
    found = events(stream(emitter(), full_turn()))
    thinking_events = [(name, data) for name, data in found if data.get("index") == 0]
    assert thinking_events[-2][1]["delta"]["type"] == "signature_delta"
    assert thinking_events[-1][0] == "content_block_stop"
    message = final_message(stream(emitter(), full_turn()))
    block = message.content[0]
    assert is_own_signature(block.thinking, block.signature)  # type: ignore[union-attr]
    # Claude Code sends the assistant message back verbatim (PROTOCOLS.md 4.3): it translates to
    # reasoning_content and the same tool calls.
    back = translate_messages({"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [b.to_dict() for b in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "18"},
                                     {"type": "tool_result", "tool_use_id": "call_2", "content": "20"}]}]})
    assistant = back.body["messages"][1]
    assert assistant["reasoning_content"] == "The user wants the weather in two cities."
    assert [json.loads(c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
        {"city": "Paris"}, {"city": "Rome", "unit": "celsius"}]


@pytest.mark.parametrize(("choice", "reason"), [
    (ChoiceTurn(content="done", finish_reason="stop"), "end_turn"),
    (ChoiceTurn(content="cut", finish_reason="length"), "max_tokens"),
    (ChoiceTurn(tool_calls=[ToolCall("c", "f", "{}")], finish_reason="tool_calls"), "tool_use"),
    (ChoiceTurn(tool_calls=[ToolCall("c", "f", "{}")], finish_reason="stop"), "tool_use"),
    (ChoiceTurn(content="", finish_reason="content_filter"), "refusal"),
    (ChoiceTurn(refusal="I can't help with that.", finish_reason="stop"), "refusal"),
    (ChoiceTurn(content="x", finish_reason=None), "end_turn"),
])
def test_it_maps_finish_reasons_to_stop_reasons(choice: ChoiceTurn, reason: str) -> None:
    """PROTOCOLS.md 2.7: any tool_use block => tool_use."""
    turn = Turn(choices=[choice])
    assert final_message(stream(emitter(), turn)).stop_reason == reason
    assert emitter().complete(turn)["stop_reason"] == reason


def test_it_always_sends_usage_output_tokens() -> None:
    """PROTOCOLS.md section 0 item 9: the SDK requires ``message_delta.usage.output_tokens``."""
    data = stream(emitter(), Turn(choices=[ChoiceTurn(content="hi", finish_reason="stop")]))
    delta = next(d for name, d in events(data) if name == "message_delta")
    assert delta["usage"] == {"output_tokens": 0}
    assert final_message(data).usage.output_tokens == 0


def test_it_sends_ping_keepalives_the_sdk_skips() -> None:
    em = emitter()
    data = em.keepalive() + em.open() + em.keepalive() + em.text(0, "content", "hi") + em.keepalive() + em.close(
        Turn(choices=[ChoiceTurn(content="hi", finish_reason="stop")]))
    assert em.keepalive() == b""
    assert data.startswith(b'event: ping\ndata: {"type":"ping"}\n\n')
    assert final_message(data).content[0].text == "hi"  # type: ignore[union-attr]


def test_it_ends_a_failed_stream_with_an_error_event_the_sdk_raises() -> None:
    """PROTOCOLS.md section 0 item 12 and 2.4."""
    em = emitter()
    data = em.open() + em.text(0, "content", "partial") + em.close_error(UpstreamError(529, "Overloaded"))
    name, body = events(data)[-1]
    assert (name, body) == ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        final_message(data)
    assert em.close(full_turn()) == b"" and em.text(0, "content", "x") == b""


@pytest.mark.parametrize("text", ["", "Let me check"])
def test_the_terminal_error_follows_a_content_block_and_is_not_retryable(text: str) -> None:
    """``close_terminal``: after at least one content block (an empty text block when nothing was sent,
    so Claude Code does not fall back to a non-stream request), ``event: error`` of type
    ``invalid_request_error``; the SDK raises with the message; nothing can follow it."""
    em = emitter()
    data = em.open() + em.text(0, "content", text) + em.close_terminal("[toolrelay] failed")
    seen = events(data)
    names = [name for name, _ in seen]
    assert names.count("content_block_start") == 1 and names.count("content_block_stop") == 1
    assert names[-1] == "error" and "message_stop" not in names and "message_delta" not in names
    assert seen[-1][1] == {"type": "error", "error": {"type": "invalid_request_error", "message": "[toolrelay] failed"}}
    with pytest.raises(anthropic.APIStatusError, match="toolrelay"):
        final_message(data)
    assert em.close(full_turn()) == b"" and em.close_terminal("again") == b""


def test_it_answers_exhaustion_with_a_terminal_text_block_and_end_turn() -> None:
    em = emitter()
    data = em.open() + em.text(0, "reasoning", "hmm") + em.text(0, "content", "Let me") + em.close_exhausted(
        "[toolrelay] failed")
    message = final_message(data)
    assert [b.type for b in message.content] == ["thinking", "text", "text"]
    assert message.content[2].text == "[toolrelay] failed"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    assert not any(b.type == "tool_use" for b in message.content)


def test_it_makes_tool_ids_safe_and_unique() -> None:
    """Anthropic requires ``tool_use.id`` to match ``^[a-zA-Z0-9_-]+$`` (PROTOCOLS.md 2.7)."""
    calls = [ToolCall("call.1/x", "f", "{}"), ToolCall("", "f", "{}"), ToolCall("call_1_x", "f", "{}"),
             ToolCall("call.1/x", "f", "{}")]
    message = final_message(stream(emitter(), Turn(choices=[ChoiceTurn(tool_calls=calls)])))
    ids = [b.id for b in message.content]  # type: ignore[union-attr]
    assert ids[0] == "call_1_x" and ids[2] == "call_1_x_2" and ids[3] == "call_1_x_3"
    assert ids[1].startswith("toolu_")
    assert all(c.isalnum() or c in "_-" for i in ids for c in i)


def test_it_maps_shortened_tool_names_back() -> None:
    long_name = "mcp__server__" + "x" * 70
    translation = translate_messages({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                                      "tools": [{"name": long_name, "input_schema": {"type": "object"}}]})
    short = translation.body["tools"][0]["function"]["name"]
    turn = Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c1", short, "{}")], finish_reason="tool_calls")])
    em = emitter(tool_names=translation.tool_names)
    assert final_message(stream(em, turn)).content[0].name == long_name  # type: ignore[union-attr]
    assert emitter(tool_names=translation.tool_names).complete(turn)["content"][0]["name"] == long_name


def test_it_splits_long_arguments_into_fragments_that_concatenate_back() -> None:
    arguments = json.dumps({"text": "y" * (ARGUMENT_SLICE * 2 + 10)})
    data = stream(emitter(), Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c", "write", arguments)])]))
    fragments = [d["delta"]["partial_json"] for n, d in events(data) if d.get("delta", {}).get("type") ==
                 "input_json_delta"]
    assert len(fragments) == 3 and "".join(fragments) == arguments
    assert final_message(data).content[0].input == json.loads(arguments)  # type: ignore[union-attr]


def test_it_ignores_other_choices_and_empty_deltas() -> None:
    em = emitter()
    assert em.text(0, "content", "") == b""
    em.open()
    assert em.text(1, "content", "other choice") == b""


def test_it_renders_a_non_stream_message_the_sdk_parses() -> None:
    body = emitter().complete(full_turn())
    with sdk_client(json.dumps(body).encode(), content_type="application/json") as client:
        message = client.messages.create(model="my-model", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert message.content[0].signature == thinking_signature("The user wants the weather in two cities.")  # type: ignore[union-attr]
    assert message.content[3].input == {"city": "Rome", "unit": "celsius"}  # type: ignore[union-attr]
    assert (message.stop_reason, message.usage.input_tokens, message.usage.output_tokens) == ("tool_use", 100, 30)


def test_it_renders_the_non_stream_exhaustion_answer() -> None:
    body = emitter().complete_exhausted("[toolrelay] no luck")
    message = Message.model_validate(body)
    assert [b.type for b in message.content] == ["text"] and message.stop_reason == "end_turn"


@pytest.mark.parametrize(("status", "kind", "exception"), [
    (400, "invalid_request_error", anthropic.BadRequestError),
    (401, "authentication_error", anthropic.AuthenticationError),
    (403, "permission_error", anthropic.PermissionDeniedError),
    (404, "not_found_error", anthropic.NotFoundError),
    (413, "request_too_large", anthropic.RequestTooLargeError),
    (429, "rate_limit_error", anthropic.RateLimitError),
    (500, "api_error", anthropic.InternalServerError),
    (502, "api_error", anthropic.InternalServerError),
    (504, "api_error", anthropic.InternalServerError),
    (529, "overloaded_error", anthropic.OverloadedError),
])
def test_it_shapes_http_errors_like_anthropic(status: int, kind: str, exception: type[Exception]) -> None:
    """PROTOCOLS.md 2.4: the body shape and the status -> type mapping; the SDK raises the typed error."""
    body = emitter().error_body(status, "nope", type="whatever", param="model")
    assert body == {"type": "error", "error": {"type": kind, "message": "model: nope"}}
    assert error_type(status) == kind
    with sdk_client(json.dumps(body).encode(), status=status, content_type="application/json") as client:
        with pytest.raises(exception) as caught:
            client.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}])
    assert caught.value.body == body  # type: ignore[attr-defined]


def test_it_sends_one_ascii_json_document_per_data_line() -> None:
    """PROTOCOLS.md section 0 item 7: ``ensure_ascii``, no raw U+2028 / newlines inside data, no BOM."""
    text = "Grüße\u2028line\nnext \U0001f600"
    em = emitter()
    data = em.open() + em.text(0, "reasoning", text) + em.text(0, "content", text) + em.close(
        Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c", "f", json.dumps({"t": text}, ensure_ascii=False))])]))
    assert data.isascii() and not data.startswith(b"\xef\xbb\xbf")
    message = final_message(data)
    assert message.content[0].thinking == text and message.content[1].text == text  # type: ignore[union-attr]
    assert message.content[2].input == {"t": text}  # type: ignore[union-attr]


def test_a_non_stream_message_has_no_blank_text_block_before_a_tool_use() -> None:
    """Claude Code falls back to ``stream: false`` and renders a blank text block too (issue 13)."""
    turn = Turn(choices=[ChoiceTurn(content="\n\n", tool_calls=[ToolCall("c", "f", "{}")], finish_reason="tool_calls")])
    assert [b["type"] for b in emitter().complete(turn)["content"]] == ["tool_use"]
    plain = Turn(choices=[ChoiceTurn(content="\n", finish_reason="stop")])
    assert emitter().complete(plain)["content"] == [{"type": "text", "text": "\n"}]


def test_it_carries_the_cache_fields_of_every_upstream_family() -> None:
    """Issue 19 item 1: DeepSeek's hit/miss and Qwen's cache writes reach Claude Code as Anthropic's cache
    fields (``input_tokens`` without them); ``message_start`` carries the request's input estimate."""
    usage = {"prompt_tokens": 1000, "completion_tokens": 20, "prompt_cache_hit_tokens": 700,
             "prompt_cache_miss_tokens": 300, "prompt_tokens_details": {"cache_creation_input_tokens": 200}}
    em = AnthropicMessagesEmitter(model="claude", input_tokens=987)
    data = stream(em, Turn(choices=[ChoiceTurn(content="hi", finish_reason="stop")], usage=usage))
    start = next(d for name, d in events(data) if name == "message_start")
    assert start["message"]["usage"]["input_tokens"] == 987
    delta = next(d for name, d in events(data) if name == "message_delta")
    assert delta["usage"] == {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 700,
                              "cache_creation_input_tokens": 200}
    final = final_message(data).usage
    assert (final.cache_read_input_tokens, final.cache_creation_input_tokens) == (700, 200)


def test_it_starts_with_the_upstreams_early_prompt_count_and_never_after_the_start() -> None:
    """``message_start`` carries an early upstream usage (cache reads apart); a usage without a prompt
    count, or one after the stream opened, leaves it as it was (issue 23 item 3)."""
    from proxy.guard.protocols.emit_anthropic import AnthropicMessagesEmitter

    emitter = AnthropicMessagesEmitter(model="m", input_tokens=50)
    emitter.early_usage({"completion_tokens": 3})
    emitter.early_usage({"prompt_tokens": 900, "completion_tokens": 1,
                         "prompt_tokens_details": {"cached_tokens": 600}})
    start = json.loads(emitter.open().split(b"data: ", 1)[1])["message"]["usage"]
    assert start == {"input_tokens": 300, "output_tokens": 0, "cache_creation_input_tokens": 0,
                     "cache_read_input_tokens": 600}
    emitter.early_usage({"prompt_tokens": 5})
    assert emitter.open() == b""
    plain = AnthropicMessagesEmitter(model="m", input_tokens=50)
    plain.early_usage({"completion_tokens": 3})
    assert json.loads(plain.open().split(b"data: ", 1)[1])["message"]["usage"]["input_tokens"] == 50
