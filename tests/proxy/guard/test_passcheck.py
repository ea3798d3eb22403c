"""``PassCheck``: the side checks of a byte-exact pass-through, at every split of the stream."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.guard.checks.passcheck import PassCheck
from proxy.guard.findings import FindingKind

K = FindingKind


def frame(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(text: str | None = None, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    delta = {"content": text} if text is not None else {}
    body: dict[str, object] = {"id": "c", "object": "chat.completion.chunk",
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        body = {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    return frame(body)


CLEAN = chunk("Hel") + chunk("lo") + chunk(finish="stop") + chunk(usage={"prompt_tokens": 3,
                                                                         "completion_tokens": 2}) + b"data: [DONE]\n\n"


def run(body: bytes, step: int) -> tuple[PassCheck, bytes]:
    check = PassCheck()
    out = b"".join(check.feed(body[i:i + step]) for i in range(0, len(body), step))
    check.finish()
    return check, out


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 10_000])
def test_it_forwards_every_byte_of_a_clean_stream_and_finds_nothing(step: int) -> None:
    """Clean stream, any split: the same bytes out, no finding, usage and frames read."""
    check, out = run(CLEAN, step)
    assert out == CLEAN and check.findings == []
    assert check.usage == {"prompt_tokens": 3, "completion_tokens": 2} and check.frames == 5 and check.done


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=60))
def test_it_never_forwards_half_a_line(cuts: list[int]) -> None:
    """Whatever the chunking, what goes out always ends at a line end (or is nothing)."""
    check = PassCheck()
    position = 0
    for size in cuts:
        out = check.feed(CLEAN[position:position + size])
        position += size
        assert out == b"" or out.endswith(b"\n")
        if position >= len(CLEAN):
            break


def test_it_holds_back_the_half_line_of_a_stream_cut_mid_frame() -> None:
    """Broken off inside a data line: the half line never reaches the client, and the stream is broken off."""
    body = chunk("Hel") + chunk("lo")[:20]
    check = PassCheck()
    out = check.feed(body)
    findings = check.finish()
    assert out == chunk("Hel")
    kinds = {f.kind for f in findings}
    assert check.broken_off and {K.FUSED_TRUNCATED_SSE_FRAMES, K.MISSING_FINISH_REASON} <= kinds


def test_it_finds_what_breaks_clients() -> None:
    """Unparseable data, an in-stream error object, a missing [DONE] after a finish reason."""
    body = b"data: {nope\n\n" + frame({"error": {"message": "overloaded"}}) + chunk(finish="stop")
    check, out = run(body, 5)
    kinds = {f.kind: f for f in check.findings}
    assert out == body
    assert set(kinds) == {K.UNPARSEABLE_DATA_FRAME, K.MID_STREAM_ERROR_CHUNK, K.EOF_WITHOUT_DONE}
    assert kinds[K.MID_STREAM_ERROR_CHUNK].fatal and not kinds[K.EOF_WITHOUT_DONE].fatal
    assert not check.broken_off and check.error == {"message": "overloaded"}


def test_it_says_when_the_client_has_an_event_not_dispatched_yet() -> None:
    """Complete data lines without their blank line: the event is half-sent (a blank line ends it whole)."""
    check = PassCheck()
    check.feed(chunk("a")[:-1])
    assert check.half_sent
    check.feed(b"\n")
    assert not check.half_sent


def test_an_echoed_credential_is_redacted_and_noted() -> None:
    """Issue 24 item 12: an answer carrying toolrelay's upstream credential never reaches the client with it:
    the credential becomes ``[redacted]`` (the rest of the bytes unchanged) and a finding says so."""
    body = chunk("your key is sk-upstream-0042") + b"data: [DONE]\n\n"
    check = PassCheck(secrets=["sk-upstream-0042"])
    assert check.feed(body) == body.replace(b"sk-upstream-0042", b"[redacted]")
    assert [f.kind for f in check.finish()] == [K.CREDENTIAL_REFLECTED]


@given(st.integers(min_value=1, max_value=60))
def test_a_credential_split_across_chunks_is_still_redacted(size: int) -> None:
    body = chunk("key sk-upstream-0042 and sk-upstream-0042 again") + b"data: [DONE]\n\n"
    check = PassCheck(secrets=["sk-upstream-0042"])
    out = b"".join(check.feed(body[i : i + size]) for i in range(0, len(body), size))
    assert b"sk-upstream" not in out and out == body.replace(b"sk-upstream-0042", b"[redacted]")
    assert K.CREDENTIAL_REFLECTED in [f.kind for f in check.finish()]


def test_a_clean_answer_is_forwarded_byte_for_byte_with_secrets_set() -> None:
    body = chunk("nothing to see") + b"data: [DONE]\n\n"
    check = PassCheck(secrets=["sk-upstream-0042"])
    assert check.feed(body) == body and check.finish() == []


def test_it_bounds_what_it_holds() -> None:
    """A line longer than the bound is forwarded unchecked rather than held without end."""
    check = PassCheck(max_line=100)
    data = b"data: " + b"x" * 500
    assert check.feed(data) == data
    assert K.UNPARSEABLE_DATA_FRAME in {f.kind for f in check.findings}


@given(st.sampled_from(["finish_reason", "usage", "error"]), st.data())
def test_a_key_spelled_with_json_escapes_is_read_like_the_plain_one(key: str, data: st.DataObject) -> None:
    """The checks look for a field's name in the frame's bytes before reading it; a JSON parser reads
    ``"us\\u0061ge"`` as ``"usage"``, so a frame with escapes takes every check."""
    i = data.draw(st.integers(0, len(key) - 1))
    spelled = key[:i] + f"\\u{ord(key[i]):04x}" + key[i + 1:]
    value = {"finish_reason": '[{"index": 0, "delta": {}, "SPELLED": "stop"}]',
             "usage": '{"prompt_tokens": 3, "completion_tokens": 2}',
             "error": '{"message": "overloaded"}'}[key]
    if key == "finish_reason":
        body = '{"id": "c", "choices": ' + value.replace("SPELLED", spelled) + "}"
    else:
        body = '{"id": "c", "choices": [], "' + spelled + '": ' + value + "}"
    plain = body.replace(spelled, key)
    assert json.loads(body) == json.loads(plain)
    got, want = run(b"data: " + body.encode() + b"\n\n", 7)[0], run(b"data: " + plain.encode() + b"\n\n", 7)[0]
    assert (got.finished, got.usage, got.error) == (want.finished, want.usage, want.error)
    assert (want.finished, want.usage, want.error) != (False, None, None)


def test_invalid_utf8_in_a_frame_is_not_json() -> None:
    """SSE is UTF-8: a frame with a stray byte is a finding, as a client's decoder would fail on it."""
    check, out = run(b'data: {"id": "c", "choices": [{"delta": {"content": "a\x80b"}}]}\n\n' + CLEAN, 5)
    assert K.UNPARSEABLE_DATA_FRAME in {f.kind for f in check.findings}
    assert out.endswith(CLEAN)
