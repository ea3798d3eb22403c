"""A turn as OpenAI Chat Completions wire data: SSE frames for streams, a JSON body otherwise.

The clean shapes follow PROTOCOLS.md 1.2-1.5 (what api.openai.com sends): a role chunk, content /
reasoning deltas, for each tool call a header delta ``{index, id, type, function: {name,
arguments: ""}}`` then argument-only deltas, a separate finish chunk, the usage chunk with
``choices: []`` when asked for, and ``data: [DONE]``. Frames stay structured (tagged dicts) until
:func:`render_stream`, so faults can rewrite them before they become bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from proxy.simulator.turns import Turn

#: Frame tags: what part of the turn a frame carries (faults add comments, errors, annotations).
ROLE, REASONING, CONTENT, CALL_HEAD, CALL_ARGS, FINISH, USAGE, DONE = (
    "role", "reasoning", "content", "call-head", "call-args", "finish", "usage", "done",
)  # fmt: skip
RAW, COMMENT, ERROR, ANNOTATION = "raw", "comment", "error", "annotation"


@dataclass
class Frame:
    """One SSE event: ``chunk`` (serialised after the data prefix), or exact ``raw`` bytes."""

    tag: str
    chunk: dict[str, Any] | None = None
    raw: bytes | None = None
    call: int = -1  # the tool-call slot this frame belongs to, -1 for none

    def entries(self) -> list[dict[str, Any]]:
        """The ``delta.tool_calls`` entries of this frame (empty when it has none)."""
        choices = (self.chunk or {}).get("choices") or [{}]
        entries: list[dict[str, Any]] = choices[0].get("delta", {}).get("tool_calls", [])
        return entries


@dataclass(frozen=True)
class Envelope:
    """Builds ``chat.completion.chunk`` objects with one completion's identity fields."""

    completion_id: str
    created: int
    model: str
    include_usage: bool = False

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        """A one-choice chunk; ``usage: null`` on every chunk when usage was asked for (1.4)."""
        out: dict[str, Any] = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if self.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        """The final usage chunk: ``choices`` is always an empty array."""
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
        }


@dataclass
class Stream:
    """A framed turn; a stream without a ``DONE`` frame ends without ``data: [DONE]``."""

    envelope: Envelope
    frames: list[Frame] = field(default_factory=list)
    data_prefix: bytes = b"data: "

    def index_of(self, tag: str, call: int | None = None, *, last: bool = False) -> int:
        """Position of the first (or last) frame with ``tag`` (and ``call``), -1 if none."""
        positions = [i for i, f in enumerate(self.frames) if f.tag == tag and (call is None or f.call == call)]
        return (positions[-1] if last else positions[0]) if positions else -1

    def tagged(self, tag: str) -> list[Frame]:
        """Frames with ``tag``, in order."""
        return [f for f in self.frames if f.tag == tag]


def build_stream(turn: Turn, *, include_usage: bool) -> Stream:
    """Frame ``turn`` the canonical way (see the module docstring)."""
    env = Envelope(turn.completion_id, turn.created, turn.model, include_usage)
    frames = [Frame(ROLE, env.chunk({"role": "assistant", "content": ""}))]
    frames += [Frame(REASONING, env.chunk({"reasoning_content": p})) for p in turn.reasoning]
    frames += [Frame(CONTENT, env.chunk({"content": p})) for p in turn.content]
    for index, call in enumerate(turn.calls):
        head_arguments = call.wire if not isinstance(call.wire, str) else ""
        head = {"index": index, "id": call.id, "type": "function"}
        head["function"] = {"name": call.name, "arguments": head_arguments}
        frames.append(Frame(CALL_HEAD, env.chunk({"tool_calls": [head]}), call=index))
        for piece in call.fragments:
            entry = {"index": index, "function": {"arguments": piece}}
            frames.append(Frame(CALL_ARGS, env.chunk({"tool_calls": [entry]}), call=index))
    frames.append(Frame(FINISH, env.chunk({}, turn.finish_reason)))
    if include_usage:
        frames.append(Frame(USAGE, env.usage_chunk(turn.usage)))
    frames.append(Frame(DONE))
    return Stream(envelope=env, frames=frames)


def usage_on_every_chunk(stream: Stream, usage: dict[str, Any]) -> None:
    """``usage`` on every chunk, its completion count growing chunk by chunk to the total (vLLM's
    ``stream_options.continuous_usage_stats``; the prompt is counted from the first chunk on)."""
    chunks = [f.chunk for f in stream.frames if f.chunk is not None and f.tag != USAGE]
    total = int(usage.get("completion_tokens") or 0)
    for k, chunk in enumerate(chunks, start=1):
        done = total * k // len(chunks)
        chunk["usage"] = {**usage, "completion_tokens": done,
                                "total_tokens": int(usage.get("prompt_tokens") or 0) + done}


def frame_bytes(frame: Frame, data_prefix: bytes = b"data: ") -> bytes:
    """The exact bytes of one event (compact JSON, ASCII-escaped, blank-line terminated)."""
    if frame.raw is not None:
        return frame.raw
    if frame.tag == DONE:
        return data_prefix + b"[DONE]\n\n"
    return data_prefix + json.dumps(frame.chunk, separators=(",", ":")).encode() + b"\n\n"


def render_stream(stream: Stream) -> list[bytes]:
    """One bytes piece per event, in order."""
    return [frame_bytes(f, stream.data_prefix) for f in stream.frames]


def completion_body(turn: Turn) -> dict[str, Any]:
    """The non-stream ``chat.completion`` object for ``turn`` (PROTOCOLS.md 1.2)."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(turn.content) or None}
    if turn.reasoning:
        message["reasoning_content"] = "".join(turn.reasoning)
    if turn.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.wire}} for c in turn.calls
        ]
    return {
        "id": turn.completion_id,
        "object": "chat.completion",
        "created": turn.created,
        "model": turn.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": turn.finish_reason}],
        "usage": turn.usage,
    }
