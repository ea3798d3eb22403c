"""Hostile upstreams: ``hostile:KIND`` answers that a proxy must survive (fault tolerance tests).

Each disturbs a clean generated stream (``gen`` options apply; ``broken=N`` limits it to the first N
attempts):

- ``gzip``: the stream gzip-compressed (``content-encoding: gzip``) whatever the request accepted;
- ``json-error``: HTTP 200 with a JSON error body in place of the stream;
- ``json-turn``: HTTP 200 with the whole ``chat.completion`` JSON in place of the stream;
- ``unfinished``: the text frames, then a clean end of the body: no finish reason, no ``[DONE]``;
- ``cut-frame``: the frames up to the finish, then half of the next frame, then the connection drops;
- ``drip``: one byte every ``ms`` (default 1000) without end;
- ``endless``: text frames every ``ms`` (default 0) without end;
- ``huge-line``: one data line of ``bytes`` bytes (default 50 MB) before the stream.
"""

from __future__ import annotations

import itertools
import json
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from proxy.simulator.scenario import ScenarioError

if TYPE_CHECKING:
    from proxy.simulator.planner import PlanContext, Reply

KINDS = ("gzip", "json-error", "json-turn", "unfinished", "cut-frame", "drip", "endless", "huge-line")


class Endless:
    """Pieces without end (``iter`` makes a fresh generator; ``len`` is a large number for planning code)."""

    def __init__(self, make: Iterator[bytes]) -> None:
        self._iterator = make

    def __iter__(self) -> Iterator[bytes]:
        return self._iterator

    def __len__(self) -> int:
        return 1 << 30


def disturb(reply: Reply, ctx: PlanContext) -> Reply:
    """``reply`` (a clean generated stream) disturbed as ``ctx.scenario.value`` says."""
    kind = ctx.scenario.value or ""
    if kind not in KINDS:
        raise ScenarioError(f"{ctx.scenario.text}: hostile needs one of {', '.join(KINDS)}")
    reply.fault = f"hostile-{kind}"
    pieces = list(reply.pieces)
    if kind == "gzip":
        compressor = zlib.compressobj(wbits=31)
        reply.pieces = [compressor.compress(p) + compressor.flush(zlib.Z_SYNC_FLUSH) for p in pieces]
        reply.pieces.append(compressor.flush())
        reply.headers.append(("content-encoding", "gzip"))
    elif kind in ("json-error", "json-turn"):
        reply.content_type, reply.streamed = "application/json", False
        reply.pieces = [json.dumps(_error() if kind == "json-error" else _completion(pieces)).encode()]
    elif kind == "unfinished":
        reply.pieces = [p for p in pieces if b'"finish_reason":null' in p or b'"finish_reason"' not in p]
        reply.pieces = [p for p in reply.pieces if not p.startswith(b"data: [DONE]") and b'"usage":{' not in p]
    elif kind == "cut-frame":
        finish = next(i for i, p in enumerate(pieces) if b'"finish_reason":"' in p)
        reply.pieces = [*pieces[:finish], pieces[finish][: len(pieces[finish]) // 2]]
        reply.drop_after = len(reply.pieces)
    elif kind in ("drip", "endless"):
        reply.frame_gap = ctx.seconds("ms", 1000 if kind == "drip" else 0)
        head = pieces[0]
        unit = [b"d"] if kind == "drip" else [p for p in pieces if b'"content":"' in p][:1] or [head]
        reply.pieces = Endless(itertools.chain([head], itertools.cycle(unit)))  # type: ignore[assignment]
    else:
        size = ctx.scenario.get_int("bytes", 50 * 1024 * 1024)
        reply.pieces = [b"data: " + b"x" * size + b"\n\n", *pieces]
    return reply


def _error() -> dict[str, object]:
    return {"error": {"message": "The server is overloaded (simulated, in a 200 answer).", "type": "server_error",
                      "code": "overloaded"}}


def _completion(pieces: list[bytes]) -> dict[str, object]:
    """The whole turn the stream's frames carry, as one ``chat.completion`` object (text turns only)."""
    text, model, cid = "", "sim", "chatcmpl-sim"
    for piece in pieces:
        if not piece.startswith(b"data: {"):
            continue
        frame = json.loads(piece[6:])
        cid, model = frame.get("id", cid), frame.get("model", model)
        for choice in frame.get("choices") or ():
            text += (choice.get("delta") or {}).get("content") or ""
    return {"id": cid, "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}
