"""Property tests for the readings the field corpus (``tests/corpus/D100``-``D141``) added to the guard.

Each generates a valid turn from a random schema, applies one family's corruption as the public reports
show it, and checks that the unique reading gives back exactly the turn a clean stream gives (with the
family's finding), and that the corruptions the reading must not take are still retried or left alone:

- a scalar argument sent as its JSON text (``"123"`` for an integer: SGLang glm parsers, D103);
- a completion id that changes on chunks carrying nothing of the turn (llama.cpp, D110), and the same
  change on a chunk with content (another generation: retried);
- only dialect markup after a call's complete arguments (``</tool_call>``: SiliconFlow, D131);
- usage sent inside the choice (Moonshot, D111);
- ``[DONE]`` with no finish reason on a text turn (vllm-mlx, D136);
- only end-of-turn tokens at the end of a text turn (TGI ``<|im_end|>``, D141), and such a token inside
  the text, which stays.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.guard.findings import FindingKind
from proxy.guard.turn import Outcome

from .test_assemble import schema_and_args
from .test_readings import SETTINGS, body, calls, chunk, decide, frames_of, kinds, request

K = FindingKind
SCALARS = st.one_of(
    st.tuples(st.just("integer"), st.integers(-10**9, 10**9)),
    st.tuples(st.just("number"), st.floats(allow_nan=False, allow_infinity=False, width=32)),
    st.tuples(st.just("boolean"), st.booleans()),
    st.tuples(st.just("null"), st.none()),
)
MARKUP = st.sampled_from(["</tool_call>", "\n</tool_call>", " <|tool_call_end|>", "<|tool_calls_section_end|>",
                          "</function>\n</tool_call>", "<|im_end|>"])
END_TOKENS = st.sampled_from(["<|im_end|>", "<|eot_id|>", "<|eom_id|>", " <|end|>", "<|endoftext|>\n"])
PROSE = st.text(st.characters(codec="utf-8", exclude_characters="<|｜\x00"), min_size=1, max_size=40).filter(
    lambda s: s.strip())


@SETTINGS
@given(schema_and_args(), SCALARS, st.integers(0, 1000))
def test_a_scalar_sent_as_its_json_text_reads_as_the_scalar(sa: tuple[dict[str, Any], dict[str, Any]],
                                                             scalar: tuple[str, Any], cut: int) -> None:
    """A property typed integer/number/boolean/null (no string allowed) arrives as ``"<json text>"``."""
    schema, args = sa
    kind, value = scalar
    schema = {**schema, "properties": {**schema["properties"], "zz": {"type": kind}},
              "required": [*schema["required"], "zz"]}
    sent = {**args, "zz": json.dumps(value)}
    raw = body(frames_of("act", sent))
    d, _ = decide(raw, request("act", schema), cut=cut % (len(raw) + 1))
    assert d.outcome is Outcome.REPAIRED, d.reason
    assert calls(d) == [("act", {**args, "zz": json.loads(json.dumps(value))})]
    assert K.NESTED_VALUES_DOUBLE_ENCODED in kinds(d)


def test_a_scalar_text_is_left_alone_where_a_string_is_allowed_or_the_type_differs() -> None:
    both = {"type": "object", "properties": {"n": {"type": ["string", "integer"]}}, "required": ["n"]}
    d, _ = decide(body(frames_of("act", {"n": "123"})), request("act", both))
    assert d.usable and calls(d) == [("act", {"n": "123"})]  # the plain reading is valid: nothing read
    integer = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    for text in ("1.5", " 12", "true", "12abc"):
        d, _ = decide(body(frames_of("act", {"n": text})), request("act", integer))
        assert d.outcome is Outcome.RETRY, text  # not exactly the JSON text of an integer: no reading


@SETTINGS
@given(schema_and_args(), st.integers(1, 4), st.booleans(), st.integers(0, 1000))
def test_an_id_changed_on_chunks_with_nothing_of_the_turn_reads_as_one_generation(
        sa: tuple[dict[str, Any], dict[str, Any]], pieces: int, usage_chunk: bool, cut: int) -> None:
    schema, args = sa
    frames = frames_of("act", args, pieces)
    tail = frames[-1:] + ([{**chunk({}), "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4,
                                                                   "total_tokens": 7}}] if usage_chunk else [])
    for f in tail:
        f["id"] = "hp"
    raw = body(frames[:-1] + tail)
    d, _ = decide(raw, request("act", schema), cut=cut % (len(raw) + 1))
    assert d.usable and calls(d) == [("act", args)], d.reason
    assert K.COMPLETION_ID_CHANGED in kinds(d)


def test_content_after_a_changed_id_is_another_generation() -> None:
    req = request("act", {"type": "object"})
    frames = frames_of("act", {"k": 1})
    frames[-1]["id"] = "b"
    frames.append(chunk({"content": "again"}, cid="b"))
    assert decide(body(frames), req)[0].outcome is Outcome.RETRY
    text = [chunk({"role": "assistant", "content": "Hi"}), chunk({"content": "!"}), chunk({}, "stop", cid="b"),
            chunk({"role": "assistant", "content": "Hi"}, cid="b")]
    assert decide(body(text), req)[0].outcome is Outcome.RETRY


@SETTINGS
@given(schema_and_args(), MARKUP, st.integers(1, 4), st.integers(0, 1000))
def test_only_dialect_markup_after_complete_arguments_is_dropped(sa: tuple[dict[str, Any], dict[str, Any]],
                                                                  markup: str, pieces: int, cut: int) -> None:
    schema, args = sa
    frames = frames_of("act", args, pieces)
    frames.insert(-1, chunk({"tool_calls": [{"index": 0, "function": {"arguments": markup}}]}))
    raw = body(frames)
    d, _ = decide(raw, request("act", schema), cut=cut % (len(raw) + 1))
    assert d.outcome is Outcome.REPAIRED and calls(d) == [("act", args)], d.reason
    assert K.MARKUP_RESIDUE_IN_CONTENT in kinds(d)


def test_markup_with_anything_else_after_the_arguments_is_not_dropped() -> None:
    frames = frames_of("act", {"k": 1})
    frames.insert(-1, chunk({"tool_calls": [{"index": 0, "function": {"arguments": "</tool_call> more"}}]}))
    d, _ = decide(body(frames), request("act", {"type": "object"}))
    assert d.outcome is Outcome.RETRY


@SETTINGS
@given(schema_and_args(), st.integers(0, 10**6), st.integers(0, 10**6))
def test_usage_inside_the_choice_is_the_turns_usage(sa: tuple[dict[str, Any], dict[str, Any]], prompt: int,
                                                    completion: int) -> None:
    schema, args = sa
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    frames = frames_of("act", args)
    frames[-1]["choices"][0]["usage"] = usage
    d, _ = decide(body(frames), request("act", schema))
    assert d.turn is not None and d.turn.usage == usage and calls(d) == [("act", args)]
    assert K.ENVELOPE_VARIANT in kinds(d)


@SETTINGS
@given(PROSE, st.booleans())
def test_done_without_a_finish_reason_ends_a_text_turn_with_stop(text: str, done: bool) -> None:
    frames = [chunk({"role": "assistant", "content": ""}), chunk({"content": text})]
    raw = body(frames) if done else body(frames).removesuffix(b"data: [DONE]\n\n")
    d, got = decide(raw, request("act", {"type": "object"}))
    if done:
        assert d.usable and got == text and d.turn is not None and d.turn.choices[0].finish_reason == "stop"
    else:
        assert d.outcome is Outcome.RETRY  # cut off: no [DONE], no finish reason
    assert K.MISSING_FINISH_REASON in kinds(d)


@SETTINGS
@given(PROSE, END_TOKENS, st.integers(0, 1000))
def test_only_end_of_turn_tokens_at_the_end_of_a_text_turn_are_stripped(text: str, token: str, cut: int) -> None:
    frames = [chunk({"role": "assistant", "content": ""}), chunk({"content": text}), chunk({"content": token}),
              chunk({}, "stop")]
    raw = body(frames)
    d, got = decide(raw, request("act", {"type": "object"}), cut=cut % (len(raw) + 1))
    # trailing whitespace before the token is held with it (``residue.tail_run``) and goes with it
    assert d.outcome is Outcome.REPAIRED and got in (text, text.rstrip()), (got, d.reason)
    assert K.MARKUP_RESIDUE_IN_CONTENT in kinds(d)


@SETTINGS
@given(PROSE, END_TOKENS, PROSE)
def test_an_end_of_turn_token_inside_the_text_stays(before: str, token: str, after: str) -> None:
    frames = [chunk({"role": "assistant", "content": before + token}), chunk({"content": after}), chunk({}, "stop")]
    d, got = decide(body(frames), request("act", {"type": "object"}))
    assert d.usable and got == before + token + after
    assert K.MARKUP_RESIDUE_IN_CONTENT not in kinds(d)
