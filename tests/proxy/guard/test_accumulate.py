"""Accumulation of upstream chunks into a turn: each fault kind of families A, B, D, E beyond the
literal corpus fixture (other names, positions, splits, parallel calls, interleaved choices)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from proxy.guard.decisions.attempt import decide_completion
from proxy.guard.events import Abort, Done, ToolCallValid
from proxy.guard.findings import Action, FindingKind
from proxy.guard.policy import GuardPolicy
from proxy.guard.turn import Outcome, RequestSpec, ToolSpec

from .builders import (
    MISSING,
    TOOLS,
    call,
    calls_of,
    choice,
    chunk,
    finish,
    kinds,
    released,
    run,
    sse,
    text,
    tools,
)

K = FindingKind
W = '{"city":"Paris"}'


def test_it_ignores_empty_names_on_continuations_of_parallel_calls() -> None:
    """C01 at slot 1: ``name: ""`` on continuations never renames or splits a call."""
    body = sse(
        tools(call(0, "c1", "read_file", "")),
        tools(call(0, name="", args='{"path":"a"}')),
        tools(call(1, "c2", "get_weather", "")),
        tools(call(1, name="", args='{"city":'), call(1, name=None, args='"Oslo"}')),
        finish(),
    )
    d, _ = run(body, step=7)
    assert calls_of(d) == [("read_file", {"path": "a"}), ("get_weather", {"city": "Oslo"})]
    assert K.EMPTY_NAME_ON_CONTINUATION in kinds(d) and d.outcome is Outcome.NORMALIZED


def test_it_keeps_repeated_names_once_in_interleaved_choices() -> None:
    """C03 with n=2: the full name on every delta of both choices is not appended."""
    body = sse(
        chunk(choice({"tool_calls": [call(0, "a", "read_file", '{"pa')]}),
              choice({"tool_calls": [call(0, "b", "get_weather", '{"ci')]}, index=1)),
        chunk(choice({"tool_calls": [call(0, name="get_weather", args='ty":"Rome"}')]}, index=1),
              choice({"tool_calls": [call(0, name="read_file", args='th":"x"}')]})),
        chunk(choice({}, "tool_calls"), choice({}, "tool_calls", index=1)),
    )
    d, _ = run(body, RequestSpec(tools=TOOLS.tools, n=2), step=5)
    assert calls_of(d, 0) == [("read_file", {"path": "x"})]
    assert calls_of(d, 1) == [("get_weather", {"city": "Rome"})]
    assert K.NAME_REPEATED_EVERY_CHUNK in kinds(d)


def test_it_takes_a_name_that_arrives_after_the_arguments_started() -> None:
    """C05: no name key at all on the opening delta; the name comes two deltas later."""
    body = sse(
        tools(call(0, "c1", MISSING, "")),
        tools(call(0, args='{"path":')),
        tools(call(0, name="read_file", args='"b"}')),
        finish("stop"),
    )
    d, events = run(body)
    assert calls_of(d) == [("read_file", {"path": "b"})]
    assert K.NAME_ARRIVES_LATE in kinds(d)
    assert not any(isinstance(e, Abort) for e in events)


def test_it_joins_names_split_in_fragments_and_name_snapshots() -> None:
    """C06: ``ge``+``t_wea``+``ther``, and cumulative ``get``/``get_``/``get_weather`` snapshots."""
    split = sse(tools(call(0, "c", "ge", "")), tools(call(0, name="t_wea")), tools(call(0, name="ther", args=W)),
                finish())
    assert calls_of(run(split)[0]) == [("get_weather", {"city": "Paris"})]
    snaps = sse(tools(call(0, "c", "get_", "")), tools(call(0, name="get_weather", args=W)), finish())
    d, _ = run(snaps)
    assert calls_of(d) == [("get_weather", {"city": "Paris"})]
    assert K.NAME_SPLIT_ACROSS_CHUNKS in kinds(d)


def test_it_prefers_the_repeated_declared_name_over_a_longer_concatenation() -> None:
    """C03 vs C06: ``get`` then ``get`` is a repeat of a declared name, not ``getget``."""
    body = sse(tools(call(0, "c", "get", "")), tools(call(0, name="get", args="{}")), finish())
    assert calls_of(run(body)[0]) == [("get", {})]


def test_it_keeps_the_first_id_when_continuations_change_it() -> None:
    """C07: later ids (``toolcall0``, literal ``"null"``) on argument-only deltas are continuations."""
    body = sse(
        tools(call(0, "chatcmpl-tool-9", "read_file", "")),
        tools(call(0, "null", "", '{"path":')),
        tools(call(0, "toolcall7", "", '"c"}')),
        finish(),
    )
    d, _ = run(body)
    assert d.turn is not None
    assert [c.id for c in d.turn.choices[0].tool_calls] == ["chatcmpl-tool-9"]
    assert K.TOOL_CALL_ID_CHANGES_MID_STREAM in kinds(d)


def test_it_mints_distinct_ids_for_parallel_calls_without_ids() -> None:
    """C08 for two calls: each gets its own stable ``call_`` id, the same in ``ToolCallValid``."""
    body = sse(tools(call(0, MISSING, "get_time", "{}")), tools(call(1, MISSING, "get_time", "")), finish())
    d, events = run(body)
    assert d.turn is not None
    ids = [c.id for c in d.turn.choices[0].tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") and len(i) == 29 for i in ids)
    valid = [e for e in events if isinstance(e, ToolCallValid)]
    assert [v.call.id for v in valid] == ids[:1]


def test_it_splits_parallel_calls_that_share_an_index() -> None:
    """C09: three complete calls at index 0 (ids and no ids), and a new id+name before args complete."""
    body = sse(
        tools(call(0, "a", "read_file", '{"path":"1"}')),
        tools(call(0, MISSING, "read_file", '{"path":"2"}')),
        tools(call(0, MISSING, MISSING, '{"city":"X"}', type=MISSING)),
        finish(),
    )
    d, _ = run(body)
    assert d.outcome is Outcome.RETRY  # the third has no name at all
    body = sse(
        tools(call(0, "a", "read_file", '{"path":')),
        tools(call(0, "b", "get_weather", '{"city":"X"}')),
        tools(call(0, MISSING, MISSING, '"1"}')),  # index 0 now points at the newest call
        finish(),
    )
    assert run(body)[0].outcome is Outcome.RETRY
    body = sse(tools(call(0, "a", "read_file", '{"path":"1"}')), tools(call(0, "b", "read_file", "")),
               tools(call(0, args='{"path":"2"}')), finish())
    d, _ = run(body, step=3)
    assert calls_of(d) == [("read_file", {"path": "1"}), ("read_file", {"path": "2"})]
    assert K.PARALLEL_CALLS_SHARE_INDEX_0 in kinds(d)


def test_it_assigns_missing_indexes_by_order_of_appearance() -> None:
    """C10: no index anywhere; a new id opens the next slot, no id continues the current one."""
    body = sse(
        tools(call(MISSING, "a", "read_file", '{"path":')),
        tools(call(MISSING, args='"q"}')),
        tools(call(MISSING, "b", "get_weather", W, extra_content={"k": 1})),
        finish(),
    )
    d, _ = run(body)
    assert calls_of(d) == [("read_file", {"path": "q"}), ("get_weather", {"city": "Paris"})]
    assert d.turn is not None and d.turn.choices[0].tool_calls[1].extra == {"extra_content": {"k": 1}}
    assert K.TOOL_CALL_INDEX_MISSING in kinds(d)


def test_it_renumbers_indexes_that_are_not_zero_based() -> None:
    """Indexes 3 and 5 become slots 0 and 1."""
    body = sse(tools(call(3, "a", "get_time", "{}")), tools(call(5, "b", "read_file", '{"path":"z"}')), finish())
    d, _ = run(body)
    assert calls_of(d) == [("get_time", {}), ("read_file", {"path": "z"})]
    assert K.TOOL_CALL_INDEX_GAP in kinds(d)


def test_it_defaults_a_missing_empty_or_null_type() -> None:
    """C12: ``type`` absent, ``""`` or null on the opening delta."""
    for t in (MISSING, "", None):
        d, _ = run(sse(tools(call(0, "a", "get_weather", W, type=t)), finish()))
        assert calls_of(d) == [("get_weather", {"city": "Paris"})]
        assert K.TOOL_CALL_TYPE_MISSING in kinds(d)


def test_it_serialises_object_arguments_and_rejects_mixed_fragments() -> None:
    """C13: object arguments on a second call; array arguments are not an object; mixed -> abort."""
    body = sse(tools(call(0, "a", "get_time", "{}")), tools(call(1, "b", "write_file", {"path": "p", "n": 2})),
               finish())
    d, _ = run(body)
    assert calls_of(d) == [("get_time", {}), ("write_file", {"path": "p", "n": 2})]
    assert K.ARGUMENTS_AS_JSON_OBJECT in kinds(d)
    assert run(sse(tools(call(0, "a", "get_time", [1])), finish()))[0].outcome is Outcome.RETRY
    d, events = run(sse(tools(call(0, "a", "read_file", '{"pa')), tools(call(0, args={"path": "x"})), finish()))
    assert d.outcome is Outcome.RETRY and K.MIXED_ARGUMENT_FRAGMENT_TYPES in kinds(d)
    assert any(isinstance(e, Abort) for e in events)


def test_it_reads_cumulative_snapshots_of_parallel_calls_without_aborting() -> None:
    """C14 on two calls, streamed byte by byte: the last snapshot of each call wins."""
    snaps = ['{"path": "d', '{"path": "docs/', '{"path": "docs/a.md"}']
    body = sse(*(tools(call(0, "a", "read_file" if i == 0 else MISSING, s)) for i, s in enumerate(snaps)),
               tools(call(1, "b", "get_weather", '{"city"')), tools(call(1, args='{"city": "Lima"}')), finish())
    d, events = run(body, step=1)
    assert calls_of(d) == [("read_file", {"path": "docs/a.md"}), ("get_weather", {"city": "Lima"})]
    assert K.CUMULATIVE_ARGUMENTS_SNAPSHOTS in kinds(d)
    assert not any(isinstance(e, Abort) for e in events)


def test_it_never_dedups_legitimate_repeats_in_normal_deltas() -> None:
    """CASES.md: no fuzzy overlap dedup: ``100`` + ``00`` is 10000, and a prefix-looking delta is appended."""
    body = sse(tools(call(0, "a", "write_file", '{"path":"p","n":100')), tools(call(0, args="00}")), finish())
    assert calls_of(run(body)[0]) == [("write_file", {"path": "p", "n": 10000})]
    body = sse(tools(call(0, "a", "write_file", '{"path":"{"')), tools(call(0, args=',"content":"{\\"path\\":"}')),
               finish())
    assert calls_of(run(body)[0]) == [("write_file", {"path": "{", "content": '{"path":'})]


def test_it_drops_re_sent_complete_arguments_as_string_or_object() -> None:
    """C15: the consolidated re-send (string, or object) of equal arguments is a duplicate."""
    for resend in ('{"path": "r"}', {"path": "r"}):
        body = sse(tools(call(0, "a", "read_file", '{"path":')), tools(call(0, args='"r"}')),
                   tools(call(0, "a", "read_file", resend)), finish())
        d, events = run(body, step=11)
        assert calls_of(d) == [("read_file", {"path": "r"})], resend
        assert K.FULL_ARGUMENTS_RESENT_AT_END in kinds(d)
        assert not any(isinstance(e, Abort) for e in events)


def test_it_treats_a_different_complete_resend_as_a_new_call() -> None:
    """C15 vs C09: a different complete value at the same index is another call (here unnamed -> retry)."""
    body = sse(tools(call(0, "a", "read_file", '{"path":"r"}')), tools(call(0, args='{"path":"s"}')), finish())
    d, _ = run(body)
    assert d.outcome is Outcome.RETRY and K.PARALLEL_CALLS_SHARE_INDEX_0 in kinds(d)


def test_it_accepts_whole_parallel_calls_in_one_delta() -> None:
    """C17: two complete calls in one chunk."""
    body = sse(tools(call(0, "a", "get_weather", W), call(1, "b", "get_time", "")), finish())
    d, _ = run(body)
    assert calls_of(d) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert K.SINGLE_CHUNK_COMPLETE_CALL in kinds(d)


def test_it_reads_a_final_delta_repeating_metadata_with_finish_in_two_choices() -> None:
    """C18 with n=2: last fragment + id/name + finish_reason in one chunk, per choice."""
    body = sse(
        chunk(choice({"tool_calls": [call(0, "x", "get_weather", '{"city": "Pa')]}),
              choice({"tool_calls": [call(0, "y", "read_file", '{"path": "q')]}, index=1)),
        chunk(choice({"tool_calls": [call(0, "x", "get_weather", 'ris"}')]}, "tool_calls"),
              choice({"tool_calls": [call(0, "y", "read_file", '"}')]}, "tool_calls", index=1)),
    )
    d, _ = run(body, RequestSpec(tools=TOOLS.tools, n=2), step=13)
    assert calls_of(d, 0) == [("get_weather", {"city": "Paris"})]
    assert calls_of(d, 1) == [("read_file", {"path": "q"})]
    assert K.FINAL_CHUNK_REPEATS_METADATA_WITH_FINISH in kinds(d)


def test_it_reads_blank_arguments_as_an_empty_object() -> None:
    """C19: whitespace-only arguments; fine without required parameters, a retry with them."""
    d, _ = run(sse(tools(call(0, "a", "get_time", "  ")), finish()))
    assert calls_of(d) == [("get_time", {})] and K.EMPTY_ARGUMENTS_FOR_NO_ARG_TOOL in kinds(d)
    d, _ = run(sse(tools(call(0, "a", "read_file", "")), finish()))
    assert d.outcome is Outcome.RETRY and K.SCHEMA_VIOLATION in kinds(d)


def test_it_never_turns_truncated_arguments_into_a_call() -> None:
    """C24: ``length`` with open arguments, and a stream cut without any finish reason, are retries."""
    cut = [tools(call(0, "a", "write_file", '{"path":"p","content":"li'))]
    d, _ = run(sse(*cut, finish("length")))
    assert d.outcome is Outcome.RETRY and K.TRUNCATED_ARGUMENTS_LENGTH in kinds(d)
    d, _ = run(sse(*cut, done=False))
    assert d.outcome is Outcome.RETRY and K.MISSING_FINISH_REASON in kinds(d)
    d, _ = run(sse(*cut))
    assert d.outcome is Outcome.RETRY


def test_it_decides_the_finish_reason_once_at_the_end() -> None:
    """C32-C34 in combination: stop/""/duplicates with calls -> tool_calls; length wins over all."""
    body = sse(tools(call(0, "a", "get_time", "{}")), finish(""), finish("stop"), finish("tool_calls"))
    d, _ = run(body)
    assert d.turn is not None and d.turn.choices[0].finish_reason == "tool_calls"
    assert {K.DUPLICATE_TERMINAL_FINISH_REASON, K.EMPTY_STRING_FINISH_REASON_AND_LEGACY_STUB} <= kinds(d)
    d, _ = run(sse(tools(call(0, "a", "get_time", "{}")), finish("stop")))
    assert K.FINISH_REASON_STOP_WITH_TOOL_CALLS in kinds(d)
    d, _ = run(sse(text("cut"), finish("length"), finish("stop")))
    assert d.turn is not None and d.turn.choices[0].finish_reason == "length"
    d, _ = run(sse(text("hi", finish="eos")))
    assert d.turn is not None and d.turn.choices[0].finish_reason == "stop"


def test_it_decides_finish_per_choice() -> None:
    """C32 with n=2: the choice with a call gets tool_calls, the text-only choice keeps stop."""
    body = sse(
        chunk(choice({"content": "hello"}, index=1), choice({"tool_calls": [call(0, "a", "get_time", "{}")]})),
        chunk(choice({}, "stop"), choice({}, "stop", index=1)),
    )
    d, events = run(body, RequestSpec(tools=TOOLS.tools, n=2))
    assert d.turn is not None
    assert [(c.index, c.finish_reason, c.content) for c in d.turn.choices] == [
        (0, "tool_calls", None), (1, "stop", "hello")]
    assert released(events, 1) == "hello"


def test_it_drops_legacy_function_call_stubs_and_reads_real_ones() -> None:
    """C34: an empty ``function_call`` stub is dropped; a real legacy one becomes a call."""
    body = sse(chunk(choice({"function_call": {"name": "get_time", "arguments": ""}})),
               chunk(choice({"function_call": {"arguments": "{}"}}, "function_call")))
    d, _ = run(body)
    assert calls_of(d) == [("get_time", {})]
    assert d.turn is not None and d.turn.choices[0].finish_reason == "tool_calls"


def test_it_keeps_usage_and_skips_empty_and_filter_chunks() -> None:
    """C36, C37: empty choices first and last, usage captured, choices without delta skipped."""
    body = sse(
        chunk(cid="", prompt_filter_results=[]),
        chunk(),
        text("Hi"),
        chunk(choice(MISSING, None), cid=""),
        chunk(choice({}, "stop")),
        chunk(usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}),
    )
    d, _ = run(body)
    assert d.turn is not None and d.turn.usage == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert d.turn.choices[0].content == "Hi" and d.turn.id == "chatcmpl-1"
    assert {K.USAGE_ONLY_CHUNK_EMPTY_CHOICES, K.CONTENT_FILTER_ANNOTATION_CHUNKS} <= kinds(d)


def test_it_takes_a_requested_usage_chunk_as_the_protocol_not_a_quirk() -> None:
    """With stream_options.include_usage asked for, the usage-only chunk is no finding; unasked it is (C36)."""
    body = sse(text("Hi"), chunk(choice({}, "stop")), chunk(usage={"prompt_tokens": 1, "completion_tokens": 2}))
    asked, _ = run(body, dataclasses.replace(TOOLS, usage_requested=True))
    unasked, _ = run(body)
    assert asked.outcome == Outcome.CLEAN and asked.turn is not None and asked.turn.usage is not None
    assert K.USAGE_ONLY_CHUNK_EMPTY_CHOICES not in kinds(asked)
    assert K.USAGE_ONLY_CHUNK_EMPTY_CHOICES in kinds(unasked)
    assert RequestSpec.from_openai({"stream_options": {"include_usage": True}}).usage_requested


def test_it_turns_in_band_errors_into_upstream_errors() -> None:
    """C41: a top-level error (dict or string) or ``event: error`` aborts; ``finish_reason: error`` retries."""
    for err in ({"code": 503, "message": "overloaded"}, "overloaded"):
        d, events = run(sse(text("a"), chunk(error=err)))
        assert d.outcome is Outcome.UPSTREAM_ERROR and d.error is not None and d.error.retryable
        assert isinstance(events[-2], Abort) or any(isinstance(e, Abort) for e in events)
    d, _ = run(sse(text("a"), finish("error")))
    assert d.outcome is Outcome.RETRY and K.MID_STREAM_ERROR_CHUNK in kinds(d)
    body = b'data: {"choices":[]}\n\nevent: error\ndata: {"message":"context length exceeded","type":"x"}\n\n'
    d, _ = run(body)
    assert d.outcome is Outcome.UPSTREAM_ERROR and d.error is not None and not d.error.retryable


def test_it_retries_unparseable_foreign_and_regenerated_frames() -> None:
    """C45 family: a non-JSON frame, a JSON frame that is not an object, and a changed completion id."""
    for bad in ("{not json", "[1, 2]"):
        d, events = run(sse(text("a"), bad, finish("stop")))
        assert d.outcome is Outcome.RETRY and any(isinstance(e, Abort) for e in events), bad
    d, _ = run(sse(text("a"), chunk(choice({"content": "b"}, "stop"), cid="chatcmpl-2")))
    assert d.outcome is Outcome.RETRY and K.COMPLETION_ID_CHANGED in kinds(d)


def test_it_aborts_when_arguments_can_no_longer_be_json() -> None:
    """Early abort on dead arguments, at the frame that killed them; none with early_abort off."""
    body = sse(tools(call(0, "a", "read_file", '{"path":"x"}}')), tools(call(0, args="more")), finish())
    d, events = run(body)
    aborts = [e for e in events if isinstance(e, Abort)]
    assert len(aborts) == 1 and aborts[0].finding.kind is K.ARGUMENTS_NOT_JSON and aborts[0].finding.frame == 0
    assert d.outcome is Outcome.RETRY
    d2, events2 = run(body, policy=GuardPolicy(early_abort=False))
    assert d2.outcome is Outcome.RETRY and not any(isinstance(e, Abort) for e in events2)


def test_it_aborts_on_an_undeclared_name_only_once_the_call_is_closed() -> None:
    """An unrepairable name aborts when a later call opens, never while the name may still grow."""
    body = sse(tools(call(0, "a", "toolbox.web", '{"q":1}')), tools(call(1, "b", "get_time", "{}")), finish())
    d, events = run(body)
    abort = next(e for e in events if isinstance(e, Abort))
    assert abort.finding.kind is K.UNDECLARED_OR_PREFIXED_TOOL_NAME and abort.finding.slot == 0
    d, events = run(sse(tools(call(0, "a", "functions.get_time", "{}")), tools(call(1, "b", "get_time", "{}")),
                        finish()))
    assert d.outcome is Outcome.REPAIRED and not any(isinstance(e, Abort) for e in events)


def test_it_announces_valid_calls_when_the_next_call_opens() -> None:
    """``ToolCallValid`` for slot 0 once slot 1 opens; none for an invalid call."""
    body = sse(tools(call(0, "a", "get_weather", W)), tools(call(1, "b", "read_file", '{"nope":1}')), finish())
    d, events = run(body, policy=GuardPolicy(early_abort=False))
    valid = [e for e in events if isinstance(e, ToolCallValid)]
    assert [(v.slot, v.call.name, v.call.arguments) for v in valid] == [(0, "get_weather", W)]
    assert d.outcome is Outcome.RETRY


def test_it_streams_text_reasoning_and_refusal_per_choice() -> None:
    """Text deltas are released per choice and channel as they arrive, in order."""
    body = sse(text("thinking", "reasoning_content"), text("Hel"), text("lo", index=1), text("lo"),
               text("no", "refusal"), finish("stop"), finish("stop", 1))
    d, events = run(body, RequestSpec(tools=TOOLS.tools, n=2), step=9)
    assert released(events) == "Hello" and released(events, 1) == "lo"
    assert released(events, 0, "reasoning") == "thinking" and released(events, 0, "refusal") == "no"
    assert d.turn is not None and d.turn.choices[0].reasoning == "thinking"
    assert d.turn.choices[0].refusal == "no"


def test_it_rejects_an_empty_turn() -> None:
    """Never an empty success: no text and no call is a retry."""
    assert run(sse(chunk(choice({"role": "assistant", "content": ""})), finish("stop")))[0].outcome is Outcome.RETRY
    assert run(sse())[0].outcome is Outcome.RETRY


def test_it_ignores_frames_after_done_and_tolerates_missing_done() -> None:
    """PROTOCOLS.md 1.5: nothing counts after ``[DONE]``; a missing ``[DONE]`` after a finish is absorbed."""
    d, _ = run(sse(text("a"), finish("stop")) + sse(text("b")))
    assert d.turn is not None and d.turn.choices[0].content == "a"
    d, _ = run(sse(text("a"), finish("stop"), done=False))
    assert d.usable and K.EOF_WITHOUT_DONE in kinds(d)


def test_it_ties_findings_to_their_frame() -> None:
    """Findings carry frame number, byte offset and the capped frame text."""
    body = sse(text("a"), tools(call(0, "a", "get_weather", W, type=MISSING)), finish())
    d, _ = run(body)
    f = next(f for f in d.findings if f.kind is K.TOOL_CALL_TYPE_MISSING)
    assert f.frame == 1 and f.offset == body.index(b"data: ", 1) and '"get_weather"' in f.fragment
    assert f.action is Action.NORMALIZED


def test_it_validates_non_stream_completions_the_same_way() -> None:
    """``decide_completion``: tool calls, leaked markup in content, in-band errors, garbage."""
    message = {"role": "assistant", "content": None,
               "tool_calls": [{"id": "c", "type": "function", "function": {"name": "functions.get_time",
                                                                              "arguments": ""}}]}
    body = json.dumps({"id": "x", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
    d = decide_completion(body.encode(), TOOLS, GuardPolicy())
    assert d.outcome is Outcome.REPAIRED and calls_of(d) == [("get_time", {})]
    assert d.turn is not None and d.turn.choices[0].finish_reason == "tool_calls"
    leaked = {"role": "assistant", "content": 'ok <tool_call>{"name":"get_time","arguments":{}}</tool_call>'}
    body = json.dumps({"id": "x", "choices": [{"index": 0, "message": leaked, "finish_reason": "stop"}]})
    d = decide_completion(body.encode(), TOOLS, GuardPolicy())
    assert calls_of(d) == [("get_time", {})] and d.turn is not None and d.turn.choices[0].content == "ok "
    d = decide_completion(b'{"error":{"message":"bad","type":"invalid_request_error"}}', TOOLS, GuardPolicy())
    assert d.outcome is Outcome.UPSTREAM_ERROR and d.error is not None and not d.error.retryable
    assert decide_completion(b"<html>", TOOLS, GuardPolicy()).outcome is Outcome.RETRY


def test_it_validates_against_the_request_without_tools() -> None:
    """No declared tools: markup is plain text and any structured call is undeclared."""
    plain = RequestSpec(tools=())
    d, events = run(sse(text("<tool_call>{}</tool_call>"), finish("stop")), plain)
    assert d.usable and released(events) == "<tool_call>{}</tool_call>"
    assert run(sse(tools(call(0, "a", "x", "{}")), finish()), plain)[0].outcome is Outcome.RETRY


def test_it_checks_tool_choice_with_a_named_tool() -> None:
    """A forced tool that was not called is a retry (validated on the accumulated turn)."""
    forced = RequestSpec(tools=TOOLS.tools, tool_choice="read_file")
    assert run(sse(tools(call(0, "a", "get_time", "{}")), finish()), forced)[0].outcome is Outcome.RETRY
    assert run(sse(tools(call(0, "a", "read_file", '{"path":"x"}')), finish()), forced)[0].usable


def test_it_never_raises_and_reports_internal_errors_as_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guard bug becomes a GUARD_INTERNAL_ERROR retry, not an exception."""
    from proxy.guard.stream import accumulate

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(accumulate.Accumulator, "_chunk", boom)
    d, events = run(sse(text("a"), finish("stop")))
    assert d.outcome is Outcome.RETRY and K.GUARD_INTERNAL_ERROR in kinds(d)
    assert isinstance(events[-1], Done)


def test_it_accepts_a_single_declared_tool_called_without_schema() -> None:
    """Tools declared without parameters accept any object."""
    request = RequestSpec(tools=(ToolSpec("ping"),))
    assert calls_of(run(sse(tools(call(0, "a", "ping", '{"x":[1]}')), finish()), request)[0]) == [
        ("ping", {"x": [1]})]


def test_it_splits_calls_without_ids_at_a_shared_index_by_their_headers() -> None:
    """C09 + C08: a no-argument call then another declared tool, and two calls of one tool with headers."""
    body = sse(tools(call(0, MISSING, "get_time", "")), tools(call(0, MISSING, "read_file", "")),
               tools(call(0, args='{"path":"k"}')), finish())
    assert calls_of(run(body)[0]) == [("get_time", {}), ("read_file", {"path": "k"})]
    body = sse(tools(call(0, MISSING, "read_file", "")), tools(call(0, args='{"path":"1"}')),
               tools(call(0, MISSING, "read_file", "")), tools(call(0, args='{"path":"2"}')), finish())
    d, _ = run(body, step=5)
    assert calls_of(d) == [("read_file", {"path": "1"}), ("read_file", {"path": "2"})]
    body = sse(tools(call(0, MISSING, "read_file", '{"path":"1"}')), tools(call(0, MISSING, "read_file", "")),
               finish())
    assert calls_of(run(body)[0]) == [("read_file", {"path": "1"})]  # a trailing repeat, not a call


def test_it_reads_a_whole_message_sent_inside_a_stream_once():
    """A choice carrying ``message`` instead of ``delta`` counts only when nothing streamed before it."""
    whole = chunk({"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"})
    d, _ = run(sse(whole))
    assert d.turn is not None and d.turn.choices[0].content == "hi"
    d, _ = run(sse(text("hi"), whole))
    assert d.turn is not None and d.turn.choices[0].content == "hi"


@pytest.mark.parametrize("step", [1, 7, 4096])
def test_a_cut_stream_of_complete_tool_calls_ends_as_a_tool_call_turn(step: int) -> None:
    """The stream-end rule (issue 11 item 6): no finish reason and no [DONE], but every call's arguments a
    complete JSON value and nothing after them: a tool-call turn with a finding, not a retry. Text after
    the calls, arguments still open, or arguments invalid for the schema: a retry."""
    d, _ = run(sse(text("Checking."), tools(call(0, "a", "get_weather", '{"city":'), call(1, "b", "read_file", "")),
                   tools(call(0, None, None, '"Paris"}'), call(1, None, None, '{"path": "x"}')), done=False), step=step)
    assert d.outcome is not Outcome.RETRY, d.reason
    assert calls_of(d) == [("get_weather", {"city": "Paris"}), ("read_file", {"path": "x"})]
    assert d.turn is not None and d.turn.choices[0].finish_reason == "tool_calls"
    assert K.MISSING_FINISH_REASON in kinds(d)
    after = sse(tools(call(0, "a", "get_weather", W)), text(" and then"), done=False)
    assert run(after, step=step)[0].outcome is Outcome.RETRY
    still_open = sse(tools(call(0, "a", "get_weather", '{"city": "Pa')), done=False)
    assert run(still_open, step=step)[0].outcome is Outcome.RETRY
    invalid = sse(tools(call(0, "a", "get_weather", '{"town": "Paris"}')), done=False)
    assert run(invalid, step=step)[0].outcome is Outcome.RETRY
    only_text = sse(text("Hello"), done=False)
    assert run(only_text, step=step)[0].outcome is Outcome.RETRY
