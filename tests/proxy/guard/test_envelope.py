"""Envelope tolerance by principle (issue 12, item 3; the rule is in ``proxy.guard.stream.accumulate``'s docstring).

Each case says the same thing as a canonical stream in another way and must come out as the canonical
turn with a finding -- or cannot be normalised without a guess and is retried.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.guard.decisions.attempt import guard_body
from proxy.guard.findings import Action, FindingKind
from proxy.guard.turn import Decision, Outcome

from .builders import MISSING, POLICY, TOOLS, call, choice, chunk, finish, kinds, sse, text, tools

K = FindingKind
W = '{"city": "Paris"}'
CANONICAL = sse(tools(call(0, "call_1", "get_weather", W)), finish())


def turn_of(d: Decision) -> tuple[Any, ...]:
    assert d.usable and d.turn is not None, d.reason
    c = d.turn.choices[0]
    return c.content, c.finish_reason, [(t.name, json.loads(t.arguments)) for t in c.tool_calls]


def variant(d: Decision, kind: FindingKind = K.ENVELOPE_VARIANT) -> bool:
    return any(f.kind is kind and f.action is Action.NORMALIZED for f in d.findings)


EXPECTED = turn_of(guard_body(CANONICAL, TOOLS, POLICY))


def test_another_envelope_shape_is_normalised_with_a_finding() -> None:
    message = {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": W}}]}
    cases = [
        sse(chunk(choice(MISSING, "tool_calls") | {"message": message})),  # a whole message in a stream
        sse({**chunk(), "choices": {"index": 0, "delta": {"tool_calls": [call(0, "call_1", "get_weather", W)]}}},
            finish()),  # choices as one object
        sse(chunk(choice({"tool_calls": call(0, "call_1", "get_weather", W)})), finish()),  # tool_calls as one object
    ]
    for body in cases:
        d = guard_body(body, TOOLS, POLICY)
        assert turn_of(d) == EXPECTED, body
        assert variant(d), body


def test_deprecated_fields_with_the_same_meaning_are_normalised() -> None:
    body = sse(chunk(choice({"function_call": {"name": "get_weather", "arguments": W}})), finish("function_call"))
    d = guard_body(body, TOOLS, POLICY)
    assert turn_of(d) == EXPECTED and variant(d)
    for alias, canonical in (("tool_use", "tool_calls"), ("end_turn", "stop"), ("max_tokens", "length")):
        body = sse(text("hi"), finish(alias)) if canonical != "tool_calls" else \
            sse(tools(call(0, "call_1", "get_weather", W)), finish(alias))
        d = guard_body(body, TOOLS, POLICY)
        assert d.turn is not None and d.turn.choices[0].finish_reason == canonical
        assert any(f.kind is K.ENVELOPE_VARIANT and alias in f.detail for f in d.findings)


def test_type_variants_of_known_fields_are_normalised() -> None:
    cases = [
        (sse(tools(call(0, "call_1", "get_weather", {"city": "Paris"})), finish()), K.ARGUMENTS_AS_JSON_OBJECT),
        (sse(tools(call("0", "call_1", "get_weather", W)), finish()), K.ENVELOPE_VARIANT),
        (sse(chunk({"index": "0", "delta": {"tool_calls": [call(0, "call_1", "get_weather", W)]},
                    "finish_reason": None}), finish()), K.ENVELOPE_VARIANT),
        (sse(tools(call(0, MISSING, "get_weather", W)), finish()), K.TOOL_CALL_ID_MISSING),
    ]
    for body, kind in cases:
        d = guard_body(body, TOOLS, POLICY)
        assert turn_of(d)[2] == EXPECTED[2], body
        assert variant(d, kind), body


def test_empty_and_meaningless_events_are_ignored_with_a_finding() -> None:
    body = sse({"id": "chatcmpl-1"}, chunk(), chunk(choice()), chunk(choice({"content": ""})),
               tools(call(0, "call_1", "get_weather", W)), finish())
    d = guard_body(body, TOOLS, POLICY)
    assert turn_of(d) == EXPECTED
    assert d.outcome is Outcome.NORMALIZED and {f.action for f in d.findings} <= {Action.IGNORED, Action.NORMALIZED}


def test_contradicting_signals_are_decided_by_what_was_assembled() -> None:
    d = guard_body(sse(tools(call(0, "call_1", "get_weather", W)), finish("stop")), TOOLS, POLICY)
    assert turn_of(d) == EXPECTED and K.FINISH_REASON_STOP_WITH_TOOL_CALLS in kinds(d)
    d = guard_body(sse(text("no call after all"), finish("tool_calls")), TOOLS, POLICY)
    assert turn_of(d) == ("no call after all", "stop", []) and variant(d)
    twice = sse(tools(call(0, "call_1", "get_weather", W)), tools(call(1, "call_1", "get_weather", W)), finish())
    d = guard_body(twice, TOOLS, POLICY)
    assert turn_of(d) == EXPECTED and K.DUPLICATE_TOOL_CALL in kinds(d)


def test_what_cannot_be_normalised_without_a_guess_is_retried() -> None:
    for delta in ("hello", ["a"], 3):
        d = guard_body(sse(chunk(choice(delta)), tools(call(0, "call_1", "get_weather", W)), finish()), TOOLS, POLICY)
        assert d.outcome is Outcome.RETRY and K.ENVELOPE_VARIANT in kinds(d), delta
