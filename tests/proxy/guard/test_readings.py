"""The one reading rule (issue 20, item 1; ``proxy.guard.reading``), a property test per reading.

Each test generates a valid turn from a random schema, applies one family's corruption (a name with a
special-token suffix or Kimi id decoration, blank lines stripped between events, an id per chunk, a
choice index used as a counter, a missing opening brace, two calls fused into one slot, markup residue
beside the call) and checks that the unique reading gives back exactly the turn, with the family's
finding; and that a corruption with two (or no) valid readings is retried, never guessed.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.checks.repair import read_name, resolve_name
from proxy.guard.decisions.attempt import AttemptGuard
from proxy.guard.events import Done, TextDelta
from proxy.guard.findings import FindingKind
from proxy.guard.policy import GuardPolicy, Repair
from proxy.guard.reading import PLAIN, Reading, read
from proxy.guard.stream.accumulate import split_frame
from proxy.guard.turn import Decision, Outcome, RequestSpec, ToolSpec

from .test_assemble import schema_and_args

K = FindingKind
POLICY = GuardPolicy()
SETTINGS = settings(max_examples=40, deadline=None)
NAMES = st.sampled_from(["act", "read_file", "run_shell", "get_weather", "query_dataset"])
SUFFIXES = st.sampled_from(["<|channel|>commentary", "<|constrain|>json", "<|call|>", " <|channel|>analysis",
                            "<｜tool▁sep｜>"])


def chunk(delta: dict[str, Any], finish: str | None = None, *, cid: str = "chatcmpl-r",
          index: int = 0) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": 1764700000, "model": "m",
            "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


def call_delta(*, id: str | None = None, name: str | None = None, args: str | None = None,
               i: int = 0) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": i, "function": {}}
    if id is not None:
        entry["id"], entry["type"] = id, "function"
    if name is not None:
        entry["function"]["name"] = name
    if args is not None:
        entry["function"]["arguments"] = args
    return {"tool_calls": [entry]}


def frames_of(name: str, args: dict[str, Any], pieces: int = 3) -> list[dict[str, Any]]:
    """A clean stream of one call: role, header, the arguments in ``pieces`` fragments, finish."""
    text = json.dumps(args)
    step = max(1, len(text) // pieces)
    frags = [text[i:i + step] for i in range(0, len(text), step)]
    return [chunk({"role": "assistant", "content": ""}), chunk(call_delta(id="call_1", name=name, args="")),
            *[chunk(call_delta(args=f)) for f in frags], chunk({}, "tool_calls")]


def body(frames: list[dict[str, Any]]) -> bytes:
    return ("".join(f"data: {json.dumps(f, ensure_ascii=False)}\n\n" for f in frames) + "data: [DONE]\n\n").encode()


def decide(raw: bytes, request: RequestSpec, policy: GuardPolicy = POLICY,
           cut: int | None = None) -> tuple[Decision, str]:
    guard = AttemptGuard(request, policy)
    cut = len(raw) // 2 if cut is None else cut
    events = guard.feed(raw[:cut]) + guard.feed(raw[cut:]) + guard.finish()
    done = events[-1]
    assert isinstance(done, Done)
    text = "".join(e.text for e in events if isinstance(e, TextDelta) and e.channel == "content")
    return done.decision, text


def calls(d: Decision) -> list[tuple[str, dict[str, Any]]]:
    assert d.turn is not None, d.reason
    return [(c.name, json.loads(c.arguments)) for ch in d.turn.choices for c in ch.tool_calls]


def request(name: str, schema: dict[str, Any], *others: str, n: int = 1) -> RequestSpec:
    extra = tuple(ToolSpec(o, {"type": "object", "properties": {"zz_other": {"type": "string"}},
                               "required": ["zz_other"]}) for o in others)
    return RequestSpec(tools=(ToolSpec(name, schema), *extra), n=n)


def kinds(d: Decision) -> set[FindingKind]:
    return {f.kind for f in d.findings}


# -- the rule itself ----------------------------------------------------------------------------------------


def test_the_rule_takes_the_plain_reading_first_and_a_unique_survivor_else_nothing() -> None:
    """Plain wins at once; one survivor is taken naming what it rejected; two different survivors: none."""
    plain = read([Reading(PLAIN, 1), Reading("x", 2)], lambda v: True)
    assert plain.plain and len(plain.tried) == 1
    one = read([Reading(PLAIN, 1), Reading("x", 2), Reading("y", 3)], lambda v: v == 2)
    assert one.chosen is not None and one.chosen.how == "x" and "y: not valid" in one.rejected()
    same = read([Reading("x", 2), Reading("y", 2)], lambda v: True)
    assert same.chosen is not None  # two readings giving the same value are one
    two = read([Reading("x", 2), Reading("y", 3)], lambda v: True)
    assert two.chosen is None and two.ambiguous and "no unique reading" in two.detail("v")
    assert read([Reading("x", 1)], lambda v: 1 / v == 0.5 * (1 / 0)).chosen is None  # a failing check accepts nothing


# -- names ------------------------------------------------------------------------------------------------


@SETTINGS
@given(schema_and_args(), NAMES, SUFFIXES, st.integers(0, 1000))
def test_a_name_with_a_special_token_suffix_reads_as_the_declared_tool(
        sa: tuple[dict[str, Any], dict[str, Any]], name: str, suffix: str, cut: int) -> None:
    schema, args = sa
    req = request(name, schema, "describe")
    raw = body(frames_of(name + suffix, args))
    d, _ = decide(raw, req, cut=cut % (len(raw) + 1))
    assert d.usable and calls(d) == [(name, args)]
    assert K.TOOL_NAME_SPECIAL_TOKEN_SUFFIX in kinds(d)
    no_repairs = GuardPolicy(repairs=frozenset(r for r in Repair if r is not Repair.NAME_PREFIX))
    assert decide(raw, req, no_repairs)[0].outcome is Outcome.RETRY


@SETTINGS
@given(NAMES, st.integers(0, 99), st.sampled_from(["functions.{n}:{i}", "functions_{n}_{i}", "functions{n}{i}",
                                                   "functions.{n}_{i}", "{n}:{i}"]))
def test_kimi_call_ids_without_separators_read_as_the_declared_tool(name: str, i: int, shape: str) -> None:
    names = frozenset({name, "describe"})
    assert resolve_name(shape.format(n=name, i=i), names, POLICY) == name


def test_two_declared_tools_left_after_the_decoration_is_retried() -> None:
    """``functions_get_1``: ``get_1`` (prefix) and ``get`` (prefix and index) both declared: no unique reading."""
    names = frozenset({"get", "get_1"})
    assert read_name("functions_get_1", names).ambiguous
    assert resolve_name("functions_get_1", names, POLICY) is None
    assert resolve_name("get_1", names, POLICY) == "get_1"  # the plain reading first


# -- framing ----------------------------------------------------------------------------------------------


@SETTINGS
@given(schema_and_args(), st.integers(1, 4), st.integers(0, 1000))
def test_events_without_blank_lines_read_as_the_events(sa: tuple[dict[str, Any], dict[str, Any]], pieces: int,
                                                       cut: int) -> None:
    schema, args = sa
    frames = frames_of("act", args, pieces)
    raw = ("".join(f"data: {json.dumps(f)}\n" for f in frames) + "\ndata: [DONE]\n\n").encode()
    clean, _ = decide(body(frames), request("act", schema))
    d, _ = decide(raw, request("act", schema), cut=cut % (len(raw) + 1))
    assert d.usable and calls(d) == calls(clean) == [("act", args)]
    assert K.SSE_EVENTS_WITHOUT_BLANK_LINE in kinds(d)


def test_a_data_value_that_is_not_only_json_values_is_a_broken_frame() -> None:
    assert split_frame('{"a": 1}\n{"b": 2}').chosen is not None
    assert split_frame('{"a": 1}{"b": 2}').chosen is not None
    assert split_frame('{"a": 1}\n{"b": 2').chosen is None
    assert split_frame('{"a": 1}\nnot json').chosen is None
    assert split_frame("[1]\n[2]").chosen is None  # not chunks


# -- envelope ---------------------------------------------------------------------------------------------


@SETTINGS
@given(schema_and_args(), st.integers(2, 4), st.integers(0, 1000))
def test_an_id_per_chunk_reads_as_one_generation(sa: tuple[dict[str, Any], dict[str, Any]], pieces: int,
                                                 cut: int) -> None:
    schema, args = sa
    frames = frames_of("act", args, pieces)
    for i, f in enumerate(frames):
        f["id"] = f"chat.id.{i + 1}"
    raw = body(frames)
    d, _ = decide(raw, request("act", schema), cut=cut % (len(raw) + 1))
    assert d.usable and calls(d) == [("act", args)]
    assert K.COMPLETION_ID_PER_CHUNK in kinds(d)


def test_two_ids_or_an_id_that_comes_back_or_a_restart_is_another_generation() -> None:
    req = request("act", {"type": "object"})
    two = [chunk(call_delta(id="c1", name="act", args="{}"), cid="a"), chunk({}, "tool_calls", cid="b")]
    assert decide(body(two), req)[0].outcome is Outcome.RETRY  # two ids: per chunk or another generation
    back = frames_of("act", {"k": 1})
    for f, cid in zip(back, ["a", "b", "c", "a", "d"], strict=False):
        f["id"] = cid
    assert decide(body(back), req)[0].outcome is Outcome.RETRY
    once = frames_of("act", {"k": 1})
    for f, cid in zip(once, ["a", "a", "b", "b", "b"], strict=False):
        f["id"] = cid
    assert decide(body(once), req)[0].outcome is Outcome.RETRY
    restart = frames_of("act", {"k": 1})
    for i, f in enumerate(restart):
        f["id"] = f"id{i}"
    restart[3]["choices"][0]["delta"]["role"] = "assistant"  # a role again after chunks without one
    assert decide(body(restart), req)[0].outcome is Outcome.RETRY


@SETTINGS
@given(schema_and_args(), st.integers(1, 4), st.integers(0, 1000))
def test_a_choice_index_used_as_a_counter_reads_as_choice_0(sa: tuple[dict[str, Any], dict[str, Any]],
                                                            pieces: int, cut: int) -> None:
    schema, args = sa
    frames = frames_of("act", args, pieces)
    for i, f in enumerate(frames):
        f["choices"][0]["index"] = i
    raw = body(frames)
    d, _ = decide(raw, request("act", schema), cut=cut % (len(raw) + 1))
    assert d.usable and calls(d) == [("act", args)]
    assert K.CHOICE_INDEX_AS_COUNTER in kinds(d)
    # n=2: an index 1 is a real choice, the counter is no reading there; a counter broken midway is retried
    assert decide(raw, request("act", schema, n=2))[0].outcome is Outcome.RETRY
    frames[2]["choices"][0]["index"] = 7
    assert decide(body(frames), request("act", schema))[0].outcome is Outcome.RETRY


# -- arguments --------------------------------------------------------------------------------------------


@SETTINGS
@given(schema_and_args(), st.integers(1, 4), st.integers(0, 1000))
def test_arguments_missing_their_opening_brace_read_with_it(sa: tuple[dict[str, Any], dict[str, Any]],
                                                            pieces: int, cut: int) -> None:
    schema, args = sa
    frames = frames_of("act", args, pieces)
    first = next(f for f in frames[2:] if f["choices"][0]["delta"].get("tool_calls"))
    fn = first["choices"][0]["delta"]["tool_calls"][0]["function"]
    fn["arguments"] = fn["arguments"][1:]  # the lost leading "{"
    raw = body(frames)
    d, _ = decide(raw, request("act", schema), cut=cut % (len(raw) + 1))
    assert d.usable and calls(d) == [("act", args)]
    assert K.ARGUMENTS_MISSING_BRACE in kinds(d)
    no_brace = GuardPolicy(repairs=frozenset(r for r in Repair if r is not Repair.MISSING_BRACE))
    assert decide(raw, request("act", schema), no_brace)[0].outcome is Outcome.RETRY


def test_a_missing_closing_brace_is_truncation_never_read() -> None:
    frames = [chunk(call_delta(id="c1", name="act", args='{"city": "Lyon"')), chunk({}, "tool_calls")]
    req = request("act", {"type": "object", "properties": {"city": {"type": "string"}}})
    assert decide(body(frames), req)[0].outcome is Outcome.RETRY


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}
PATH = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
        "additionalProperties": False}


@SETTINGS
@given(st.text(max_size=8), st.text(max_size=8), st.booleans(), st.booleans(), st.integers(0, 1000))
def test_two_calls_fused_into_one_slot_read_as_two_calls(city: str, path: str, named: bool, one_fragment: bool,
                                                          cut: int) -> None:
    req = RequestSpec(tools=(ToolSpec("get_weather", CITY), ToolSpec("read_file", PATH)))
    a, b = json.dumps({"city": city}), json.dumps({"path": path})
    second = ("read_file" if named else "") + b
    if one_fragment:
        frames = [chunk(call_delta(id="c1", name="get_weather", args=a + second)), chunk({}, "tool_calls")]
    else:
        frames = [chunk(call_delta(id="c1", name="get_weather", args=a)), chunk(call_delta(args=second)),
                  chunk({}, "tool_calls")]
    raw = body(frames)
    d, _ = decide(raw, req, cut=cut % (len(raw) + 1))
    if named and not one_fragment:
        # a name inside a headerless slot's fragment: no reading lines values up with slots
        both = [("get_weather", {"city": city}), ("read_file", {"path": path})]
        assert d.outcome is Outcome.RETRY or calls(d) == both
        return
    assert d.usable and calls(d) == [("get_weather", {"city": city}), ("read_file", {"path": path})]
    assert K.FUSED_PARALLEL_ARGUMENTS in kinds(d)
    assert d.turn is not None and len({c.id for c in d.turn.choices[0].tool_calls}) == 2
    serial, _ = decide(raw, RequestSpec(tools=req.tools, parallel_tool_calls=False))
    # no parallel calls: no fused reading; what stands is retried or cut to the first call (EXTRA_PARALLEL_CALLS)
    assert serial.outcome is Outcome.RETRY or calls(serial) == [("get_weather", {"city": city})]


def test_a_fused_value_two_declared_tools_accept_is_retried() -> None:
    """The second value has no name and two declared tools accept it: two valid readings, never a guess."""
    req = RequestSpec(tools=(ToolSpec("get_weather", CITY), ToolSpec("read_file", PATH),
                             ToolSpec("stat_file", PATH)))
    frames = [chunk(call_delta(id="c1", name="get_weather", args='{"city": "x"}{"path": "a"}')),
              chunk({}, "tool_calls")]
    d, _ = decide(body(frames), req)
    assert d.outcome is Outcome.RETRY and K.AMBIGUOUS_ARGUMENTS in kinds(d)


# -- text -------------------------------------------------------------------------------------------------

RESIDUE = st.sampled_from(["<｜DSML｜function_calls", "</tool_call>", "</function>", "\n</tool_call>\n",
                           "<｜DSML｜"])


@SETTINGS
@given(schema_and_args(), st.sampled_from(["", "Let me check.", "Done:"]), RESIDUE, st.booleans(),
       st.integers(0, 1000))
def test_markup_residue_beside_a_call_is_stripped_and_prose_stays(
        sa: tuple[dict[str, Any], dict[str, Any]], prose: str, residue: str, before: bool, cut: int) -> None:
    schema, args = sa
    frames = frames_of("act", args)
    text = [chunk({"content": prose + residue})]
    frames = [frames[0], *text, *frames[1:]] if before else [*frames[:-1], *text, frames[-1]]
    raw = body(frames)
    d, released = decide(raw, request("act", schema), cut=cut % (len(raw) + 1))
    assert d.usable and calls(d) == [("act", args)]
    assert d.turn is not None and d.turn.choices[0].content == (prose or None)
    assert released == prose
    assert K.MARKUP_RESIDUE_IN_CONTENT in kinds(d)


@SETTINGS
@given(st.sampled_from(["assistant", "commentary", "final answer", "a <b", "x </tool_call> y"]),
       st.integers(0, 1000))
def test_markup_without_a_call_is_content(text: str, cut: int) -> None:
    """With no call in the choice the held run is content after all: released as it came."""
    raw = body([chunk({"role": "assistant", "content": text}), chunk({}, "stop")])
    d, released = decide(raw, request("act", {"type": "object"}), cut=cut % (len(raw) + 1))
    assert d.usable and d.turn is not None and d.turn.choices[0].content == text and released == text


def test_header_words_as_prose_beside_a_call_stay() -> None:
    frames = frames_of("act", {"k": 1})
    frames.insert(1, chunk({"content": "I am your assistant, commentary follows."}))
    d, released = decide(body(frames), request("act", {"type": "object"}))
    assert d.usable and released == "I am your assistant, commentary follows."
