"""Never a silently changed call (issue 12, item 5): bytes the protocol does not allow are findings, and
where they touch a tool call the attempt is retried (``proxy.guard.stream.integrity``, the SSE decoder's bounds).

The fuzz test at the end mutates clean streams of random calls the ways a real fuzzer found them
broken (non-UTF-8 bytes, corrupted keys, lone surrogates, wild choice indexes, any network split) and
asserts the invariant: a delivered call is byte-for-byte the clean stream's, or the attempt is retried.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.decisions.attempt import AttemptGuard, decide_completion, guard_body
from proxy.guard.events import Done
from proxy.guard.findings import Action, FindingKind
from proxy.guard.stream.integrity import _one_edit
from proxy.guard.turn import Decision, Outcome, RequestSpec, ToolSpec
from tests.fault_corpus import PATHS

from .builders import POLICY, TOOLS, call, choice, chunk, finish, kinds, sse, text, tools

K = FindingKind


def weather(*frags: str) -> bytes:
    """A get_weather call with argument fragments ``frags``, then finish and [DONE]."""
    first = tools(call(0, id="call_1", name="get_weather", args=""))
    return sse(first, *[tools(call(0, args=f)) for f in frags], finish())


def arguments(d: Decision) -> list[tuple[str, str]]:
    assert d.turn is not None
    return [(c.name, c.arguments) for ch in d.turn.choices for c in ch.tool_calls]


def retried(d: Decision, kind: FindingKind) -> bool:
    return d.outcome is Outcome.RETRY and any(f.kind is kind and f.action is Action.RETRY for f in d.findings)


# -- invalid UTF-8 ---------------------------------------------------------------------------------------


def test_invalid_utf8_inside_arguments_is_retried_never_decoded_to_a_replacement_character() -> None:
    body = weather('{"city": "Par', '"}').replace(b"Par", b"Pa\xe9r")  # a Latin-1 byte, not UTF-8
    assert retried(guard_body(body, TOOLS, POLICY), K.INVALID_UTF8_IN_FRAME)


def test_invalid_utf8_in_a_tool_name_is_retried() -> None:
    body = weather('{"city": "Paris"}').replace(b"get_weather", b"get_w\xffeather")
    assert guard_body(body, TOOLS, POLICY).outcome is Outcome.RETRY


def test_invalid_utf8_in_text_is_kept_as_the_replacement_character_with_a_finding() -> None:
    """Without tools; with tools the text is read for calls, and a replaced byte may hide one: retried."""
    body = sse(text("caf\u00e9 ok"), finish("stop")).replace(b"caf", b"caf\x80")
    assert retried(guard_body(body, TOOLS, POLICY), K.INVALID_UTF8_IN_FRAME)
    d = guard_body(body, RequestSpec(), POLICY)
    assert d.usable and d.turn is not None
    assert d.turn.choices[0].content is not None and "\ufffd" in d.turn.choices[0].content
    assert any(f.kind is K.INVALID_UTF8_IN_FRAME and f.action is Action.NORMALIZED for f in d.findings)


def test_a_non_stream_answer_with_invalid_utf8_in_arguments_is_retried() -> None:
    body = json.dumps({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city":"Paris"}'}}]}}]}).encode().replace(b"Paris", b"Pa\xc3ris")
    assert retried(decide_completion(body, TOOLS, POLICY), K.INVALID_UTF8_IN_FRAME)


# -- corrupted keys ----------------------------------------------------------------------------------------


def test_a_delta_key_with_a_stray_byte_is_retried_when_it_carries_a_tool_call() -> None:
    body = weather('{"city":', ' "Paris"}')
    frames = body.split(b"\n\n")
    frames[2] = frames[2].replace(b'"delta"', b'"d\x80elta"')  # drops the first argument fragment
    assert retried(guard_body(b"\n\n".join(frames), TOOLS, POLICY), K.CORRUPTED_KEY)


def test_a_key_one_edit_from_a_known_key_is_retried_where_it_touches_a_call() -> None:
    for old, new in ((b'"delta"', b'"delat"'), (b'"arguments"', b'"argumnets"'), (b'"tool_calls"', b'"tool_call"'),
                     (b'"function"', b'"functon"'), (b'"index"', b'"indx"')):
        body = weather('{"city":', ' "Paris"}')
        frames = body.split(b"\n\n")
        frames[2] = frames[2].replace(old, new)
        assert retried(guard_body(b"\n\n".join(frames), TOOLS, POLICY), K.CORRUPTED_KEY), new


def test_a_corrupted_key_below_the_chunk_is_retried_above_it_a_finding_and_vendor_keys_are_ignored() -> None:
    """A lost ``content`` may have held a call in markup (a fuzzed D03 lost one): retried. A corrupted
    chunk-level ``model`` key loses nothing of the turn: a finding."""
    body = sse(text("hi"), chunk(choice({"contnet": "lost", "x_vendor": {"a": 1}})), finish("stop"))
    assert retried(guard_body(body, TOOLS, POLICY), K.CORRUPTED_KEY)
    body = sse({**text("hi"), "modle": "m"}, finish("stop"))
    d = guard_body(body, TOOLS, POLICY)
    assert d.usable
    assert [f.action for f in d.findings if f.kind is K.CORRUPTED_KEY] == [Action.IGNORED]
    vendor = guard_body(sse(chunk(choice({"content": "hi", "x_vendor": 1}), x_gateway="g"), finish("stop")),
                        TOOLS, POLICY)
    assert vendor.usable and K.CORRUPTED_KEY not in kinds(vendor)


def test_a_corrupted_sse_field_name_loses_a_frame_and_is_retried() -> None:
    body = weather('{"city":"Paris"', ',"n":1', "}")
    for bad in (b"dta: ", b"d\x80ta: ", b"daat: "):
        frames = body.split(b"\n\n")
        frames[2] = frames[2].replace(b"data: ", bad, 1)
        assert retried(guard_body(b"\n\n".join(frames), TOOLS, POLICY), K.CORRUPTED_KEY), bad


def test_one_edit_is_insertion_deletion_substitution_or_transposition() -> None:
    assert all(_one_edit(a, "delta") for a in ("delat", "delt", "deltaa", "dalta", "edlta"))
    assert not any(_one_edit(a, "delta") for a in ("delta", "dleat", "de", "tlead"))


# -- lone surrogates ---------------------------------------------------------------------------------------


def test_a_lone_surrogate_in_arguments_is_retried() -> None:
    chunk_level = weather('{"city": "Pa', '"}').replace(b'"Pa"', b'"Pa\\ud800"')
    raw = weather('{"city": "Pa', '"}').replace(b'"{\\"city\\": \\"Pa"', b'"{\\"city\\": \\"Pa\\ud800"')
    arg_level = weather('{"city": "Pa\\ud800"}')  # the escape inside the argument JSON itself
    for body in (chunk_level, raw, arg_level):
        assert guard_body(body, TOOLS, POLICY).outcome is Outcome.RETRY
    assert retried(guard_body(arg_level, TOOLS, POLICY), K.LONE_SURROGATE)


def test_a_lone_surrogate_in_text_is_replaced_and_a_pair_is_a_character() -> None:
    body = sse('{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"a\\ud800b \\ud83d\\ude00"}}]}',
               finish("stop"))
    assert retried(guard_body(body, TOOLS, POLICY), K.LONE_SURROGATE)  # text read for calls: retried
    d = guard_body(body, RequestSpec(), POLICY)
    assert d.usable and d.turn is not None
    assert d.turn.choices[0].content == "a\ufffdb \U0001f600"
    assert any(f.kind is K.LONE_SURROGATE and f.action is Action.NORMALIZED for f in d.findings)
    pair = guard_body(weather('{"city": "\\ud83d\\ude00"}'), TOOLS, POLICY)
    assert pair.usable and arguments(pair) == [("get_weather", '{"city":"\U0001f600"}')]


# -- choices, empty turns, bounds -------------------------------------------------------------------------


def test_a_choice_index_the_request_did_not_ask_for_is_retried_not_a_new_choice() -> None:
    body = sse(text("hi"), text("there", index=123), finish("stop"))
    assert retried(guard_body(body, TOOLS, POLICY), K.UNREQUESTED_CHOICE_INDEX)
    two = RequestSpec(tools=TOOLS.tools, n=2)
    d = guard_body(sse(text("a"), text("b", index=1), finish("stop"), finish("stop", index=1)), two, POLICY)
    assert d.usable and d.turn is not None and len(d.turn.choices) == 2


def test_an_empty_choice_at_a_wild_index_is_ignored() -> None:
    d = guard_body(sse(text("hi"), chunk(choice({}, index=7)), finish("stop")), TOOLS, POLICY)
    assert d.usable
    assert [f.action for f in d.findings if f.kind is K.UNREQUESTED_CHOICE_INDEX] == [Action.IGNORED]


def test_a_turn_of_only_finish_reason_length_is_retried_not_an_empty_success() -> None:
    assert retried(guard_body(sse(finish("length")), TOOLS, POLICY), K.EMPTY_TURN)


def test_the_guarded_path_bounds_a_line_and_an_attempt() -> None:
    body = weather('{"city": "' + "x" * 5000 + '"}')
    for guard, kind in ((AttemptGuard(TOOLS, POLICY, max_line=1000), K.SSE_LINE_TOO_LONG),
                        (AttemptGuard(TOOLS, POLICY, max_bytes=2000), K.UPSTREAM_BODY_TOO_LARGE)):
        events = []
        for i in range(0, len(body), 100):
            events += guard.feed(body[i:i + 100])
        done = guard.finish()[-1]
        assert isinstance(done, Done)
        assert retried(done.decision, kind)
    ok = AttemptGuard(TOOLS, POLICY, max_line=10_000, max_bytes=len(body))
    ok.feed(body)
    last = ok.finish()[-1]
    assert isinstance(last, Done) and last.decision.usable


# -- the fuzz test -----------------------------------------------------------------------------------------

FUZZ_TOOLS = RequestSpec(tools=(ToolSpec("run", {"type": "object", "additionalProperties": True}),))
_KEYS = (b'"id"', b'"model"', b'"choices"', b'"index"', b'"delta"', b'"role"', b'"content"', b'"tool_calls"',
         b'"type"', b'"function"', b'"name"', b'"arguments"', b'"finish_reason"')
_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=12),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                   max_size=3), max_leaves=8)
_args = st.dictionaries(st.text(min_size=1, max_size=8), _values, max_size=4)


def clean_stream(args: list[dict[str, Any]], cuts: list[int], prose: str) -> bytes:
    """A stream of text then one call per ``args`` entry, its argument JSON cut at ``cuts``."""
    frames: list[Any] = [chunk(choice({"role": "assistant", "content": prose}))]
    for i, a in enumerate(args):
        raw = json.dumps(a)
        frames.append(tools(call(i, id=f"call_{i}", name="run", args="")))
        bounds = sorted({0, len(raw), *[c % (len(raw) + 1) for c in cuts]})
        frames += [tools(call(i, args=raw[x:y])) for x, y in zip(bounds, bounds[1:], strict=False)]
    frames.append(finish())
    return sse(*frames)


_CHOICE_INDEX = re.compile(rb'"choices": ?\[\{"index": ?(\d+)')


def mutate(body: bytes, rnd: random.Random) -> bytes:
    """One mutation of the kinds the issue's fuzzer found delivered changed."""
    how = rnd.randrange(6)
    pos = rnd.randrange(len(body))
    if how == 0:  # a byte flipped to a non-ASCII byte (never UTF-8 after an ASCII byte)
        b = bytearray(body)
        b[pos] |= 0x80
        return bytes(b)
    if how == 1:  # an invalid UTF-8 sequence inserted
        return body[:pos] + rnd.choice([b"\x80", b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf0\x9f"]) + body[pos:]
    if how == 2:  # a lone surrogate escape inserted
        return body[:pos] + rnd.choice([b"\\ud800", b"\\uDFFF", b"\\udbff"]) + body[pos:]
    present = [k for k in _KEYS if k + b":" in body or k + b" :" in body]
    wild = list(_CHOICE_INDEX.finditer(body))
    if (how == 3 and not present) or (how == 4 and not wild):
        how = 0
    if how == 0:  # a byte flipped to a non-ASCII byte (never UTF-8 after an ASCII byte)
        b = bytearray(body)
        b[pos] |= 0x80
        return bytes(b)
    if how == 3:  # a known key one edit away (or a stray byte inside it)
        key = rnd.choice(present)
        starts = [i for i in range(len(body)) if body.startswith(key + b":", i) or body.startswith(key + b" :", i)]
        at = rnd.choice(starts)
        inner = bytearray(key[1:-1])
        j = rnd.randrange(len(inner))
        edit = rnd.randrange(4)
        if edit == 0:
            del inner[j]
        elif edit == 1:
            inner.insert(j, rnd.choice(b"abcdefghijklmnopqrstuvwxyz\x80"))
        elif edit == 2:
            inner[j] = rnd.choice(b"abcdefghijklmnopqrstuvwxyz\x80")
        elif j + 1 < len(inner):
            inner[j], inner[j + 1] = inner[j + 1], inner[j]
        return body[:at] + b'"' + bytes(inner) + b'"' + body[at + len(key):]
    if how == 4:  # a wild choice index on one frame
        m = rnd.choice(wild)
        return body[:m.start(1)] + str(rnd.choice([1, 2, 123, 10**9])).encode() + body[m.end(1):]
    frames = body.split(b"\n\n")  # a frame dropped whole is a valid, shorter stream: not this test's
    return b"\n\n".join(frames[:pos % len(frames)] + [frames[pos % len(frames)].replace(b"data: ", b"data:", 1)]
                        + frames[pos % len(frames) + 1:])


def run_split(body: bytes, cuts: list[int]) -> Decision:
    guard = AttemptGuard(FUZZ_TOOLS, POLICY)
    bounds = sorted({0, len(body), *[c % (len(body) + 1) for c in cuts]})
    for x, y in zip(bounds, bounds[1:], strict=False):
        guard.feed(body[x:y])
    done = guard.finish()[-1]
    assert isinstance(done, Done)
    return done.decision


@settings(max_examples=60, deadline=None)
@given(st.lists(_args, min_size=1, max_size=2), st.lists(st.integers(0, 400), max_size=5),
       st.text(max_size=10), st.integers(0, 2**32), st.lists(st.integers(0, 10**6), max_size=4))
def test_a_mutated_stream_delivers_the_clean_calls_or_is_retried(args: list[dict[str, Any]], cuts: list[int],
                                                                   prose: str, seed: int, net: list[int]) -> None:
    clean_body = clean_stream(args, cuts, prose)
    clean = guard_body(clean_body, FUZZ_TOOLS, POLICY)
    assert clean.usable
    rnd = random.Random(seed)
    body = clean_body
    for _ in range(rnd.randint(1, 3)):
        body = mutate(body, rnd)
    d = run_split(body, net)
    if d.usable:
        assert arguments(d) == arguments(clean), body
        assert d.turn is not None
        for c in d.turn.choices:
            for t in (c.content, c.reasoning):
                assert t is None or t.encode("utf-8")  # never a lone surrogate to a client
    else:
        assert d.outcome is Outcome.RETRY


# -- the same invariant over the corpus (a seeded mutator, a few mutations per case) ------------------------

CORPUS = PATHS
MUTATIONS_PER_CASE = 4


def _case(path: Path) -> tuple[bytes, RequestSpec] | None:
    case = json.loads(path.read_text(encoding="utf-8"))
    if case.get("upstream_http") is not None or not (case.get("raw_sse") or case.get("upstream_chunks")):
        return None
    body = (str(case["raw_sse"]) if case.get("raw_sse") is not None
            else "".join(f"data: {c}\n\n" for c in case["upstream_chunks"])).encode("utf-8")
    request = RequestSpec.from_openai({"tools": case.get("request_tools") or [], **(case.get("request") or {})})
    return body, request


def _calls(d: Decision) -> list[tuple[int, str, str]]:
    """(choice, name, arguments) of every call; ids left out (minted afresh per run when missing, C08)."""
    assert d.turn is not None
    return [(ch.index, c.name, c.arguments) for ch in d.turn.choices for c in ch.tool_calls]


def test_mutated_corpus_streams_deliver_the_clean_calls_or_are_retried() -> None:
    """Every corpus case the guard delivers with calls, mutated a few times (seeded): the same calls or a retry."""
    checked = 0
    for path in CORPUS:
        loaded = _case(path)
        if loaded is None:
            continue
        body, request = loaded
        clean = guard_body(body, request, POLICY)
        if not clean.usable or not _calls(clean):
            continue
        rnd = random.Random(path.name)
        for _ in range(MUTATIONS_PER_CASE):
            mutated = mutate(body, rnd)
            d = guard_body(mutated, request, POLICY)
            if d.usable:
                assert _calls(d) == _calls(clean), (path.name, mutated)  # ids aside: minted afresh (C08)
            else:
                assert d.outcome in (Outcome.RETRY, Outcome.UPSTREAM_ERROR), path.name
            checked += 1
    assert checked >= 40
