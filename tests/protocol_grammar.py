"""Protocol grammars of the streams toolrelay emits, written from ../shared/PROTOCOLS.md (not from the emitters).

``anthropic_content(events)`` checks a decoded Anthropic Messages stream (list of ``(event name,
data)``) against PROTOCOLS.md 2.3 and section 0 items 2 and 9-12, plus toolrelay's own rules from
issue 13 (no empty block, no blank text block before a tool_use), and returns the content it
carries. ``responses_output(events)`` does the same for an OpenAI Responses stream (PROTOCOLS.md
3.4 and section 0 item 3; event shapes from openai-python ``src/openai/types/responses/``).
Both raise ``AssertionError`` naming the first rule broken.
"""

from __future__ import annotations

import json
import re
from typing import Any

_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
STOP_REASONS = frozenset({"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal",
                          "model_context_window_exceeded"})
#: Empty ``content_block_start`` payloads (PROTOCOLS.md section 0 item 10).
_START_PAYLOADS = {"text": {"type": "text", "text": ""},
                   "thinking": {"type": "thinking", "thinking": "", "signature": ""}}
_DELTAS = {"text": {"text_delta", "citations_delta"}, "thinking": {"thinking_delta", "signature_delta"},
           "tool_use": {"input_json_delta"}}


class _Anthropic:
    """The checker's state: blocks seen, the open one, and where the message is."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.phase = "before-start"  # before-start | blocks | delta | stopped | errored
        self.stop_reason: str | None = None
        self.output_tokens: int | None = None

    def event(self, name: str, data: dict[str, Any]) -> None:
        assert data.get("type") == name, f"event name {name!r} is not the data's type {data.get('type')!r}"
        assert self.phase not in ("stopped", "errored"), f"{name} after the end of the stream"
        if name == "ping":
            return
        if name == "error":
            assert isinstance(data.get("error"), dict) and data["error"].get("type") and data["error"].get("message")
            self.phase = "errored"
            return
        if self.phase == "before-start":
            assert name == "message_start", f"{name} before message_start"
            self.message_start(data)
            return
        getattr(self, name, self.unknown)(data)

    def unknown(self, data: dict[str, Any]) -> None:
        raise AssertionError(f"unexpected event {data.get('type')!r}")

    def message_start(self, data: dict[str, Any]) -> None:
        message = data["message"]
        assert (message["type"], message["role"], message["content"], message["stop_reason"]) == (
            "message", "assistant", [], None)
        usage = message["usage"]
        assert isinstance(usage["input_tokens"], int) and isinstance(usage["output_tokens"], int)
        self.phase = "blocks"

    def content_block_start(self, data: dict[str, Any]) -> None:
        assert self.phase == "blocks", "content_block_start after message_delta"
        assert self.open is None, "a block starts while another is open"
        assert data["index"] == len(self.blocks), f"block index {data['index']}, expected {len(self.blocks)}"
        block = data["content_block"]
        kind = block["type"]
        if kind == "tool_use":
            assert set(block) == {"type", "id", "name", "input"} and block["input"] == {}
            assert _TOOL_ID.match(block["id"]) and block["name"], block
            assert all(b.get("id") != block["id"] for b in self.blocks), "duplicate tool_use id"
        else:
            assert block == _START_PAYLOADS.get(kind), f"start payload {block}"
        self.open = {"type": kind, "index": data["index"], "text": "", "signature": None, "deltas": 0,
                     **({"id": block["id"], "name": block["name"]} if kind == "tool_use" else {})}
        self.blocks.append(self.open)

    def content_block_delta(self, data: dict[str, Any]) -> None:
        block = self.open
        assert block is not None and data["index"] == block["index"], "delta outside its open block"
        delta = data["delta"]
        assert delta["type"] in _DELTAS[block["type"]], f"{delta['type']} inside a {block['type']} block"
        assert block["signature"] is None, "a delta after the signature_delta"
        if delta["type"] == "signature_delta":
            assert isinstance(delta["signature"], str)
            block["signature"] = delta["signature"]
            return
        key = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}[delta["type"]]
        assert isinstance(delta[key], str)
        block["text"] += delta[key]
        block["deltas"] += 1

    def content_block_stop(self, data: dict[str, Any]) -> None:
        block = self.open
        assert block is not None and data["index"] == block["index"], "stop of a block that is not open"
        if block["type"] == "thinking":
            assert block["signature"] is not None, "thinking block without a signature_delta"
        if block["type"] in ("text", "thinking"):
            assert block["text"], f"empty {block['type']} block"
        else:
            assert isinstance(json.loads(block["text"]), dict), "tool_use input is not a JSON object"
        self.open = None

    def message_delta(self, data: dict[str, Any]) -> None:
        assert self.open is None, "message_delta while a block is open"
        assert data["delta"]["stop_reason"] in STOP_REASONS, data
        assert "stop_sequence" in data["delta"]
        assert isinstance(data["usage"]["output_tokens"], int), "message_delta.usage.output_tokens is required"
        self.stop_reason, self.output_tokens = data["delta"]["stop_reason"], data["usage"]["output_tokens"]
        self.phase = "delta"

    def message_stop(self, data: dict[str, Any]) -> None:
        assert self.phase == "delta", "message_stop without message_delta"
        self.phase = "stopped"


def anthropic_content(events: list[tuple[str | None, dict[str, Any]]]) -> tuple[list[dict[str, Any]], str | None]:
    """Check an Anthropic Messages stream; return (content blocks, stop reason or None when it ended in ``error``).

    Blocks come back as ``{"type": "text", "text"}``, ``{"type": "thinking", "thinking", "signature"}``
    or ``{"type": "tool_use", "id", "name", "input"}``.
    """
    state = _Anthropic()
    for name, data in events:
        assert name is not None, "an Anthropic event without an event: line (PROTOCOLS.md section 0 item 2)"
        state.event(name, data)
    assert state.phase in ("stopped", "errored"), f"the stream ended in phase {state.phase}"
    for before, after in zip(state.blocks, state.blocks[1:], strict=False):
        if after["type"] == "tool_use" and before["type"] == "text":
            assert before["text"].strip(), "a blank text block right before a tool_use (issue 13)"
    content = [_content(b) for b in state.blocks]  # a block cut by an error is returned as far as it got
    return content, state.stop_reason if state.phase == "stopped" else None


def _content(block: dict[str, Any]) -> dict[str, Any]:
    if block["type"] == "text":
        return {"type": "text", "text": block["text"]}
    if block["type"] == "thinking":
        return {"type": "thinking", "thinking": block["text"], "signature": block["signature"] or ""}
    return {"type": "tool_use", "id": block["id"], "name": block["name"], "input": json.loads(block["text"])}


# -- OpenAI Responses ------------------------------------------------------------------------------

_TERMINAL = {"response.completed": "completed", "response.incomplete": "incomplete", "response.failed": "failed"}
_ITEM_DELTAS = {"message": ("response.output_text.delta", "response.output_text.done", "text"),
                "reasoning": ("response.reasoning_text.delta", "response.reasoning_text.done", "text"),
                "function_call": ("response.function_call_arguments.delta", "response.function_call_arguments.done",
                                  "arguments"),
                "custom_tool_call": ("response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
                                     "input"),
                "local_shell_call": (None, None, None)}


class _Responses:
    def __init__(self) -> None:
        self.seq = 0
        self.response_id: str | None = None
        self.done: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.terminal: dict[str, Any] | None = None

    def event(self, data: dict[str, Any]) -> None:
        assert self.terminal is None, f"{data.get('type')} after the terminal event"
        assert data.get("sequence_number") == self.seq, f"sequence_number {data.get('sequence_number')} != {self.seq}"
        self.seq += 1
        kind = data["type"]
        if self.response_id is None:
            assert kind == "response.created", f"{kind} before response.created"
            self.response_id = data["response"]["id"]
            assert data["response"]["status"] == "in_progress" and self.response_id
            return
        if kind == "response.in_progress":
            assert data["response"]["id"] == self.response_id
        elif kind in _TERMINAL:
            self.end(kind, data["response"])
        elif kind == "response.output_item.added":
            self.added(data)
        elif kind == "response.output_item.done":
            self.item_done(data)
        else:
            self.inner(kind, data)

    def added(self, data: dict[str, Any]) -> None:
        assert self.open is None, "an item is added while another is open"
        assert data["output_index"] == len(self.done), "output_index is not the next one"
        item = data["item"]
        assert item["type"] in _ITEM_DELTAS, f"unknown item type {item['type']}"
        assert item["status"] == "in_progress"
        self.open = {"item": item, "index": data["output_index"], "text": "", "part": False, "text_done": None,
                     "part_done": False}
        if item["type"] in ("function_call", "custom_tool_call"):
            assert item[_ITEM_DELTAS[item["type"]][2]] == "" and item["call_id"] and item["name"]

    def inner(self, kind: str, data: dict[str, Any]) -> None:
        state = self.open
        assert state is not None, f"{kind} outside an item"
        item = state["item"]
        assert data["output_index"] == state["index"] and data["item_id"] == item["id"], f"{kind} for another item"
        delta_kind, done_kind, field = _ITEM_DELTAS[item["type"]]
        if kind == "response.content_part.added":
            assert item["type"] in ("message", "reasoning") and not state["part"] and data["content_index"] == 0
            assert data["part"]["text"] == ""
            state["part"] = True
        elif kind == delta_kind:
            assert state["text_done"] is None and (state["part"] or item["type"] not in ("message", "reasoning"))
            state["text"] += data["delta"]
        elif kind == done_kind:
            assert state["text_done"] is None and data[field] == state["text"], f"{kind} text differs from the deltas"
            state["text_done"] = data[field]
        elif kind == "response.content_part.done":
            assert state["text_done"] is not None and data["part"]["text"] == state["text"]
            state["part_done"] = True
        else:
            raise AssertionError(f"unexpected event {kind} inside a {item['type']} item")

    def item_done(self, data: dict[str, Any]) -> None:
        state = self.open
        assert state is not None and data["output_index"] == state["index"], "output_item.done of no open item"
        item, added = data["item"], state["item"]
        assert (item["type"], item["id"]) == (added["type"], added["id"]) and item["status"] in ("completed",
                                                                                                "incomplete")
        if item["type"] in ("message", "reasoning"):
            assert state["part_done"], "output_item.done before content_part.done"
            assert [p["text"] for p in item["content"]] == [state["text"]], "the done item lacks the full text"
        elif item["type"] == "local_shell_call":
            assert isinstance(item["action"]["command"], list) and item["action"]["type"] == "exec"
        else:
            field = _ITEM_DELTAS[item["type"]][2]
            assert state["text_done"] is not None and item[field] == state["text"], "the done item lacks its input"
            assert item["call_id"] == added["call_id"] and item["name"] == added["name"]
        self.done.append(item)
        self.open = None

    def end(self, kind: str, response: dict[str, Any]) -> None:
        assert response["id"] == self.response_id and response["status"] == _TERMINAL[kind]
        if kind == "response.failed":
            assert response["error"]["code"] and response["error"]["message"]
        else:
            assert self.open is None, f"{kind} with an item still open"
            assert response["output"] == self.done, "the terminal response's output differs from the done items"
            usage = response["usage"]
            assert all(isinstance(usage[k], int) for k in ("input_tokens", "output_tokens", "total_tokens"))
        if kind == "response.incomplete":
            assert response["incomplete_details"]["reason"] in ("max_output_tokens", "content_filter")
        else:
            assert response.get("incomplete_details") is None
        self.terminal = response


def responses_output(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Check an OpenAI Responses stream (event data, in order); return (done items, terminal Response)."""
    state = _Responses()
    for data in events:
        state.event(data)
    assert state.terminal is not None, "the stream ended without response.completed / incomplete / failed"
    return state.done, state.terminal


# -- OpenAI Chat history ---------------------------------------------------------------------------


def assert_tool_pairing(messages: list[dict[str, Any]]) -> None:
    """A chat history as upstreams accept it (PROTOCOLS.md 1.1): each assistant message with
    ``tool_calls`` is followed at once by one string ``tool`` message per call id, in order; no
    other ``tool`` message; no two assistant messages in a row."""
    for i, message in enumerate(messages):
        if message["role"] == "tool":
            assert isinstance(message["content"], str)
            previous = next(m for m in reversed(messages[:i]) if m["role"] != "tool")
            assert previous["role"] == "assistant" and message["tool_call_id"] in [
                c["id"] for c in previous.get("tool_calls") or []], f"tool message {i} answers no call"
        if message["role"] == "assistant" and message.get("tool_calls"):
            ids = [c["id"] for c in message["tool_calls"]]
            assert len(set(ids)) == len(ids), "repeated call id"
            following = messages[i + 1 : i + 1 + len(ids)]
            assert [(m["role"], m.get("tool_call_id")) for m in following] == [("tool", x) for x in ids]
        if message["role"] == "assistant" and i:
            assert messages[i - 1]["role"] != "assistant", "consecutive assistant messages"
