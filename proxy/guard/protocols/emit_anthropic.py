"""Anthropic Messages emitter: canonical ``/v1/messages`` SSE events and non-stream Message objects.

Canonical means (PROTOCOLS.md section 0 items 2, 5-7, 9-12; 2.2-2.4, 2.7; 5.3):

- every event is ``event: <type>`` + ``data: <compact ASCII JSON whose type is the same>`` + a
  blank line: both Anthropic SDKs dispatch on the event name and drop events without one, and
  Claude Code then silently re-sends the request without streaming (0.2, 4.4);
- ``message_start`` (with ``message.usage``) -> content blocks -> ``message_delta`` (stop reason,
  ``usage.output_tokens`` always present: the Python SDK requires it, 0.9) -> ``message_stop``;
  never ``[DONE]``;
- content blocks come from the state machine ``proxy.guard.protocols.anthropic_blocks.ContentBlocks``: one
  block open at a time, never a delta of one type inside a block of another, indexes 0, 1, 2… in
  ``content_block_start`` order (0.11), the empty start payloads the SDK builds on (0.10), a
  ``signature_delta`` just before a thinking block's stop (2.3), and no blank text block before a
  tool_use (Claude Code renders it; issue 13). The signature is derived from the thinking text
  (``thinking_signature``), so the block Claude Code echoes back (4.3) can be recognised; the
  translator carries the echoed text back as ``reasoning_content``;
- keep-alives are ``event: ping`` with ``data: {"type":"ping"}`` (0.6); a mid-stream failure is
  ``event: error`` with ``{"type":"error","error":{"type","message"}}`` (0.12).

Decisions:

- Text and reasoning stream live into text / thinking blocks; a change of channel closes the open
  block (whitespace-only text is held, see ``ContentBlocks``). Refusal text goes into a text block
  and makes the stop reason ``refusal`` (2.7).
- Tool calls go out at close, after the guard validated them, each as one ``tool_use`` block whose
  ``input_json_delta`` fragments concatenate to the validated arguments. Ids are the turn's,
  restricted to ``[a-zA-Z0-9_-]`` (2.7) and made unique; names shortened by the translator are
  mapped back.
- Stop reason (2.7): any tool_use block -> ``tool_use``; ``length`` -> ``max_tokens``;
  ``content_filter`` or refusal text -> ``refusal``; otherwise ``end_turn``. A stop-sequence hit
  is indistinguishable from ``stop`` in chat.completions, so ``stop_sequence`` stays null.
- Usage (2.7): ``input_tokens = prompt_tokens - cached_tokens``, ``cache_read_input_tokens =
  cached_tokens``, ``output_tokens = completion_tokens``; ``message_start`` carries the input
  estimate given to the constructor (the upstream's count is only known at the end).
- Only choice 0 exists in this protocol; deltas of other choices are ignored.
- Anything asked after a close returns ``b""``.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from proxy.guard.checks.usage import read_usage
from proxy.guard.events import Channel
from proxy.guard.protocols.anthropic_blocks import ARGUMENT_SLICE, SIGNATURE_PREFIX, ContentBlocks, thinking_signature
from proxy.guard.stream.sse import encode_event
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn, UpstreamError

_ID_BAD = re.compile(r"[^a-zA-Z0-9_-]")
_PING = encode_event("ping", {"type": "ping"})

#: HTTP status -> Anthropic error type (PROTOCOLS.md 2.4).
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 402: "billing_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """The Anthropic error type for an HTTP status (PROTOCOLS.md 2.4): other 4xx are
    ``invalid_request_error``, 503 ``overloaded_error``, other 5xx (502, 504) ``api_error``."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    if status == 503:
        return "overloaded_error"
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
    """``{"type":"error","error":{"type","message"}}`` with the type of ``status`` (PROTOCOLS.md 2.4);
    ``param`` (no field of its own in Anthropic's shape) prefixes the message."""
    if param and param not in message:
        message = f"{param}: {message}"
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def is_own_signature(thinking: str, signature: str) -> bool:
    """True when ``signature`` is the one this proxy gave ``thinking``."""
    return signature == thinking_signature(thinking)


def usage_from_openai(usage: dict[str, Any] | None) -> dict[str, int]:
    """Anthropic usage for an upstream usage object of any family (PROTOCOLS.md 2.7, ``proxy.guard.checks.usage``):
    ``input_tokens`` without the cache reads and writes, which are ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens``; zeros when unknown."""
    return read_usage(usage).anthropic()


def stop_reason(choice: ChoiceTurn, *, refused: bool = False) -> str:
    """The Anthropic ``stop_reason`` for a chat choice (PROTOCOLS.md 2.7)."""
    if choice.tool_calls:
        return "tool_use"
    if choice.finish_reason == "length":
        return "max_tokens"
    if choice.finish_reason == "content_filter" or refused or choice.refusal:
        return "refusal"
    return "end_turn"


class AnthropicMessagesEmitter:
    """Renders one Anthropic Messages response (the ``Emitter`` protocol of ``proxy.guard.protocols.emit``).

    ``model`` is the model name the client asked for; ``message_id`` defaults to ``msg_`` + 24 hex
    digits; ``input_tokens`` is the estimate sent in ``message_start``; ``tool_names`` maps upstream
    tool names back to the client's (``Translation.tool_names``). Stateful per response, no I/O.

    Message states: new -> started (``message_start`` sent, by ``open()`` or the first other call)
    -> ended (``message_stop`` or ``error`` sent; every later call returns ``b""``). Content blocks
    are ``ContentBlocks``' business (``proxy.guard.protocols.anthropic_blocks``).
    """

    protocol = "anthropic-messages"
    overflow_in_stream = False  # Claude Code reads it from an HTTP 400 (status checked, cli.js)

    def __init__(self, *, model: str, message_id: str | None = None, input_tokens: int = 0,
                 tool_names: dict[str, str] | None = None) -> None:
        self.model = model
        self.message_id = message_id or f"msg_{secrets.token_hex(12)}"
        self.input_tokens = input_tokens
        self._start_usage = {"input_tokens": input_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 0}
        self.tool_names = dict(tool_names or {})
        self._started = False
        self._closed = False
        self._blocks = ContentBlocks()
        self._refused = False

    # -- streaming -----------------------------------------------------------------------------

    def open(self) -> bytes:
        """``message_start`` with an empty message and its usage (PROTOCOLS.md 2.3, 0.10)."""
        if self._started or self._closed:
            return b""
        self._started = True
        message: dict[str, Any] = {"id": self.message_id, "type": "message", "role": "assistant", "content": [],
                   "model": self.model, "stop_reason": None, "stop_sequence": None,
                   "usage": dict(self._start_usage)}
        return encode_event("message_start", {"type": "message_start", "message": message})

    def early_usage(self, usage: dict[str, Any]) -> None:
        """Before ``open``: the upstream's prompt counts (cache reads and writes apart, PROTOCOLS.md 2.7) stand
        in for the estimate in ``message_start``, as Anthropic's own stream counts the prompt there (a zero
        there breaks clients' cost tracking, vercel/ai#17326). A usage without a prompt count changes nothing."""
        read = read_usage(usage)
        if self._started or read.prompt is None:
            return
        counts = read.anthropic()
        self._start_usage = {**counts, "output_tokens": 0}

    def text(self, choice: int, channel: Channel, text: str) -> bytes:
        """A ``thinking_delta`` (reasoning) or ``text_delta`` (content, refusal), opening a block if needed."""
        if self._closed or choice != 0 or not text:
            return b""
        self._refused = self._refused or channel == "refusal"
        opening = self.open()
        if channel == "reasoning":
            return opening + self._blocks.thinking(text)
        return opening + self._blocks.text(text)

    def keepalive(self) -> bytes:
        """``event: ping`` + ``data: {"type":"ping"}`` (PROTOCOLS.md 0.6; Claude Code counts it as activity, 5.2)."""
        return b"" if self._closed else _PING

    def close(self, turn: Turn) -> bytes:
        """Tool-use blocks, ``message_delta`` (stop reason, usage) and ``message_stop``.

        Held whitespace (see ``ContentBlocks``) is dropped before tool_use blocks, else released.
        """
        if self._closed:
            return b""
        choice = _first_choice(turn)
        out = [self.open()]
        if not choice.tool_calls:
            out.append(self._blocks.release())
        for call, call_id in zip(choice.tool_calls, tool_use_ids(choice.tool_calls), strict=True):
            out.append(self._blocks.tool_use(call_id, self.tool_names.get(call.name, call.name), call.arguments))
        out.append(self._finish(stop_reason(choice, refused=self._refused), turn.usage))
        return b"".join(out)

    def _finish(self, reason: str, usage: dict[str, Any] | None) -> bytes:
        """``message_delta`` + ``message_stop``; the emitter is closed afterwards."""
        self._closed = True
        counts: dict[str, int] = usage_from_openai(usage) if isinstance(usage, dict) else {"output_tokens": 0}
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None}, "usage": counts}
        return encode_event("message_delta", delta) + encode_event("message_stop", {"type": "message_stop"})

    def close_exhausted(self, message: str) -> bytes:
        """``message`` in a new text block, stop reason ``end_turn`` (agents do not retry it)."""
        if self._closed:
            return b""
        blocks = self._blocks
        out = [self.open(), blocks.stop(), blocks.text(message), blocks.release()]
        out.append(self._finish("end_turn", None))
        return b"".join(out)

    def close_error(self, error: UpstreamError) -> bytes:
        """``event: error`` (PROTOCOLS.md 2.3, 0.12), ending the stream without ``message_stop``."""
        if self._closed:
            return b""
        self._closed = True
        return encode_event("error", {"type": "error",
                                      "error": {"type": error_type(error.status), "message": error.message}})

    def close_terminal(self, message: str) -> bytes:
        """``event: error`` of type ``invalid_request_error`` carrying ``message``, after at least one
        content block. Claude Code retries ``api_error`` / ``overloaded_error`` and, for an error before
        any content block, falls back to a non-streaming request; an ``invalid_request_error`` after a
        block (an empty text block when nothing was sent) it shows once as "API Error: ..." and stops,
        and ``claude -p`` exits 1 with ``is_error: true`` (measured with Claude Code 2.1, docs/clients.md)."""
        if self._closed:
            return b""
        blocks = self._blocks
        out = [self.open(), blocks.release()]
        if blocks.count == 0:
            out.append(encode_event("content_block_start", {"type": "content_block_start", "index": 0,
                                                            "content_block": {"type": "text", "text": ""}}))
            out.append(encode_event("content_block_stop", {"type": "content_block_stop", "index": 0}))
            blocks.count = 1
        self._closed = True
        out.append(encode_event("error", {"type": "error",
                                          "error": {"type": "invalid_request_error", "message": message}}))
        return b"".join(out)

    # -- non-stream ----------------------------------------------------------------------------

    def complete(self, turn: Turn) -> dict[str, Any]:
        """The Message object for ``turn`` (PROTOCOLS.md 2.2)."""
        choice = _first_choice(turn)
        content: list[dict[str, Any]] = []
        if choice.reasoning:
            content.append({"type": "thinking", "thinking": choice.reasoning,
                            "signature": thinking_signature(choice.reasoning)})
        text = (choice.content or "") + (choice.refusal or "")
        if text.strip() or (text and not choice.tool_calls):  # no blank text block before a tool_use (issue 13)
            content.append({"type": "text", "text": text})
        for call, call_id in zip(choice.tool_calls, tool_use_ids(choice.tool_calls), strict=True):
            content.append({"type": "tool_use", "id": call_id, "name": self.tool_names.get(call.name, call.name),
                            "input": _arguments(call.arguments)})
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": stop_reason(choice), "stop_sequence": None,
                "usage": usage_from_openai(turn.usage)}

    def complete_exhausted(self, message: str) -> dict[str, Any]:
        """The Message object whose only block is ``message`` (stop reason ``end_turn``)."""
        return self.complete(Turn(choices=[ChoiceTurn(content=message, finish_reason="stop")]))

    def error_body(self, status: int, message: str, *, type: str, param: str | None = None,
                   code: str | None = None) -> dict[str, Any]:
        """``{"type":"error","error":{"type","message"}}`` with the type of ``status`` (PROTOCOLS.md 2.4).

        ``type`` / ``param`` / ``code`` are OpenAI-style details with no place in Anthropic's shape;
        ``param`` is appended to the message so the client still sees which field is wrong.
        """
        return error_body(status, message, param=param)


def tool_use_ids(calls: list[ToolCall]) -> list[str]:
    """The calls' ids restricted to ``^[a-zA-Z0-9_-]+$`` (PROTOCOLS.md 2.7), unique within the message."""
    ids: list[str] = []
    for call in calls:
        clean = _ID_BAD.sub("_", call.id or "") or f"toolu_{secrets.token_hex(12)}"
        candidate, k = clean, 1
        while candidate in ids:
            k += 1
            candidate = f"{clean}_{k}"
        ids.append(candidate)
    return ids


def _first_choice(turn: Turn) -> ChoiceTurn:
    return next((c for c in turn.choices if c.index == 0), ChoiceTurn())


def _arguments(arguments: str) -> Any:
    """A validated call's arguments as an object (``{}`` if the text is somehow not JSON)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


__all__ = ["ARGUMENT_SLICE", "SIGNATURE_PREFIX", "AnthropicMessagesEmitter", "error_body", "error_type",
           "is_own_signature", "stop_reason", "thinking_signature", "tool_use_ids", "usage_from_openai"]
