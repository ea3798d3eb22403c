"""The OpenAI Chat emitter, checked by openai-python itself.

Every stream is decoded with the SDK's own SSE decoder and accumulated by its
``ChatCompletionStreamState`` (PROTOCOLS.md 1.7), and every chunk is validated as a
``ChatCompletionChunk``; the canonical-form rules of PROTOCOLS.md section 0 are asserted on the
raw bytes and chunks.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder  # the SDK's decoder (private, but the one clients run)
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from proxy.guard.events import Channel
from proxy.guard.protocols.emit_openai import ARGUMENT_SLICE, OpenAIChatEmitter
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn, UpstreamError

USAGE = {"prompt_tokens": 76, "completion_tokens": 24, "total_tokens": 100,
         "completion_tokens_details": {"reasoning_tokens": 0}}


def emitter(include_usage: bool = False, **kwargs: Any) -> OpenAIChatEmitter:
    """An emitter with a fixed id and time."""
    return OpenAIChatEmitter(model="gpt-test", include_usage=include_usage,
                             completion_id=kwargs.pop("completion_id", "chatcmpl-test"),
                             created=kwargs.pop("created", 1700000000), **kwargs)


def pieces(text: str, size: int = 3) -> list[str]:
    """``text`` cut into ``size``-character pieces."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream(em: OpenAIChatEmitter, turn: Turn, size: int = 3, order: list[int] | None = None) -> bytes:
    """The whole stream for ``turn``: text through ``text()`` (choices interleaved), then ``close``."""
    out = [em.open()]
    deltas: list[tuple[int, Channel, str]] = []
    for choice in turn.choices:
        for channel, text in (("reasoning", choice.reasoning), ("refusal", choice.refusal),
                              ("content", choice.content)):
            deltas += [(choice.index, channel, p) for p in pieces(text or "", size)]  # type: ignore[misc]
    if order is not None:  # interleave: take deltas choice by choice in ``order``
        deltas.sort(key=lambda d: order.index(d[0]))
    out += [em.text(c, ch, t) for c, ch, t in deltas]
    out.append(em.close(turn))
    return b"".join(out)


def sse_data(data: bytes) -> list[str]:
    """The data of every SSE event, decoded by openai-python."""
    return [sse.data for sse in SSEDecoder().iter_bytes(iter([data]))]


def chunks(data: bytes) -> list[dict[str, Any]]:
    """The JSON chunks before ``[DONE]``, each validated as a ChatCompletionChunk."""
    out = []
    for item in sse_data(data):
        if item.startswith("[DONE]"):
            break
        obj = json.loads(item)
        ChatCompletionChunk.model_validate(obj)
        out.append(obj)
    return out


def accumulate(data: bytes) -> ChatCompletion:
    """The completion openai-python's ChatCompletionStreamState builds from the stream.

    ``get_final_completion()`` raises ``LengthFinishReasonError`` / ``ContentFilterFinishReasonError``
    by design for those finish reasons (``lib/_parsing/_completions.py``), so such turns are
    compared on the accumulated snapshot instead.
    """
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for obj in chunks(data):
        state.handle_chunk(ChatCompletionChunk.model_validate(obj))
    snapshot = state.current_completion_snapshot
    if any(c.finish_reason in ("length", "content_filter") for c in snapshot.choices):
        return snapshot
    return state.get_final_completion()


def assert_canonical(data: bytes, include_usage: bool) -> None:
    """PROTOCOLS.md section 0 / 1.3-1.5 on the raw stream."""
    assert data.isascii()
    lines = data.split(b"\n")
    assert not [line for line in lines if line.startswith((b"event:", b"id:", b"retry:"))]
    assert data.endswith(b"data: [DONE]\n\n") and data.count(b"[DONE]") == 1
    assert sse_data(data)[-1] == "[DONE]"
    objs = chunks(data)
    assert len({(o["id"], o["created"], o["model"], o["object"]) for o in objs}) == 1
    assert objs[0]["object"] == "chat.completion.chunk"
    assert_usage_placement(objs, include_usage)
    for index in {c["index"] for o in objs for c in o["choices"]}:
        assert_choice_canonical([c for o in objs for c in o["choices"] if c["index"] == index])


def assert_usage_placement(objs: list[dict[str, Any]], include_usage: bool) -> None:
    """With include_usage: ``usage: null`` everywhere but a last ``choices: []`` chunk; else no usage."""
    if not include_usage:
        assert all("usage" not in o for o in objs)
        return
    assert objs[-1]["choices"] == [] and isinstance(objs[-1]["usage"], dict)
    assert all(o["usage"] is None and o["choices"] for o in objs[:-1])


def assert_choice_canonical(entries: list[dict[str, Any]]) -> None:
    """Role once and first; tool headers then argument-only deltas; one separate finish chunk last."""
    assert entries[0]["delta"]["role"] == "assistant"
    assert sum("role" in e["delta"] for e in entries) == 1
    finishes = [e for e in entries if e.get("finish_reason")]
    assert finishes == [entries[-1]] and entries[-1]["delta"] == {}
    seen: list[int] = []
    for e in entries:
        for tc in e["delta"].get("tool_calls", []):
            assert "function" in tc
            if tc["index"] in seen:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
            else:
                assert tc["index"] == len(seen)  # contiguous from 0
                assert tc["type"] == "function" and tc["id"] and tc["function"]["name"]
                assert tc["function"]["arguments"] == ""  # never a parseable placeholder
                seen.append(tc["index"])


def assert_same(final: ChatCompletion, turn: Turn, include_usage: bool) -> None:
    """The accumulated completion equals the turn (content ``""`` and None are the same)."""
    assert [c.index for c in final.choices] == [c.index for c in turn.choices]
    for got, want in zip(final.choices, turn.choices, strict=True):
        assert (got.message.content or None) == (want.content or None)
        assert (got.message.refusal or None) == (want.refusal or None)
        assert (getattr(got.message, "reasoning_content", None) or None) == (want.reasoning or None)
        assert got.message.role == "assistant"
        calls = [(c.id, c.function.name, c.function.arguments) for c in got.message.tool_calls or []]
        assert calls == [(c.id, c.name, c.arguments) for c in want.tool_calls]
        assert got.finish_reason == want.finish_reason
    if include_usage:
        assert final.usage is not None
        assert final.usage.model_dump(exclude_none=True) == (turn.usage or {
            "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0})
    else:
        assert final.usage is None


def roundtrip(turn: Turn, include_usage: bool = False, **kwargs: Any) -> ChatCompletion:
    """Stream ``turn``, check the canonical form, accumulate and compare; return the completion."""
    data = stream(emitter(include_usage), turn, **kwargs)
    assert_canonical(data, include_usage)
    final = accumulate(data)
    assert_same(final, turn, include_usage)
    return final


def weather(call_id: str = "call_0001", city: str = "Paris") -> ToolCall:
    """A get_weather call."""
    return ToolCall(call_id, "get_weather", json.dumps({"city": city}, separators=(",", ":")))


def test_it_streams_text_that_openai_python_accumulates() -> None:
    """A text turn: OpenAI's ``{"role","content":""}`` opener, text deltas, finish stop, [DONE]."""
    turn = Turn(choices=[ChoiceTurn(content="Hello, world! How are you?", finish_reason="stop")])
    roundtrip(turn)
    first = chunks(stream(emitter(), turn))[0]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_it_sends_usage_only_when_asked() -> None:
    """include_usage: a final ``choices: []`` usage chunk; without it, no usage anywhere."""
    turn = Turn(choices=[ChoiceTurn(content="hi", finish_reason="stop")], usage=USAGE)
    roundtrip(turn, include_usage=True)
    roundtrip(turn, include_usage=False)


def test_it_sends_zero_usage_when_asked_and_unknown() -> None:
    """A client that asked for usage gets a well-formed usage chunk even when the upstream sent none."""
    final = roundtrip(Turn(choices=[ChoiceTurn(content="hi", finish_reason="stop")]), include_usage=True)
    assert final.usage is not None and final.usage.total_tokens == 0


def test_it_streams_a_tool_call_as_header_then_arguments() -> None:
    """One call: header delta with id/type/name and empty arguments, then the argument text."""
    turn = Turn(choices=[ChoiceTurn(tool_calls=[weather()], finish_reason="tool_calls")], usage=USAGE)
    roundtrip(turn, include_usage=True)
    objs = chunks(stream(emitter(), turn))
    assert objs[0]["choices"][0]["delta"] == {"role": "assistant", "tool_calls": [
        {"index": 0, "id": "call_0001", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}
    assert objs[1]["choices"][0]["delta"] == {"tool_calls": [
        {"index": 0, "function": {"arguments": '{"city":"Paris"}'}}]}


def test_it_streams_parallel_calls_with_contiguous_indexes() -> None:
    """Two calls in one choice: indexes 0 and 1, each with its own header."""
    turn = Turn(choices=[ChoiceTurn(tool_calls=[weather("call_1"), weather("call_2", "Rome")],
                                    finish_reason="tool_calls")])
    final = roundtrip(turn)
    assert [c.id for c in final.choices[0].message.tool_calls or []] == ["call_1", "call_2"]


def test_it_streams_text_then_tool_calls() -> None:
    """Preamble text streamed live, the call at close: both reach the client."""
    turn = Turn(choices=[ChoiceTurn(content="Let me check the weather.", tool_calls=[weather()],
                                    finish_reason="tool_calls")])
    roundtrip(turn, include_usage=True)


def test_it_sends_empty_object_arguments_once() -> None:
    """A no-argument call: header with ``""`` then a single ``"{}"`` argument delta."""
    turn = Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("call_1", "list_files", "{}")],
                                    finish_reason="tool_calls")])
    roundtrip(turn)
    args = [tc["function"]["arguments"] for o in chunks(stream(emitter(), turn))
            for c in o["choices"] for tc in c["delta"].get("tool_calls", [])]
    assert args == ["", "{}"]


def test_it_slices_long_arguments() -> None:
    """Arguments longer than ARGUMENT_SLICE go out in several deltas and reassemble exactly."""
    long_args = json.dumps({"content": "x" * (2 * ARGUMENT_SLICE + 10)})
    turn = Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("call_1", "write_file", long_args)],
                                    finish_reason="tool_calls")])
    roundtrip(turn)
    assert len(chunks(stream(emitter(), turn))) == 1 + 3 + 1


def test_it_keeps_provider_extra_fields_on_the_first_delta() -> None:
    """``extra_content`` (Gemini thought signatures, C10) rides on the call's header delta only."""
    extra = {"extra_content": {"google": {"thought_signature": "sig=="}}}
    turn = Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("call_1", "get_weather", "{}", extra)],
                                    finish_reason="tool_calls")])
    final = roundtrip(turn)
    objs = chunks(stream(emitter(), turn))
    assert objs[0]["choices"][0]["delta"]["tool_calls"][0]["extra_content"] == extra["extra_content"]
    assert "extra_content" not in objs[1]["choices"][0]["delta"]["tool_calls"][0]
    call = (final.choices[0].message.tool_calls or [])[0]
    assert (call.model_extra or {})["extra_content"] == extra["extra_content"]


def test_it_streams_two_choices() -> None:
    """n=2 with text and calls, choice 1 speaking first: both accumulate by index."""
    turn = Turn(choices=[
        ChoiceTurn(index=0, content="Zero.", tool_calls=[weather("call_a")], finish_reason="tool_calls"),
        ChoiceTurn(index=1, content="One speaks first.", finish_reason="stop"),
    ], usage=USAGE)
    roundtrip(turn, include_usage=True, order=[1, 0])


def test_it_opens_lower_choices_first() -> None:
    """Choice 1 cannot open before choice 0 (openai-python indexes its snapshot by position)."""
    em = emitter()
    objs = chunks(em.text(1, "content", "hi") + em.close(Turn()))
    assert [(c["index"], c["delta"]) for c in [o["choices"][0] for o in objs[:2]]] == [
        (0, {"role": "assistant"}), (1, {"role": "assistant", "content": ""})]


def test_it_streams_reasoning_and_refusal_channels() -> None:
    """``reasoning`` goes out as ``reasoning_content`` (DeepSeek), ``refusal`` as ``refusal``."""
    roundtrip(Turn(choices=[ChoiceTurn(reasoning="Thinking it over.", content="Done.", finish_reason="stop")]))
    roundtrip(Turn(choices=[ChoiceTurn(refusal="I can't help with that.", finish_reason="stop")]))


def test_it_escapes_non_ascii_and_line_separators() -> None:
    """Non-ASCII, U+2028/U+2029 and newlines go out escaped (ASCII-only bytes) and round-trip."""
    text = "München \u2028 line\u2029 😀 \n\r tab\t \x00"
    args = json.dumps({"city": "Zürich\u2028"}, ensure_ascii=False)
    roundtrip(Turn(choices=[ChoiceTurn(content=text, tool_calls=[ToolCall("c1", "get_weather", args)],
                                       finish_reason="tool_calls")]))


def test_it_defaults_the_finish_reason() -> None:
    """A choice without a finish reason ends with ``tool_calls`` when it has calls, else ``stop``."""
    em = emitter()
    objs = chunks(em.close(Turn(choices=[ChoiceTurn(tool_calls=[weather()]), ChoiceTurn(index=1)])))
    assert [c["finish_reason"] for o in objs for c in o["choices"] if c.get("finish_reason")] == [
        "tool_calls", "stop"]


def test_it_sends_keepalive_comments() -> None:
    """Keep-alives are SSE comments the SDK ignores."""
    em = emitter()
    data = em.keepalive() + em.text(0, "content", "hi") + em.keepalive() + em.close(Turn(
        choices=[ChoiceTurn(content="hi", finish_reason="stop")]))
    assert data.startswith(b": keepalive\n\n")
    assert accumulate(data).choices[0].message.content == "hi"


def test_it_sends_nothing_after_close() -> None:
    """After the terminator every call returns nothing."""
    em = emitter()
    em.close(Turn(choices=[ChoiceTurn(content="x", finish_reason="stop")]))
    assert em.text(0, "content", "late") == b""
    assert em.keepalive() == b""
    assert em.close(Turn()) == b""
    assert em.close_exhausted("x") == b""
    assert em.close_error(UpstreamError(502, "x")) == b""


def test_it_uses_one_generated_completion_id() -> None:
    """Without an id, one ``chatcmpl-`` id is generated and used on every chunk."""
    em = OpenAIChatEmitter(model="m", include_usage=True)
    objs = chunks(em.text(0, "content", "a") + em.close(Turn(choices=[ChoiceTurn(content="a")])))
    assert len({o["id"] for o in objs}) == 1 and objs[0]["id"].startswith("chatcmpl-")
    assert isinstance(objs[0]["created"], int)


def test_it_sends_the_system_fingerprint_when_given() -> None:
    """``system_fingerprint`` appears on every chunk only when given."""
    em = emitter(system_fingerprint="fp_1")
    objs = chunks(em.close(Turn(choices=[ChoiceTurn(content=None, finish_reason="stop")])))
    assert all(o["system_fingerprint"] == "fp_1" for o in objs)
    assert "system_fingerprint" not in chunks(emitter().close(Turn()))[0]


def test_it_closes_exhausted_retries_with_a_message() -> None:
    """The exhaustion answer: the message as content, finish stop, [DONE]; after live text too."""
    em = emitter(include_usage=True)
    data = em.text(0, "content", "Checking. ") + em.close_exhausted("The upstream failed 3 times.")
    assert_canonical(data, include_usage=True)
    final = accumulate(data)
    assert final.choices[0].message.content == "Checking. The upstream failed 3 times."
    assert final.choices[0].finish_reason == "stop"
    assert not final.choices[0].message.tool_calls


def test_it_closes_with_an_in_stream_error_and_no_done() -> None:
    """``data: {"error":{message,type,param:null,code}}`` and the stream ends, without ``[DONE]``."""
    em = emitter()
    data = em.text(0, "content", "hi") + em.close_error(
        UpstreamError(502, "Provider disconnected", type="server_error", code="server_error"))
    events = sse_data(data)
    assert json.loads(events[-1]) == {"error": {"message": "Provider disconnected", "type": "server_error",
                                                "param": None, "code": "server_error"}}
    assert b"[DONE]" not in data and data.endswith(b"}\n\n") and data.isascii()


def test_the_terminal_error_is_an_error_chunk_openai_python_raises() -> None:
    """``close_terminal``: the error chunk with code ``upstream_failed``, no finish reason, no ``[DONE]``."""
    em = emitter()
    data = em.text(0, "content", "hi") + em.close_terminal("[toolrelay] failed")
    assert json.loads(sse_data(data)[-1]) == {"error": {"message": "[toolrelay] failed", "type": "upstream_error",
                                                        "param": None, "code": "upstream_failed"}}
    assert b"[DONE]" not in data and b"finish_reason\":\"" not in data
    assert em.close_terminal("again") == b""


def test_it_builds_a_valid_non_stream_completion() -> None:
    """``complete(turn)`` validates as ChatCompletion (PROTOCOLS.md 1.2)."""
    em = emitter()
    turn = Turn(choices=[ChoiceTurn(content="Let me check.", reasoning="hm", tool_calls=[weather()],
                                    finish_reason="tool_calls")], usage=USAGE)
    body = em.complete(turn)
    completion = ChatCompletion.model_validate(body)
    message = completion.choices[0].message
    assert message.role == "assistant" and message.content == "Let me check." and message.annotations == []
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        ("call_0001", "get_weather", '{"city":"Paris"}')]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None and completion.usage.total_tokens == 100
    assert body["object"] == "chat.completion" and body["id"] == "chatcmpl-test"
    assert "tool_calls" not in em.complete(Turn(choices=[ChoiceTurn(content="x")]))["choices"][0]["message"]


def test_it_builds_a_non_stream_exhaustion_answer() -> None:
    """``complete_exhausted`` is a plain assistant message with finish stop and usage."""
    completion = ChatCompletion.model_validate(emitter().complete_exhausted("It failed."))
    assert completion.choices[0].message.content == "It failed."
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None


def test_it_builds_openai_error_bodies() -> None:
    """``{"error":{message,type,param,code}}`` (PROTOCOLS.md 1.6)."""
    assert emitter().error_body(400, "bad", type="invalid_request_error") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}}
    assert emitter().error_body(429, "slow", type="rate_limit_error", param="model", code="rate_limit") == {
        "error": {"message": "slow", "type": "rate_limit_error", "param": "model", "code": "rate_limit"}}


_text = st.text(max_size=40)
_args = st.dictionaries(st.text(max_size=8), st.none() | st.integers() | st.text(max_size=12)
                        | st.lists(st.integers(), max_size=3), max_size=4).map(
    lambda d: json.dumps(d, ensure_ascii=False, separators=(",", ":")))
_call = st.builds(ToolCall, id=st.text(min_size=1, max_size=12), name=st.text(min_size=1, max_size=12),
                  arguments=_args)


@st.composite
def _turns(draw: st.DrawFn) -> Turn:
    """Random turns: 1-3 choices with optional text, reasoning, calls; usage or not."""
    choices = []
    for index in range(draw(st.integers(1, 3))):
        calls = draw(st.lists(_call, max_size=3))
        finish = draw(st.sampled_from(["stop", "length", "content_filter"] + (["tool_calls"] if calls else [])))
        choices.append(ChoiceTurn(index=index, content=draw(st.none() | _text), reasoning=draw(st.none() | _text),
                                  tool_calls=calls, finish_reason=finish))
    usage = draw(st.none() | st.builds(lambda p, c: {"prompt_tokens": p, "completion_tokens": c,
                                                     "total_tokens": p + c}, st.integers(0, 10**6),
                                       st.integers(0, 10**6)))
    return Turn(choices=choices, usage=usage)


@settings(max_examples=200, deadline=None)
@given(_turns(), st.booleans(), st.integers(1, 7), st.permutations([0, 1, 2]))
def test_it_roundtrips_random_turns_through_openai_python(turn: Turn, include_usage: bool, size: int,
                                                           order: list[int]) -> None:
    """Any turn, any text split and choice interleaving: openai-python accumulates exactly the turn."""
    roundtrip(turn, include_usage=include_usage, size=size, order=order)
