"""Argument assembly by the schema (issue 12, item 2; ``proxy.guard.stream.assemble``).

Property tests build the assembly variants a real stream can mean from random valid arguments of
random schemas and check that the unique valid reading wins (and plain concatenation costs nothing:
no finding), and that inputs with no unique valid reading are retried.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.decisions.attempt import guard_body
from proxy.guard.findings import Action, FindingKind
from proxy.guard.stream import assemble as asm
from proxy.guard.turn import Decision, Outcome, RequestSpec, ToolSpec

from .builders import MISSING, POLICY, TOOLS, call, choice, chunk, finish, kinds, sse, tools

K = FindingKind
ASSEMBLY_KINDS = {K.ARGUMENTS_ASSEMBLED, K.CUMULATIVE_ARGUMENTS_SNAPSHOTS, K.FULL_ARGUMENTS_RESENT_AT_END,
                  K.AMBIGUOUS_ARGUMENTS}


def calls(d: Decision) -> list[tuple[str, dict[str, Any]]]:
    assert d.turn is not None, d.reason
    return [(c.name, json.loads(c.arguments)) for ch in d.turn.choices for c in ch.tool_calls]


# -- random schemas and their valid arguments --------------------------------------------------------------

_TYPES = {"string": st.text(max_size=8), "integer": st.integers(-1000, 1000), "boolean": st.booleans(),
          "array": st.lists(st.integers(0, 9), max_size=3)}


@st.composite
def schema_and_args(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """An object schema with 1-4 typed properties (at least one required) and an object valid for it."""
    names = draw(st.lists(st.sampled_from(["path", "city", "n", "flag", "items", "q", "mode"]), min_size=1,
                          max_size=4, unique=True))
    types = {n: draw(st.sampled_from(sorted(_TYPES))) for n in names}
    required = names[: draw(st.integers(1, len(names)))]
    schema = {"type": "object", "properties": {n: {"type": t} for n, t in types.items()}, "required": required,
              "additionalProperties": False}
    args = {n: draw(_TYPES[types[n]]) for n in names if n in required or draw(st.booleans())}
    return schema, args


def spec(schema: dict[str, Any], *, parallel: bool = True) -> RequestSpec:
    return RequestSpec(tools=(ToolSpec("act", schema),), parallel_tool_calls=parallel)


def cut(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *[c % (len(text) + 1) for c in cuts]})
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def stream(frags: list[Any], *, tid: Any = "call_1", name: str = "act") -> bytes:
    head = tools(call(0, id=tid, name=name, args=""))
    return sse(head, *[tools(call(0, args=f)) for f in frags], finish())


cuts_st = st.lists(st.integers(0, 500), max_size=6)


@settings(max_examples=40, deadline=None)
@given(schema_and_args(), cuts_st)
def test_plain_concatenation_wins_and_costs_no_finding(sa: tuple[dict[str, Any], dict[str, Any]],
                                                       cuts: list[int]) -> None:
    schema, args = sa
    d = guard_body(stream(cut(json.dumps(args), cuts)), spec(schema), POLICY)
    assert calls(d) == [("act", args)]
    assert not kinds(d) & ASSEMBLY_KINDS


@settings(max_examples=40, deadline=None)
@given(schema_and_args(), cuts_st)
def test_cumulative_snapshots_read_as_the_last(sa: tuple[dict[str, Any], dict[str, Any]], cuts: list[int]) -> None:
    schema, args = sa
    text = json.dumps(args)
    points = sorted({c % len(text) for c in cuts if c % len(text) > 0})
    frags = [text[:p] for p in points] + [text]
    d = guard_body(stream(frags), spec(schema), POLICY)
    assert calls(d) == [("act", args)]
    if len(frags) >= 2:
        assert K.CUMULATIVE_ARGUMENTS_SNAPSHOTS in kinds(d)


BRACY = st.text(alphabet='ab {}[]":,', max_size=8)


@settings(max_examples=60, deadline=None)
@given(st.lists(BRACY, min_size=2, max_size=3, unique=True), st.lists(cuts_st, min_size=3, max_size=3))
def test_snapshots_with_brackets_in_strings_keep_parallel_calls_at_one_index_apart(
        cities: list[str], cuts: list[list[int]]) -> None:
    """Snapshots ``{"`` then ``{"city": " }`` concatenate to balanced text that is not JSON; the call must
    not close there, or the next snapshot opens a call of its own (found by the mangled-turn property)."""
    frames: list[Any] = []
    for i, (city, cs) in enumerate(zip(cities, cuts, strict=False)):
        text = json.dumps({"city": city})
        points = sorted({c % len(text) for c in cs if c % len(text) > 0})
        snaps = [text[:p] for p in points] + [text]
        frames += [tools(call(0, id=f"call_{i}", name="get", args="")),
                   tools(call(0, name="_weather", args=snaps[0], type=MISSING)),
                   *[tools(call(0, args=s, type=MISSING)) for s in snaps[1:]]]
    d = guard_body(sse(*frames, finish()), TOOLS, POLICY)
    assert calls(d) == [("get_weather", {"city": c}) for c in cities]


@settings(max_examples=40, deadline=None)
@given(schema_and_args(), cuts_st, st.booleans())
def test_a_complete_value_repeated_is_one_call(sa: tuple[dict[str, Any], dict[str, Any]], cuts: list[int],
                                               as_object: bool) -> None:
    schema, args = sa
    text = json.dumps(args)
    for frags in (cut(text + text, cuts), [*cut(text, cuts), args if as_object else text]):
        d = guard_body(stream(frags), spec(schema), POLICY)
        assert calls(d) == [("act", args)], frags
        assert d.usable


@settings(max_examples=40, deadline=None)
@given(schema_and_args(), cuts_st, st.sampled_from(["{}", '{"bogus": 1}']))
def test_a_placeholder_then_the_real_value_reads_as_the_real_value(
        sa: tuple[dict[str, Any], dict[str, Any]], cuts: list[int], placeholder: str) -> None:
    schema, args = sa
    text = json.dumps(args)
    for frags in (cut(placeholder + text, cuts), [placeholder, *cut(text, cuts)]):
        d = guard_body(stream(frags), spec(schema), POLICY)
        assert calls(d) == [("act", args)], frags
        assert K.ARGUMENTS_ASSEMBLED in kinds(d)
        found = next(f for f in d.findings if f.kind is K.ARGUMENTS_ASSEMBLED)
        assert "placeholder" in found.detail and "rejected" in found.detail


CITY = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"], "additionalProperties": False}


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=8), st.text(max_size=8), st.none() | st.integers(0, 9))
def test_several_values_with_their_own_ids_are_separate_calls_and_under_one_id_fused_calls(
        c1: str, c2: str, days: int | None) -> None:
    """Two different values under one id are two calls fused into one slot (issue 20: the *fused calls*
    reading, the second value accepted by the one declared tool); without parallel calls, retried."""
    a: dict[str, Any] = {"city": c1}
    b: dict[str, Any] = {"city": c2} if days is None else {"city": c2, "days": days}
    ta, tb = json.dumps(a), json.dumps(b)
    two_ids = sse(tools(call(0, id="call_a", name="act", args=ta)), tools(call(0, id="call_b", args=tb)), finish())
    d = guard_body(two_ids, spec(CITY), POLICY)
    one_id = guard_body(sse(tools(call(0, id="call_a", name="act", args=ta)), tools(call(0, args=tb)), finish()),
                        spec(CITY), POLICY)
    if a == b:  # a repeat with two ids is two calls; with one id, one call
        assert calls(d) == [("act", a), ("act", a)] and calls(one_id) == [("act", a)]
        return
    assert calls(d) == [("act", a), ("act", b)]
    assert d.turn is not None and [c.id for c in d.turn.choices[0].tool_calls] == ["call_a", "call_b"]
    assert calls(one_id) == [("act", a), ("act", b)] and K.FUSED_PARALLEL_ARGUMENTS in kinds(one_id)
    one_serial = guard_body(sse(tools(call(0, id="call_a", name="act", args=ta)), tools(call(0, args=tb)), finish()),
                            spec(CITY, parallel=False), POLICY)
    assert one_serial.outcome is Outcome.RETRY or calls(one_serial) == [("act", a)]
    serial = guard_body(two_ids, spec(CITY, parallel=False), POLICY)
    assert serial.outcome is Outcome.RETRY or calls(serial) == [("act", a)]


@settings(max_examples=30, deadline=None)
@given(schema_and_args())
def test_a_repeated_value_is_two_calls_only_with_two_ids_and_parallel_calls(
        sa: tuple[dict[str, Any], dict[str, Any]]) -> None:
    schema, args = sa
    text = json.dumps(args)
    two_ids = sse(tools(call(0, id="call_a", name="act", args=text)), tools(call(0, id="call_b", args=text + " ")),
                  finish())
    one_id = stream([text, text])
    assert calls(guard_body(one_id, spec(schema), POLICY)) == [("act", args)]
    body = sse(tools(call(0, id="call_a", name="act", args=text + text)), finish())
    assert calls(guard_body(body, spec(schema), POLICY)) == [("act", args)]
    assert calls(guard_body(two_ids, spec(schema, parallel=False), POLICY)) == [("act", args)]


def test_the_same_call_in_two_channels_is_one_call() -> None:
    """The legacy ``function_call`` next to ``tool_calls`` with the same call; markup text repeating it."""
    fc = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    body = sse(chunk(choice({"function_call": fc, "tool_calls": [call(0, "call_1", "get_weather",
                                                                       '{"city": "Paris"}')]})), finish())
    d = guard_body(body, TOOLS, POLICY)
    assert calls(d) == [("get_weather", {"city": "Paris"})]
    assert K.DUPLICATE_TOOL_CALL in kinds(d)
    leaked = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    body = sse(chunk(choice({"content": leaked})), tools(call(0, "call_1", "get_weather", '{"city":"Paris"}')),
               finish())
    d = guard_body(body, TOOLS, POLICY)
    assert calls(d) == [("get_weather", {"city": "Paris"})]


def test_no_valid_reading_is_retried_and_early_abort_waits_for_every_reading() -> None:
    """``{"city": "a"}{"city": "b"}`` with one id: which one? A retry. ``{}{`` may still become a
    placeholder then the real value: no abort before the end; ``{}x`` cannot: abort."""
    body = stream(['{"city": "a"}{"city": "b"}'], name="get_weather")
    assert guard_body(body, TOOLS, POLICY).outcome is Outcome.RETRY
    d = guard_body(stream(["{}{", '"city": "Lima"}'], name="get_weather"), TOOLS, POLICY)
    assert calls(d) == [("get_weather", {"city": "Lima"})]
    d = guard_body(stream(["{}x", '"city": "Lima"}'], name="get_weather"), TOOLS, POLICY)
    assert d.outcome is Outcome.RETRY and K.ARGUMENTS_NOT_JSON in kinds(d)


def test_several_different_survivors_are_ambiguous() -> None:
    """``decide``: two readings valid with different values -> no choice (the resolver retries)."""
    a = asm.Assembly(asm.PLACEHOLDER, ('{"a":1}',), ({"a": 1},))
    b = asm.Assembly(asm.SNAPSHOTS, ('{"a":2}',), ({"a": 2},))
    same = asm.Assembly(asm.REPEATED, ('{"a": 1}',), ({"a": 1},))
    out = asm.decide([a, b])
    assert out.chosen is None and out.ambiguous
    assert asm.decide([a, same]).chosen is a  # compared by value: identical objects count once
    assert asm.decide([asm.Assembly(asm.CONCATENATION, ("{",))]).chosen is None


def test_the_assembly_finding_names_the_rejected_alternatives() -> None:
    d = guard_body(stream(['{}{"city": "Oslo"}'], name="get_weather"), TOOLS, POLICY)
    found = [f for f in d.findings if f.kind is K.ARGUMENTS_ASSEMBLED]
    assert len(found) == 1 and found[0].action is Action.NORMALIZED
    assert "plain concatenation: not valid" in found[0].detail
    d = guard_body(stream([MISSING], name="get_weather"), TOOLS, POLICY)  # no arguments key at all: still a decision
    assert d.outcome in (Outcome.RETRY, Outcome.NORMALIZED, Outcome.CLEAN)
