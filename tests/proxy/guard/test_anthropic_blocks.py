"""The Anthropic content-block state machine, through the emitter, checked three ways.

Any sequence of text / reasoning / refusal deltas (blank ones included), keep-alives, other
choices' deltas and any ending (a turn with 0-3 tool calls and any finish reason and usage, the
exhaustion answer, an error) gives a stream that (1) obeys the grammar written from PROTOCOLS.md
2.3 (``tests.protocol_grammar``), (2) anthropic-python's own accumulator (``accumulate_event``, and
``MessageStream`` through the SDK client) rebuilds into exactly the content the grammar checker
saw, and (3) carries exactly the text and reasoning it was given, in order, with blank text moved
but never lost except right before a tool_use (issue 13).
"""

from __future__ import annotations

import json
from typing import Any

from anthropic.lib.streaming._messages import accumulate_event
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.protocols.anthropic_blocks import ContentBlocks, thinking_signature
from proxy.guard.protocols.emit_anthropic import AnthropicMessagesEmitter, stop_reason
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn, UpstreamError
from tests.protocol_grammar import anthropic_content
from tests.proxy.guard.test_emit_anthropic import events, final_message

USAGE = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}
BLANKS = [" ", "\n", "\n\n", " \t ", "\r\n"]


def emitter() -> AnthropicMessagesEmitter:
    return AnthropicMessagesEmitter(model="m", message_id="msg_x")


def run(steps: list[tuple[Any, ...]], end: str, turn: Turn) -> bytes:
    em = emitter()
    out = [em.open()]
    for step in steps:
        if step[0] == "keepalive":
            out.append(em.keepalive())
        else:
            _, choice, channel, text = step
            out.append(em.text(choice, channel, text))
    if end == "close":
        out.append(em.close(turn))
    elif end == "exhausted":
        out.append(em.close_exhausted("[toolrelay] gave up"))
    else:
        out.append(em.close_error(UpstreamError(502, "broke off")))
    return b"".join(out)


def sdk_content(data: bytes) -> list[dict[str, Any]]:
    """The content ``accumulate_event`` builds (the SDK's accumulator, PROTOCOLS.md 2.3)."""
    snapshot = None
    bufs: dict[int, bytes] = {}
    for name, obj in events(data):
        if name in ("ping", "error"):
            continue
        snapshot = accumulate_event(event=obj, current_snapshot=snapshot, json_bufs=bufs)  # type: ignore[arg-type]
    assert snapshot is not None
    return [{k: v for k, v in b.to_dict().items() if k in ("type", "text", "thinking", "signature", "id", "name",
                                                             "input")} for b in snapshot.content]


def labelled(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(block kind, character) for every non-blank character, in order."""
    return [(kind, c) for kind, text in pairs for c in text if not c.isspace()]


def is_whitespace_deletion(full: str, kept: str) -> bool:
    """``kept`` is ``full`` with some whitespace characters removed (nothing else)."""
    k = 0
    for c in full:
        if k < len(kept) and kept[k] == c:
            k += 1
        elif not c.isspace():
            return False
    return k == len(kept)


_piece = st.one_of(st.text(max_size=6), st.sampled_from(BLANKS))
_delta = st.tuples(st.just("delta"), st.sampled_from([0, 0, 0, 1]), st.sampled_from(["content", "reasoning",
                                                                                    "refusal"]), _piece)
_step = st.one_of(_delta, _delta, _delta, st.tuples(st.just("keepalive")))
_call = st.builds(ToolCall, id=st.sampled_from(["call_1", "call.2/x", "", "toolu_9"]),
                  name=st.sampled_from(["Read", "Bash"]),
                  arguments=st.dictionaries(st.sampled_from(["a", "path"]), st.integers() | st.text(max_size=4),
                                            max_size=2).map(json.dumps))
_finish = st.sampled_from(["stop", "length", "tool_calls", "content_filter", None])
_turn = st.builds(lambda calls, finish, usage: Turn(choices=[ChoiceTurn(tool_calls=calls, finish_reason=finish)],
                                                    usage=usage),
                  st.lists(_call, max_size=3), _finish, st.sampled_from([None, USAGE]))


@settings(max_examples=400, deadline=None)
@given(steps=st.lists(_step, max_size=14), end=st.sampled_from(["close", "close", "exhausted", "error"]), turn=_turn)
def test_any_delta_sequence_and_ending_gives_a_grammatical_stream_with_all_its_content(
        steps: list[tuple[Any, ...]], end: str, turn: Turn) -> None:
    data = run(steps, end, turn)
    content, reason = anthropic_content(events(data))
    assert sdk_content(data) == content, "the SDK's accumulator rebuilds exactly what the grammar saw"
    mine = [s for s in steps if s[0] == "delta" and s[1] == 0 and s[3]]
    reasoning = "".join(s[3] for s in mine if s[2] == "reasoning")
    visible = "".join(s[3] for s in mine if s[2] != "reasoning")
    texts = [b["text"] for b in content if b["type"] == "text"]
    thinking = [b for b in content if b["type"] == "thinking"]
    assert "".join(b["thinking"] for b in thinking) == reasoning
    cut = end == "error" and bool(content) and content[-1]["type"] == "thinking"  # cut before its signature
    assert all(b["signature"] == thinking_signature(b["thinking"]) for b in thinking[: len(thinking) - cut])
    expected_pairs = [("thinking" if s[2] == "reasoning" else "text", s[3]) for s in mine]
    calls = turn.choices[0].tool_calls if end == "close" else []
    if end == "exhausted":
        expected_pairs.append(("text", "[toolrelay] gave up"))
        visible += "[toolrelay] gave up"
    got_pairs = [(b["type"], b.get("text", b.get("thinking", ""))) for b in content if b["type"] != "tool_use"]
    assert labelled(got_pairs) == labelled(expected_pairs), "every non-blank character, in order, in its block kind"
    if end == "error":
        assert visible.startswith("".join(texts)) and not visible[len("".join(texts)):].strip()
        assert reason is None
    elif calls:
        assert is_whitespace_deletion(visible, "".join(texts))
        assert [(b["name"], b["input"]) for b in content if b["type"] == "tool_use"] == [
            (c.name, json.loads(c.arguments)) for c in calls]
        assert content[-len(calls):] == [b for b in content if b["type"] == "tool_use"], "tool_use blocks come last"
        assert reason == "tool_use"
    else:
        assert "".join(texts) == visible, "without a tool call no text is lost, blank or not"
        refused = any(s[2] == "refusal" for s in mine)
        assert reason == ("end_turn" if end == "exhausted" else stop_reason(turn.choices[0], refused=refused))


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(_step, max_size=10), turn=_turn)
def test_the_sdks_message_stream_accepts_every_finished_stream(steps: list[tuple[Any, ...]], turn: Turn) -> None:
    data = run(steps, "close", turn)
    message = final_message(data)
    content, reason = anthropic_content(events(data))
    assert message.stop_reason == reason
    assert [b.type for b in message.content] == [b["type"] for b in content]


def test_it_holds_blank_text_and_drops_it_before_a_tool_use() -> None:
    """Claude Code renders a blank text block before a tool call (issue 13)."""
    em = emitter()
    data = em.open() + em.text(0, "content", "\n\n") + em.text(0, "content", " ")
    assert b"content_block_start" not in data, "blank text opens no block while it is held"
    data += em.close(Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c1", "Read", '{"path":"a"}')],
                                              finish_reason="tool_calls")]))
    content, reason = anthropic_content(events(data))
    assert [b["type"] for b in content] == ["tool_use"] and reason == "tool_use"


def test_it_releases_held_blank_text_as_the_start_of_the_next_text_block() -> None:
    em = emitter()
    data = em.open() + em.text(0, "content", "\n") + em.text(0, "reasoning", "think") + em.text(0, "content", "Hi")
    data += em.close(Turn(choices=[ChoiceTurn(finish_reason="stop")]))
    content, _ = anthropic_content(events(data))
    assert [(b["type"], b.get("text", b.get("thinking"))) for b in content] == [("thinking", "think"), ("text", "\nHi")]


def test_it_keeps_a_thinking_block_open_across_a_stray_blank_text_delta() -> None:
    em = emitter()
    data = em.open() + em.text(0, "reasoning", "a") + em.text(0, "content", " ") + em.text(0, "reasoning", "b")
    data += em.close(Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c", "Read", "{}")])]))
    content, _ = anthropic_content(events(data))
    assert [b["type"] for b in content] == ["thinking", "tool_use"] and content[0]["thinking"] == "ab"


def test_it_sends_blank_text_at_the_end_of_a_turn_without_tool_calls() -> None:
    em = emitter()
    data = em.open() + em.text(0, "reasoning", "r") + em.text(0, "content", "\n") + em.close(
        Turn(choices=[ChoiceTurn(finish_reason="stop")]))
    content, reason = anthropic_content(events(data))
    assert content[1] == {"type": "text", "text": "\n"} and reason == "end_turn"


def test_the_state_machine_never_opens_two_blocks_and_numbers_them_contiguously() -> None:
    blocks = ContentBlocks()
    out = blocks.text("a") + blocks.thinking("b") + blocks.text(" ") + blocks.text("c") + blocks.tool_use(
        "t", "f", "{}") + blocks.thinking("d") + blocks.stop()
    names = [n for n, _ in events(out)]
    assert names.count("content_block_start") == names.count("content_block_stop") == 5
    assert blocks.count == 5 and blocks.held == ""
