"""The seam of a cut text stream and its continuation (``proxy.guard.stream.seam``,
``proxy.guard.decisions.continuation``): over random cut points, inside multi-byte UTF-8 and inside
SSE lines, the client's text before the cut plus the stitched continuation is exactly the uncut text,
with one completion id, one ``created``, one model and one role chunk. No server, no event loop."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.checks.passcheck import PassCheck
from proxy.guard.decisions.continuation import Shape, continuation_body, may_continue
from proxy.guard.stream.seam import Stitcher, Transcript

TEXTS = st.text(alphabet=st.sampled_from(list("ab c\n\"\\é中🙂\u2028")), min_size=1, max_size=60)


def events(pieces: list[str], *, cid: str, created: int, model: str, ascii_only: bool) -> bytes:
    """A canonical chat.completion.chunk stream of ``pieces`` (role chunk, content, finish, [DONE])."""
    def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
        obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(obj, ensure_ascii=ascii_only).encode() + b"\n\n"

    body = chunk({"role": "assistant", "content": ""})
    body += b"".join(chunk({"content": p}) for p in pieces)
    return body + chunk({}, "stop") + b"data: [DONE]\n\n"


def read(stream: bytes) -> tuple[str, set[tuple[Any, Any, Any]], int]:
    """What an SSE client gets from ``stream``: its text, its (id, created, model) set, its role chunks."""
    text, identities, roles = "", set(), 0
    for event in stream.split(b"\n\n"):
        for line in event.split(b"\n"):
            if not line.startswith(b"data: {"):
                continue
            obj = json.loads(line[6:])
            identities.add((obj["id"], obj["created"], obj["model"]))
            for choice in obj["choices"]:
                roles += "role" in choice["delta"]
                text += choice["delta"].get("content") or ""
    return text, identities, roles


def splits(data: bytes, sizes: list[int]) -> list[bytes]:
    out, at = [], 0
    for size in sizes:
        out.append(data[at:at + size])
        at += size
    return [*out, data[at:]]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(TEXTS, min_size=2, max_size=12), cut=st.floats(0.01, 0.99), ascii_only=st.booleans(),
       sizes=st.lists(st.integers(1, 40), max_size=30), data=st.data())
def test_delivered_text_plus_stitched_continuation_is_the_uncut_text(pieces: list[str], cut: float,
                                                                      ascii_only: bool, sizes: list[int],
                                                                      data: st.DataObject) -> None:
    whole = "".join(pieces)
    first = events(pieces, cid="chatcmpl-first", created=100, model="m-1", ascii_only=ascii_only)
    # The upstream cuts the first stream at any byte (inside a line, inside a UTF-8 sequence).
    sent = first[: max(1, int(cut * len(first)))]
    check, transcript, client = PassCheck(), Transcript(cap=10_000), b""
    for part in splits(sent, sizes):
        forwarded = check.feed(part)
        transcript.feed(forwarded)
        client += forwarded
    check.finish()
    delivered = transcript.text
    assert whole.startswith(delivered)
    if not transcript.continuable:  # nothing delivered yet, or the cut came after the finish
        assert delivered == "" or transcript.finished
        return
    # The continuation: another id, created, model; its own role chunk; the rest of the text in other pieces.
    rest = whole[len(delivered):]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(rest)), max_size=4)))
    rest_pieces = [rest[a:b] for a, b in zip([0, *cuts], [*cuts, len(rest)], strict=True) if rest[a:b]]
    second = events(rest_pieces, cid="chatcmpl-second", created=200, model="m-2", ascii_only=data.draw(st.booleans()))
    stitch, check2 = Stitcher(transcript.identity), PassCheck()
    if transcript.open:
        client += b"\n"
    for part in splits(second, data.draw(st.lists(st.integers(1, 40), max_size=30))):
        out = stitch.feed(check2.feed(part))
        transcript.feed(out)
        client += out
    client += stitch.flush()
    text, identities, roles = read(client)
    assert text == whole
    assert identities == {("chatcmpl-first", 100, "m-1")}
    assert roles == 1
    assert transcript.text == whole and transcript.finished


@given(data=st.binary(max_size=400), sizes=st.lists(st.integers(1, 50), max_size=20))
def test_garbage_never_raises(data: bytes, sizes: list[int]) -> None:
    transcript, stitch = Transcript(cap=100, max_line=64), Stitcher({"id": "x"}, max_event=64)
    for part in splits(data, sizes):
        transcript.feed(part)
        stitch.feed(part)
    stitch.flush()
    assert isinstance(transcript.text, str)


def test_the_transcript_stops_at_its_cap_and_at_anything_but_text() -> None:
    transcript = Transcript(cap=5)
    transcript.feed(events(["abc", "def"], cid="c", created=1, model="m", ascii_only=True)[:-40])
    assert not transcript.continuable and "more than 5 characters" in transcript.why_not
    tools = b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}\n\n'
    transcript = Transcript(cap=100)
    transcript.feed(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n' + tools)
    assert not transcript.continuable and transcript.why_not == "a delta other than text"
    two = Transcript(cap=100)
    two.feed(b'data: {"id":"c","choices":[{"index":1,"delta":{"content":"hi"}}]}\n\n')
    assert not two.continuable


def test_deepseek_prefix_body() -> None:
    body: dict[str, Any] = {"model": "deepseek-chat", "messages": [{"role": "user", "content": "q"}], "stream": True,
                            "n": 1}
    out = continuation_body(body, "Hel", Shape.DEEPSEEK_PREFIX)
    assert out["messages"] == [{"role": "user", "content": "q"},
                               {"role": "assistant", "content": "Hel", "prefix": True}]
    assert "n" not in out and "continue_final_message" not in out and body["messages"][-1]["role"] == "user"


def test_vllm_continue_final_message_body_extends_a_clients_own_prefill() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "```py\n"}],
            "continue_final_message": True, "add_generation_prompt": False}
    out = continuation_body(body, "print(", Shape.CONTINUE_FINAL_MESSAGE)
    assert out["messages"][-1] == {"role": "assistant", "content": "```py\nprint("}
    assert len(out["messages"]) == 2 and out["continue_final_message"] is True and out["add_generation_prompt"] is False


def test_no_shape_no_continuation() -> None:
    with pytest.raises(ValueError, match="takes no prefix"):
        continuation_body({"messages": []}, "x", Shape.NONE)
    assert Shape.of("made-up") is Shape.NONE
    assert not may_continue(opted_in=True, shape=Shape.NONE, continued=0, limit=2, delivered=3, cap=10)
    assert not may_continue(opted_in=False, shape=Shape.DEEPSEEK_PREFIX, continued=0, limit=2, delivered=3, cap=10)
    assert not may_continue(opted_in=True, shape=Shape.DEEPSEEK_PREFIX, continued=2, limit=2, delivered=3, cap=10)
    assert not may_continue(opted_in=True, shape=Shape.DEEPSEEK_PREFIX, continued=0, limit=2, delivered=11, cap=10)
    assert may_continue(opted_in=True, shape=Shape.DEEPSEEK_PREFIX, continued=1, limit=2, delivered=3, cap=10)
