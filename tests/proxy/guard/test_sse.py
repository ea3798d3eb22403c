"""SSE decoder and encoders (PROTOCOLS.md 5.1; fault cases C38, C40, C43), tested like httpx's decoders."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.stream.sse import SSEDecoder, SSEEvent, encode_comment, encode_data, encode_done, encode_event


def decode(body: bytes, *splits: int) -> list[SSEEvent]:
    """Decode ``body`` fed in pieces cut at ``splits``, flushing at the end."""
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    cuts = [0, *splits, len(body)]
    for a, b in zip(cuts, cuts[1:], strict=False):
        out += dec.feed(body[a:b])
    return out + dec.flush()


def decode_bytewise(body: bytes) -> list[SSEEvent]:
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    for i in range(len(body)):
        out += dec.feed(body[i : i + 1])
    return out + dec.flush()


MIXED = (
    "\ufeff: keepalive\r\n\r\n"
    "event: chunk\r\nid: 7\r\ndata: {\"a\":\"é☃\"}\r\n\r\n"
    "data:x\rdata: y\r\r"
    ": c1\n: c2\ndata: z\n\n"
    "error: {\"code\":500}\n\n"
    "data: tail"
).encode()


def test_it_gives_identical_events_at_every_split() -> None:
    """Any two-piece split (inside UTF-8 sequences, inside CRLF, inside the BOM) decodes the same."""
    whole = decode(MIXED)
    assert [e.data for e in whole] == ['{"a":"é☃"}', "x\ny", "z", "", "tail"]
    for i in range(len(MIXED) + 1):
        assert decode(MIXED, i) == whole, i
    assert decode_bytewise(MIXED) == whole


def test_it_handles_crlf_cr_and_lf_line_ends_alike() -> None:
    """CRLF, CR and LF all end lines; a CRLF split between feeds is one line end."""
    for eol in (b"\r\n", b"\r", b"\n"):
        body = b"data: a" + eol + b"data: b" + eol + eol + b"data: c" + eol + eol
        events = decode(body)
        assert [e.data for e in events] == ["a\nb", "c"]
        assert all(e.terminated for e in events)
    events = decode(b"data: a\r\n\r\ndata: b\r\n\r\n", 8)
    assert [e.data for e in events] == ["a", "b"]


def test_it_strips_one_leading_bom_only() -> None:
    """The UTF-8 BOM is dropped at the start of the body, even split byte by byte, never elsewhere."""
    body = b"\xef\xbb\xbfdata: 1\n\n\xef\xbb\xbfdata: 2\n\n"
    assert [e.data for e in decode_bytewise(body)] == ["1"]
    assert decode(body)[0].offset == 3
    assert [e.data for e in decode(b"\xef\xbbdata: 1\n\n")] == []  # a broken BOM is a garbage field name


def test_it_reports_comments_on_the_next_event_and_never_dispatches_them() -> None:
    """C40: comment lines are ignored but reported on the following event."""
    body = b": OPENROUTER PROCESSING\n\n: OPENROUTER PROCESSING\n\ndata: {}\n\n: tail\n\n"
    events = decode(body)
    assert len(events) == 1
    assert events[0].comments == ("OPENROUTER PROCESSING", "OPENROUTER PROCESSING")
    assert events[0].frame == 0


def test_it_joins_multi_line_data_with_newlines() -> None:
    """Spec: each data line appends value + LF; the last LF is stripped."""
    assert decode(b"data: a\ndata:\ndata:  b\n\n")[0].data == "a\n\n b"


def test_it_accepts_data_without_a_space_and_reports_it() -> None:
    """C38: ``data:{...}`` is valid; the event says it had no space."""
    ev = decode(b'data:{"x":1}\n\n')[0]
    assert ev.data == '{"x":1}' and ev.no_space
    assert not decode(b'data: {"x":1}\n\n')[0].no_space


def test_it_dispatches_an_unterminated_last_event_marked() -> None:
    """At EOF an event without its blank line is dispatched with ``terminated=False``."""
    events = decode(b"data: 1\n\ndata: 2")
    assert [(e.data, e.terminated) for e in events] == [("1", True), ("2", False)]
    events = decode(b"data: 1\n\ndata: 2\n")
    assert [(e.data, e.terminated) for e in events] == [("1", True), ("2", False)]


def test_it_dispatches_a_nonstandard_error_field_without_data() -> None:
    """C43: ``error: {...}`` is kept and dispatched although the spec ignores the field."""
    ev = decode(b'error: {"code":400,"message":"too long"}\n\ndata: [DONE]\n\n')
    assert ev[0].error == '{"code":400,"message":"too long"}'
    assert not ev[0].has_data
    assert ev[1].data == "[DONE]" and ev[1].error is None


def test_it_keeps_event_names_ids_retry_and_offsets() -> None:
    """``event``/``id``/``retry`` fields, byte offsets of the first field line, frame numbers, raw lines."""
    body = b": hi\n\nevent: ping\n\nevent: message_start\nid: 1\nretry: 50\ndata: {}\n\ndata: 2\n\n"
    events = decode(body)
    assert [(e.event, e.id, e.retry, e.frame) for e in events] == [
        ("message_start", "1", 50, 0), ("message", "1", 50, 1)]
    assert events[0].offset == body.index(b"event: message_start")
    assert events[1].offset == body.index(b"data: 2")
    assert events[0].raw == "event: message_start\nid: 1\nretry: 50\ndata: {}"


def test_it_ignores_events_with_empty_data_buffers() -> None:
    """Spec: a blank line with no data lines dispatches nothing (``event: ping`` alone)."""
    assert decode(b"event: ping\n\nid: 3\n\nfoo: bar\n\n") == []


def test_it_replaces_undecodable_bytes() -> None:
    """Invalid UTF-8 never raises; it becomes U+FFFD."""
    assert decode(b"data: \xff\xfe\n\n")[0].data == "\ufffd\ufffd"


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(min_value=0, max_value=300), max_size=4))
def test_it_never_raises_on_random_bytes(body: bytes, cuts: list[int]) -> None:
    """Arbitrary bytes in arbitrary splits decode without raising and identically to one piece."""
    cuts = sorted(c for c in cuts if c <= len(body))
    assert decode(body, *cuts) == decode(body)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=5), st.data())
def test_it_round_trips_encoded_frames(texts: list[str], data: st.DataObject) -> None:
    """Encoded data frames decode back to the same JSON at any split."""
    body = b"".join(encode_data({"t": t}) for t in texts) + encode_done()
    cut = data.draw(st.integers(min_value=0, max_value=len(body)))
    events = decode(body, cut)
    assert [json.loads(e.data) for e in events[:-1]] == [{"t": t} for t in texts]
    assert events[-1].data == "[DONE]"


def test_it_encodes_canonical_frames() -> None:
    """Encoders: compact ASCII JSON, ``[DONE]``, comments without line breaks, Anthropic event pairs."""
    assert encode_data({"a": "é", "b": [1]}) == b'data: {"a":"\\u00e9","b":[1]}\n\n'
    assert encode_done() == b"data: [DONE]\n\n"
    assert encode_comment("keep\nalive") == b": keep alive\n\n"
    assert encode_event("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'
