"""``cut=F``: a text stream cut at fraction F of a deterministic generation, and its continuation.

The generation is a text of ``chars`` characters (words with multi-byte UTF-8 among them: accented
letters, CJK, an emoji), sent raw (not ASCII-escaped) in content pieces of one to three words. It
depends on the seed and the request's ``messages`` only, never on the attempt, and a continuation
request's trailing assistant message is not part of it: the continuation continues the same text.

A fresh request (no prefix to continue) is cut: the body stops in the middle of the SSE line of the
content piece holding character ``floor(F * len(text))`` (so the cut falls inside a line, and with
``utf8=1`` may fall inside a character), then ``how``: ``drop`` closes the TCP connection, ``eof`` ends
the chunked body cleanly (a stream without finish reason or ``[DONE]``), ``stall`` sends the whole
pieces before the cut and then nothing for ``ms`` milliseconds (an idle timeout), then the rest.

A continuation request is honoured in the shapes ``accept`` names, each as its upstream documents it
(``proxy.guard.decisions.continuation`` has the sources; written here independently):
``deepseek`` (last message ``role: assistant`` with ``"prefix": true``), ``vllm``
(``continue_final_message: true`` and ``add_generation_prompt: false``), ``both`` (default) or ``none``.
Honoured: the answer streams the generation after the prefix (when the prefix is not a prefix of the
generation, after their common prefix: a wrong seam shows in the joined text), never cut, with a
completion id and ``created`` of its own. Not honoured: a fresh, uncut answer of the whole text (what a
model that ignores the prefix flag would say).
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from proxy.simulator import frames
from proxy.simulator.scenario import Scenario, ScenarioError
from proxy.simulator.turns import Turn, finish

_WORDS = (
    "the", "stream", "reads", "each", "frame", "and", "the", "proxy", "keeps", "what", "reached", "client",
    "café", "naïve", "über", "señal", "流式", "文本", "续写", "🙂", "seam", "exact", "text", "flows", "on",
)  # fmt: skip
HOWS = ("drop", "eof", "stall")
ACCEPTS = ("both", "deepseek", "vllm", "none")


def generation(seed: int, messages: Any, chars: int) -> str:
    """The deterministic text for ``messages`` (at least ``chars`` characters, whole words)."""
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True, default=str).encode()).hexdigest()
    rng = random.Random(f"{seed}|cut|{digest}")  # noqa: S311 - a reproducible simulation stream
    words: list[str] = []
    size = 0
    while size < max(1, chars):
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words) + "."


def pieces(text: str, rng: random.Random) -> list[str]:
    """``text`` split into content pieces of one to three words (the joined pieces are ``text``)."""
    words = text.split(" ")
    out: list[str] = []
    while words:
        take = rng.randint(1, 3)
        out.append(" ".join(words[:take]) + (" " if len(words) > take else ""))
        words = words[take:]
    return out


def prefix_of(body: dict[str, Any], accept: str) -> tuple[str | None, list[Any]]:
    """The prefix a continuation request asks to continue (None: not one this upstream honours) and the
    messages the generation depends on (the trailing assistant message left out when it is a prefix)."""
    raw = body.get("messages")
    messages: list[Any] = raw if isinstance(raw, list) else []
    last = messages[-1] if messages else None
    if not (isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), str)):
        return None, messages
    deepseek = last.get("prefix") is True
    vllm = body.get("continue_final_message") is True and body.get("add_generation_prompt") is False
    asked = deepseek or vllm
    honoured = (deepseek and accept in ("both", "deepseek")) or (vllm and accept in ("both", "vllm"))
    if not asked:
        return None, messages
    return (last["content"] if honoured else None), messages[:-1]


def options(scenario: Scenario) -> tuple[float, str, str]:
    """``(fraction, how, accept)`` of a ``cut`` scenario; raises ``ScenarioError`` on bad values."""
    try:
        fraction = float(scenario.value or "")
    except ValueError:
        raise ScenarioError(f"{scenario.text}: cut needs a fraction, e.g. cut=0.6") from None
    how, accept = scenario.options.get("how", "drop"), scenario.options.get("accept", "both")
    if not 0.0 < fraction < 1.0:
        raise ScenarioError(f"{scenario.text}: cut must be between 0 and 1 (exclusive)")
    if how not in HOWS or accept not in ACCEPTS:
        raise ScenarioError(f"{scenario.text}: how is one of {', '.join(HOWS)}; accept one of {', '.join(ACCEPTS)}")
    return fraction, how, accept


def stream_pieces(text: str, rng: random.Random, body: dict[str, Any], *, utf8: bool,
                  include_usage: bool) -> tuple[list[bytes], list[int]]:
    """The SSE events of a clean text answer of ``text``, and for each content event the character
    offset where its piece starts (-1 for the other events)."""
    turn = Turn(completion_id=f"chatcmpl-cut{rng.getrandbits(48):012x}", created=1_700_000_000 + rng.randint(0, 10**6),
                model=str(body.get("model") or "cut"), content=pieces(text, rng))
    finish(turn, body)
    stream = frames.build_stream(turn, include_usage=include_usage)
    offsets, at = [], 0
    for frame in stream.frames:
        if frame.tag == frames.CONTENT:
            offsets.append(at)
            at += len(frame.chunk["choices"][0]["delta"]["content"])  # type: ignore[index]
        else:
            offsets.append(-1)
    return [_bytes(f, utf8) for f in stream.frames], offsets


def _bytes(frame: frames.Frame, utf8: bool) -> bytes:
    if not utf8 or frame.chunk is None:
        return frames.frame_bytes(frame)
    return b"data: " + json.dumps(frame.chunk, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def cut_at(events: list[bytes], offsets: list[int], char: int) -> tuple[list[bytes], int]:
    """The events up to the cut (the last one a half line: the middle of the event whose piece holds
    character ``char``, never the first piece, so some text was delivered) and the number of whole events
    before it."""
    content = [i for i, at in enumerate(offsets) if at >= 0]
    index = next((i for i in reversed(content) if offsets[i] <= char), 1)
    if len(content) > 1:
        index = max(index, content[1])  # the first piece always reaches the client: text was delivered
    head = events[index]
    return [*events[:index], head[: max(1, len(head) // 2)]], index
