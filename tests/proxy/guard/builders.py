"""Builders for upstream chunks and SSE bodies shared by the guard tests (not a fixture module)."""

from __future__ import annotations

import json
from typing import Any

from proxy.guard.decisions.attempt import AttemptGuard
from proxy.guard.events import Done, Event, TextDelta
from proxy.guard.findings import FindingKind
from proxy.guard.policy import GuardPolicy
from proxy.guard.turn import Decision, RequestSpec, ToolSpec

MISSING: Any = object()

OBJ = "object"
TOOLS = RequestSpec(tools=(
    ToolSpec("get_weather", {"type": OBJ, "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    ToolSpec("read_file", {"type": OBJ, "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    ToolSpec("write_file", {"type": OBJ, "properties": {"path": {"type": "string"}, "content": {"type": "string"},
                                                        "n": {"type": "integer"}}, "required": ["path"]}),
    ToolSpec("get_time", {"type": OBJ, "properties": {}}),
    ToolSpec("get", {"type": OBJ, "properties": {}}),
))
POLICY = GuardPolicy()


def chunk(*choices: dict[str, Any], cid: str = "chatcmpl-1", **extra: Any) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with the given choices."""
    return {"id": cid, "object": "chat.completion.chunk", "created": 1700000000, "model": "m",
            "choices": list(choices), **extra}


def choice(delta: Any = MISSING, finish: Any = None, index: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"index": index, "finish_reason": finish}
    if delta is not MISSING:
        out["delta"] = delta
    return out


def call(index: Any = 0, id: Any = MISSING, name: Any = MISSING, args: Any = MISSING,
         type: Any = "function", **extra: Any) -> dict[str, Any]:
    """One ``tool_calls[]`` delta entry; ``MISSING`` leaves a key out."""
    out: dict[str, Any] = {}
    if index is not MISSING:
        out["index"] = index
    if id is not MISSING:
        out["id"] = id
    if type is not MISSING:
        out["type"] = type
    fn: dict[str, Any] = {}
    if name is not MISSING:
        fn["name"] = name
    if args is not MISSING:
        fn["arguments"] = args
    out["function"] = fn
    out.update(extra)
    return out


def tools(*calls: dict[str, Any], finish: Any = None, index: int = 0) -> dict[str, Any]:
    """A chunk whose choice ``index`` carries tool-call deltas."""
    return chunk(choice({"tool_calls": list(calls)}, finish, index))


def text(content: str, channel: str = "content", finish: Any = None, index: int = 0) -> dict[str, Any]:
    return chunk(choice({channel: content}, finish, index))


def finish(reason: Any = "tool_calls", index: int = 0) -> dict[str, Any]:
    return chunk(choice({}, reason, index))


def sse(*chunks: Any, done: bool = True) -> bytes:
    """``data: <json>\\n\\n`` per chunk (strings are sent verbatim), then ``[DONE]``."""
    frames = [c if isinstance(c, str) else json.dumps(c) for c in chunks]
    if done:
        frames.append("[DONE]")
    return "".join(f"data: {f}\n\n" for f in frames).encode()


def run(body: bytes, request: RequestSpec = TOOLS, policy: GuardPolicy = POLICY,
        step: int | None = None) -> tuple[Decision, list[Event]]:
    """Feed ``body`` (whole, or ``step`` bytes at a time); return the decision and every event."""
    guard = AttemptGuard(request, policy)
    events: list[Event] = []
    step = step or len(body) or 1
    for i in range(0, len(body), step):
        events += guard.feed(body[i : i + step])
    events += guard.finish()
    done = events[-1]
    assert isinstance(done, Done)
    return done.decision, events


def calls_of(decision: Decision, index: int = 0) -> list[tuple[str, Any]]:
    assert decision.turn is not None, decision.reason
    c = next(c for c in decision.turn.choices if c.index == index)
    return [(t.name, json.loads(t.arguments)) for t in c.tool_calls]


def kinds(decision: Decision) -> set[FindingKind]:
    return {f.kind for f in decision.findings}


def released(events: list[Event], index: int = 0, channel: str = "content") -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta) and e.choice == index
                   and e.channel == channel)
