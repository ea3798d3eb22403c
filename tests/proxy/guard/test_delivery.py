"""``Delivery``: what a guarded client has been sent, what is held, and what a retry may still send.

Sans-IO: no server, no event loop, no database.
"""

from __future__ import annotations

from proxy.guard.decisions.attempt import AttemptGuard
from proxy.guard.decisions.delivery import Delivery
from proxy.guard.events import Done, TextDelta
from proxy.guard.policy import GuardPolicy
from proxy.guard.turn import ChoiceTurn, RequestSpec, ToolCall, ToolSpec, Turn

TOOLS = RequestSpec(tools=(ToolSpec("get_weather", {"type": "object"}),))


def text_turn(*texts: str) -> Turn:
    return Turn(choices=[ChoiceTurn(index=i, content=t, finish_reason="stop") for i, t in enumerate(texts)])


def call_turn() -> Turn:
    return Turn(choices=[ChoiceTurn(index=0, tool_calls=[ToolCall("call_1", "get_weather", "{}")],
                                    finish_reason="tool_calls")])


def delta(text: str, choice: int = 0, channel: str = "content") -> TextDelta:
    return TextDelta(choice, channel, text)  # type: ignore[arg-type]


def test_it_streams_the_first_attempts_text_live() -> None:
    """With streaming on, every delta of the first attempt goes out at once and nothing is held."""
    d = Delivery(stream_text=True)
    d.begin()
    assert d.offer(delta("Hel")) == delta("Hel") and d.offer(delta("lo")) == delta("lo")
    assert d.settle(text_turn("Hello")) == []
    assert d.sent(0, "content") == "Hello" and d.sent_text


def test_it_holds_text_until_the_end_when_streaming_is_off() -> None:
    """``stream_text=False``: every delta is held and comes out, in order, when the turn settles; the
    guard still releases every safe delta at once (holding is the delivery's rule, not the guard's)."""
    guard = AttemptGuard(TOOLS, GuardPolicy(stream_text=False))
    body = (b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"abc"}}]}\n\n'
            b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n')
    released = [e for e in guard.feed(body) if isinstance(e, TextDelta)]
    assert [e.text for e in released] == ["abc"]
    assert isinstance(guard.finish()[-1], Done)
    d = Delivery(stream_text=False)
    d.begin()
    assert [d.offer(e) for e in released] == [None]
    assert [e.text for e in d.settle(text_turn("abc"))] == ["abc"]


def test_it_drops_what_a_failed_attempt_held() -> None:
    """Text held by an attempt that is then retried never reaches the client."""
    d = Delivery(stream_text=False)
    d.begin()
    d.offer(delta("broken"))
    d.begin()
    d.offer(delta("good"))
    assert [e.text for e in d.settle(text_turn("good"))] == ["good"]


def test_it_sends_only_the_tool_calls_of_a_retry_after_text_was_streamed() -> None:
    """After streamed text, a retry's choice with tool calls sends none of its own text."""
    d = Delivery(stream_text=True)
    d.begin()
    d.offer(delta("Let me check"))
    d.begin()
    assert d.offer(delta("Something else")) is None, "a retry after streamed text is held"
    assert d.settle(call_turn()) == []
    assert d.sent(0, "content") == "Let me check"


def test_it_continues_text_after_a_retry_minus_the_common_prefix() -> None:
    """A text-only retry sends what the client does not have yet (the common prefix is not repeated)."""
    d = Delivery(stream_text=True)
    d.begin()
    d.offer(delta("Hello wor"))
    d.begin()
    d.offer(delta("Hello world"))
    d.offer(delta(", done."))
    assert [e.text for e in d.settle(text_turn("Hello world, done."))] == ["ld, done."]
    assert d.sent(0, "content") == "Hello world, done."


def test_it_keeps_choices_and_channels_apart_after_a_retry() -> None:
    """The prefix rule is per choice and channel; a diverging retry sends its whole remainder."""
    d = Delivery(stream_text=True)
    d.begin()
    d.offer(delta("think", channel="reasoning"))
    d.offer(delta("A", choice=1))
    d.begin()
    for e in (delta("thinking more", channel="reasoning"), delta("B", choice=1)):
        d.offer(e)
    out = {(e.choice, e.channel): e.text for e in d.settle(text_turn("", "B"))}
    assert out == {(0, "reasoning"): "ing more", (1, "content"): "B"}


def test_it_sets_the_exhaustion_answer_apart_only_after_text() -> None:
    """The exhaustion message gets a blank line before it only when the client already has text."""
    d = Delivery(stream_text=True)
    d.begin()
    assert d.exhaustion_separator() == ""
    d.offer(delta("Working on it"))
    assert d.exhaustion_separator() == "\n\n"
