"""OpenAI Responses emitter: ``/v1/responses`` SSE events and non-stream Response objects.

The stream (PROTOCOLS.md section 0 item 3; 3.4, "Sequence the proxy should emit", accepted by
Codex 0.171.0):

    response.created -> response.in_progress ->
      [reasoning] output_item.added(reasoning) -> content_part.added(reasoning_text "")
                  -> reasoning_text.delta… -> reasoning_text.done -> content_part.done -> output_item.done
      [text]      output_item.added(message, content: []) -> content_part.added(output_text "")
                  -> output_text.delta… -> output_text.done -> content_part.done -> output_item.done
      [tool]      output_item.added(function_call, arguments "") -> function_call_arguments.delta…
                  -> function_call_arguments.done -> output_item.done(function_call, full arguments)
      [custom]    output_item.added(custom_tool_call, input "") -> custom_tool_call_input.delta…
                  -> custom_tool_call_input.done -> output_item.done(custom_tool_call, full input)
      [shell]     output_item.added(local_shell_call) -> output_item.done(local_shell_call)
    -> response.completed | response.incomplete (response with id, status, output, usage)
     | response.failed (response with id, status "failed", error)

Every event has ``type`` and ``sequence_number`` (0, 1, 2…) and goes out as ``event: <type>`` +
``data: <compact ASCII JSON>`` (Codex dispatches on ``data.type``; the ``event:`` line is harmless,
0.3). ``response.output_item.done`` carries the full item: it is what Codex records (0.3, 3.4).

Decisions:

- Text and reasoning stream live; a change of channel completes the open item. Reasoning goes out
  as ``reasoning_text`` (a chat upstream's ``reasoning_content`` is raw chain of thought, not a
  summary); Codex reads ``response.reasoning_text.delta`` (``codex-rs/codex-api/src/sse/responses.rs``).
- Refusal text is sent as ``output_text``: Codex's ``ContentItem`` has no refusal variant
  (``codex-rs/protocol/src/models.rs``), and an item it cannot parse is lost.
- Tool calls go out at close, after the guard validated them; ``call_id`` is the turn's id
  (made unique and non-empty). ``Translation.tool_names`` (``proxy.guard.protocols.responses_tools``) says
  what each upstream function stands for: a flattened namespace name is split back into ``name``
  and ``namespace`` (openai-python ``ResponseFunctionToolCall.namespace``); a custom tool's call
  becomes a ``custom_tool_call`` item whose ``input`` is the raw text the ``input`` argument held;
  ``local_shell`` calls become ``local_shell_call`` items with ``action: {"type": "exec", …}``.
- The terminal event says how the turn ended, as OpenAI's own stream does: ``response.completed``
  for a finished turn; ``response.incomplete`` (``status: "incomplete"``, ``incomplete_details.reason``
  ``max_output_tokens`` / ``content_filter``) for a ``length`` / ``content_filter`` finish;
  ``response.failed`` (``close_error``) with ``response.error {code, message}`` (3.4, 5.3) for a
  stream that broke off. Never ``response.completed`` for a cut stream. Codex treats the codes
  ``context_length_exceeded`` / ``insufficient_quota`` as terminal and retries the rest; it also
  retries on ``response.incomplete``, as it does against OpenAI.
- Exhaustion (``close_exhausted``, the policy's deliberate answer when retries ran out on broken
  model output): ``response.completed`` with a message item holding the text, a finished turn the
  agent does not retry (the ``error`` exhaustion policy uses ``close_error`` instead).
- Keep-alives are SSE comments (0.6). Usage: ``input_tokens`` / ``output_tokens`` /
  ``total_tokens`` with their details (3.4; Codex needs the three totals when usage is present).
- Only choice 0 exists in this protocol; deltas of other choices are ignored.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

from proxy.guard.checks.usage import read_usage
from proxy.guard.events import Channel
from proxy.guard.protocols.emit_openai import error_body as openai_error_body
from proxy.guard.protocols.responses_tools import client_tool, custom_input, local_shell_action
from proxy.guard.stream.sse import encode_comment, encode_event
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn, UpstreamError

#: Argument text is sent in slices of at most this many characters (one delta event each).
ARGUMENT_SLICE = 4096
_KEEPALIVE = encode_comment("keepalive")
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
#: Failure codes Codex does not retry (``codex-rs/codex-api/src/sse/responses.rs``).
_TERMINAL_CODES = frozenset({"context_length_exceeded", "insufficient_quota"})


def failure_code(error: UpstreamError) -> str:
    """The ``response.error.code`` for ``error``: Codex's terminal codes pass through (PROTOCOLS.md
    3.4: ``context_length_exceeded`` / ``insufficient_quota`` end the turn), 429 is
    ``rate_limit_exceeded``, the rest ``server_error`` (codes openai-python's ``ResponseError`` knows)."""
    if error.code in _TERMINAL_CODES:
        return str(error.code)
    return "rate_limit_exceeded" if error.status == 429 else "server_error"


def usage_from_openai(usage: dict[str, Any] | None) -> dict[str, Any]:
    """Responses usage for an upstream usage object of any family (PROTOCOLS.md 3.4, ``proxy.guard.checks.usage``):
    ``input_tokens_details.cached_tokens`` / ``cache_write_tokens``, ``output_tokens_details.reasoning_tokens``;
    zeros when unknown."""
    return read_usage(usage).responses()


class _Item:
    """The output item being streamed: a message or a reasoning item with one content part."""

    def __init__(self, kind: str, item_id: str, index: int) -> None:
        self.kind = kind  # "message" | "reasoning"
        self.id = item_id
        self.index = index
        self.text: list[str] = []

    @property
    def part_type(self) -> str:
        return "output_text" if self.kind == "message" else "reasoning_text"

    def part(self, text: str) -> dict[str, Any]:
        if self.kind == "message":
            return {"type": "output_text", "text": text, "annotations": []}
        return {"type": "reasoning_text", "text": text}

    def item(self, status: str) -> dict[str, Any]:
        """The item with its full text (``content: []`` while it is being added)."""
        content = [self.part("".join(self.text))] if status == "completed" else []
        if self.kind == "message":
            return {"id": self.id, "type": "message", "role": "assistant", "status": status, "content": content}
        return {"id": self.id, "type": "reasoning", "status": status, "summary": [], "content": content}


class OpenAIResponsesEmitter:
    """Renders one OpenAI Responses response (the ``Emitter`` protocol of ``proxy.guard.protocols.emit``).

    ``model`` is the model name the client asked for; ``request`` the client's Responses request
    (its ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``instructions``, ``max_output_tokens``,
    ``temperature``, ``top_p`` are echoed on the Response object, as OpenAI does); ``tool_names``
    maps upstream tool names to ``ClientTool(namespace, name, kind)`` or a ``(namespace, name)``
    pair (``Translation.tool_names``);
    ``response_id`` defaults to ``resp_`` + 24 hex digits, ``created_at`` to now.
    Stateful per response, no I/O.
    """

    protocol = "openai-responses"
    #: Codex maps ``context_length_exceeded`` to ``ContextWindowExceeded`` (compaction, a full context
    #: meter) only from ``response.failed`` (codex-rs/codex-api/src/sse/responses.rs); an HTTP 400 it takes
    #: for an ordinary invalid request (codex-rs/codex-api/src/api_bridge.rs).
    overflow_in_stream = True

    def __init__(self, *, model: str, request: dict[str, Any] | None = None, response_id: str | None = None,
                 created_at: int | None = None, tool_names: dict[str, Any] | None = None) -> None:
        self.model = model
        self.request = request or {}
        self.response_id = response_id or f"resp_{secrets.token_hex(12)}"
        self.created_at = int(time.time()) if created_at is None else created_at
        self.tool_names = dict(tool_names or {})
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # completed items, in output order
        self._open: _Item | None = None
        self._started = False
        self._closed = False

    # -- framing -------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        """One event with its ``type`` and ``sequence_number``."""
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return encode_event(kind, event)

    def _response(self, status: str, *, usage: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
                  incomplete: str | None = None) -> dict[str, Any]:
        """The Response object (PROTOCOLS.md 3.4) with the items completed so far."""
        request = self.request
        return {
            "id": self.response_id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.model, "output": list(self._output), "usage": usage, "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": request.get("instructions") if isinstance(request.get("instructions"), str) else None,
            "max_output_tokens": _maybe_int(request.get("max_output_tokens")),
            "parallel_tool_calls": request.get("parallel_tool_calls") is not False,
            "temperature": _maybe_number(request.get("temperature")), "top_p": _maybe_number(request.get("top_p")),
            "tool_choice": request.get("tool_choice") if request.get("tool_choice") is not None else "auto",
            "tools": request.get("tools") if isinstance(request.get("tools"), list) else [],
            "metadata": {}, "store": False,
        }

    # -- streaming -----------------------------------------------------------------------------

    def open(self) -> bytes:
        """``response.created`` and ``response.in_progress``."""
        if self._started or self._closed:
            return b""
        self._started = True
        response = self._response("in_progress")
        return self._event("response.created", response=response) + self._event("response.in_progress",
                                                                                 response=response)

    def early_usage(self, usage: dict[str, Any]) -> None:
        """Nothing: this protocol says usage only at the end."""

    def text(self, choice: int, channel: Channel, text: str) -> bytes:
        """An ``output_text`` or ``reasoning_text`` delta, opening its item if needed."""
        if self._closed or choice != 0 or not text:
            return b""
        kind = "reasoning" if channel == "reasoning" else "message"
        out = [self.open()]
        if self._open is None or self._open.kind != kind:
            out.append(self._complete_item())
            out.append(self._add_item(kind))
        item = self._open
        assert item is not None
        item.text.append(text)
        delta_type = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        out.append(self._event(delta_type, item_id=item.id, output_index=item.index, content_index=0, delta=text,
                               **extra))
        return b"".join(out)

    def _add_item(self, kind: str) -> bytes:
        """``output_item.added`` (empty) and ``content_part.added`` (empty part)."""
        prefix = "msg" if kind == "message" else "rs"
        item = _Item(kind, f"{prefix}_{secrets.token_hex(12)}", len(self._output))
        self._open = item
        return (self._event("response.output_item.added", output_index=item.index, item=item.item("in_progress"))
                + self._event("response.content_part.added", item_id=item.id, output_index=item.index,
                              content_index=0, part=item.part("")))

    def _complete_item(self) -> bytes:
        """``*.done`` for the open item's text, its part and the item itself (full), if one is open."""
        item = self._open
        if item is None:
            return b""
        self._open = None
        text = "".join(item.text)
        if item.kind == "message":
            done = self._event("response.output_text.done", item_id=item.id, output_index=item.index,
                               content_index=0, text=text, logprobs=[])
        else:
            done = self._event("response.reasoning_text.done", item_id=item.id, output_index=item.index,
                               content_index=0, text=text)
        full = item.item("completed")
        self._output.append(full)
        return (done + self._event("response.content_part.done", item_id=item.id, output_index=item.index,
                                   content_index=0, part=item.part(text))
                + self._event("response.output_item.done", output_index=item.index, item=full))

    def keepalive(self) -> bytes:
        """An SSE comment (PROTOCOLS.md 0.6)."""
        return b"" if self._closed else _KEEPALIVE

    def close(self, turn: Turn) -> bytes:
        """Tool-call items, then ``response.completed`` (``response.incomplete`` after a ``length`` /
        ``content_filter`` finish)."""
        if self._closed:
            return b""
        choice = _first_choice(turn)
        out = [self.open(), self._complete_item()]
        out += list(self._call_items(choice.tool_calls))
        out.append(self._completed(turn.usage, _INCOMPLETE.get(choice.finish_reason or "")))
        return b"".join(out)

    def _call_items(self, calls: list[ToolCall]) -> Iterator[bytes]:
        """Per call: ``output_item.added`` (no input yet), the input deltas and their ``.done``, and
        ``output_item.done`` with the full item (``function_call``, ``custom_tool_call`` or
        ``local_shell_call``, PROTOCOLS.md 3.4; openai-python ``response_custom_tool_call_input_*_event.py``)."""
        for call, call_id in zip(calls, call_ids(calls), strict=True):
            item = self._call_item(call, call_id)
            index = len(self._output)
            kind = item["type"]
            field = {"function_call": "arguments", "custom_tool_call": "input"}.get(kind)
            added = {**item, "status": "in_progress", **({field: ""} if field else {})}
            yield self._event("response.output_item.added", output_index=index, item=added)
            if field is not None:
                prefix = "response.function_call_arguments" if kind == "function_call" else \
                    "response.custom_tool_call_input"
                for piece in _slices(item[field]):
                    yield self._event(f"{prefix}.delta", item_id=item["id"], output_index=index, delta=piece)
                done = {"name": item["name"], "arguments": item["arguments"]} if kind == "function_call" else {
                    "input": item["input"]}
                yield self._event(f"{prefix}.done", item_id=item["id"], output_index=index, **done)
            self._output.append(item)
            yield self._event("response.output_item.done", output_index=index, item=item)

    def _call_item(self, call: ToolCall, call_id: str) -> dict[str, Any]:
        """The complete output item for ``call``, with the client's name, namespace and item type."""
        tool = client_tool(self.tool_names.get(call.name), call.name)
        if tool.kind == "local_shell":
            return {"id": f"lsh_{secrets.token_hex(12)}", "type": "local_shell_call", "call_id": call_id,
                    "status": "completed", "action": local_shell_action(call.arguments)}
        if tool.kind == "custom":
            item: dict[str, Any] = {"id": f"ctc_{secrets.token_hex(12)}", "type": "custom_tool_call",
                                    "call_id": call_id, "name": tool.name, "input": custom_input(call.arguments),
                                    "status": "completed"}
        else:
            item = {"id": f"fc_{secrets.token_hex(12)}", "type": "function_call", "call_id": call_id,
                    "name": tool.name, "arguments": call.arguments or "{}", "status": "completed"}
        if tool.namespace:
            item["namespace"] = tool.namespace
        return item

    def _completed(self, usage: dict[str, Any] | None, incomplete: str | None) -> bytes:
        """``response.completed``, or ``response.incomplete`` with its reason (a ``length`` /
        ``content_filter`` finish, openai-python ``response_incomplete_event.py``); the emitter is
        closed afterwards."""
        self._closed = True
        response = self._response("incomplete" if incomplete else "completed", usage=usage_from_openai(usage),
                                  incomplete=incomplete)
        return self._event("response.incomplete" if incomplete else "response.completed", response=response)

    def close_exhausted(self, message: str) -> bytes:
        """A message item holding ``message``, then ``response.completed``."""
        if self._closed:
            return b""
        out = [self.open(), self._complete_item(), self._add_item("message")]
        item = self._open
        assert item is not None
        item.text.append(message)
        out.append(self._event("response.output_text.delta", item_id=item.id, output_index=item.index,
                               content_index=0, delta=message, logprobs=[]))
        out.append(self._complete_item())
        out.append(self._completed(None, None))
        return b"".join(out)

    def close_error(self, error: UpstreamError) -> bytes:
        """``response.failed`` with ``response.error {code, message}`` (PROTOCOLS.md 3.4, 5.3)."""
        if self._closed:
            return b""
        out = [self.open()]
        self._closed = True
        code = failure_code(error)
        response = self._response("failed", error={"code": code, "message": error.message})
        out.append(self._event("response.failed", response=response))
        return b"".join(out)

    def close_terminal(self, message: str) -> bytes:
        """``response.failed`` with ``error.code`` ``invalid_prompt`` and ``message``: Codex retries a
        failed response of any other code up to five times (``stream_max_retries``) and shows
        ``insufficient_quota`` / ``context_length_exceeded`` in words of its own; ``invalid_prompt`` it
        shows as sent, does not retry, and ``codex exec`` exits 1 (measured with Codex CLI, docs/clients.md)."""
        if self._closed:
            return b""
        out = [self.open(), self._complete_item()]
        self._closed = True
        response = self._response("failed", error={"code": "invalid_prompt", "message": message})
        out.append(self._event("response.failed", response=response))
        return b"".join(out)

    # -- non-stream ----------------------------------------------------------------------------

    def complete(self, turn: Turn) -> dict[str, Any]:
        """The Response object for ``turn`` (PROTOCOLS.md 3.4)."""
        choice = _first_choice(turn)
        output: list[dict[str, Any]] = []
        if choice.reasoning:
            output.append({"id": f"rs_{secrets.token_hex(12)}", "type": "reasoning", "status": "completed",
                           "summary": [], "content": [{"type": "reasoning_text", "text": choice.reasoning}]})
        text = (choice.content or "") + (choice.refusal or "")
        if text:
            output.append({"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant",
                           "status": "completed", "content": [{"type": "output_text", "text": text,
                                                               "annotations": []}]})
        for call, call_id in zip(choice.tool_calls, call_ids(choice.tool_calls), strict=True):
            output.append(self._call_item(call, call_id))
        self._output = output
        incomplete = _INCOMPLETE.get(choice.finish_reason or "")
        return self._response("incomplete" if incomplete else "completed", usage=usage_from_openai(turn.usage),
                              incomplete=incomplete)

    def complete_exhausted(self, message: str) -> dict[str, Any]:
        """The Response object whose only item is a message holding ``message``."""
        return self.complete(Turn(choices=[ChoiceTurn(content=message, finish_reason="stop")]))

    def error_body(self, status: int, message: str, *, type: str, param: str | None = None,
                   code: str | None = None) -> dict[str, Any]:
        """OpenAI's error shape (``proxy.guard.protocols.emit_openai.error_body``, PROTOCOLS.md 1.6)."""
        return openai_error_body(status, message, type=type, param=param, code=code)


def call_ids(calls: list[ToolCall]) -> list[str]:
    """The calls' ids, non-empty and unique within the response (``function_call_output`` matches on them)."""
    ids: list[str] = []
    for call in calls:
        base = call.id or f"call_{secrets.token_hex(12)}"
        candidate, k = base, 1
        while candidate in ids:
            k += 1
            candidate = f"{base}_{k}"
        ids.append(candidate)
    return ids


def _first_choice(turn: Turn) -> ChoiceTurn:
    return next((c for c in turn.choices if c.index == 0), ChoiceTurn())


def _slices(text: str) -> Iterator[str]:
    for start in range(0, len(text), ARGUMENT_SLICE):
        yield text[start : start + ARGUMENT_SLICE]


def _maybe_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _maybe_number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None

