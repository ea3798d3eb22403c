"""OpenAI Chat Completions emitter: canonical ``chat.completion.chunk`` SSE and non-stream bodies.

Canonical means (PROTOCOLS.md section 0 items 1, 5-9, 12; 1.3-1.6; 5.3):

- ``data: `` + one compact, ASCII-only JSON document + a blank line; no ``event:`` lines, no
  ``id:`` fields; keep-alives are SSE comments.
- One completion id and the same ``object`` / ``created`` / ``model`` on every chunk.
- ``role: "assistant"`` exactly once per choice, in that choice's first chunk (openai-python's
  accumulator concatenates a repeated role into ``"assistantassistant"``, 1.7). A choice that
  starts with content gets OpenAI's own opener ``{"role":"assistant","content":""}``.
- Tool calls go out at close: a header delta ``{"index","id","type","function":{"name",
  "arguments":""}}`` then argument deltas ``{"index","function":{"arguments"}}``; index contiguous
  from 0 per choice; never a parseable placeholder before the real arguments (1.3, old vercel/ai).
- A separate finish chunk per choice with ``delta: {}``; with ``include_usage`` a final
  ``choices: []`` usage chunk (other chunks carry ``"usage":null``, 1.4); then ``data: [DONE]``
  and nothing after (1.5).

Decisions:

- Usage: when the client asked for it and the turn has none, the usage chunk carries zeros, so a
  client that waits for the usage chunk (1.4) always gets a well-formed one.
- ``close_error`` ends with the error event and no ``[DONE]``: openai-python raises ``APIError``
  on the error event (1.6), and a lenient client that ignores the ``error`` object then sees an
  unterminated stream rather than a clean, empty success (the C41 failure mode).
- Anything asked after a close returns ``b""``: nothing may follow the terminator.

Emission is cheap: the constant envelope around ``choices`` is built once per stream, and per-choice
text prefixes once per choice and channel; a text delta costs one string escape and a concatenation.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii  # the C escaper json.dumps itself uses for str
from typing import Any

from proxy.guard.events import Channel
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn, UpstreamError

#: Delta key per text channel; ``reasoning_content`` is DeepSeek's extension (PROTOCOLS.md 1.3).
_CHANNEL_KEYS: dict[str, str] = {"content": "content", "reasoning": "reasoning_content", "refusal": "refusal"}
#: Argument text is sent in slices of at most this many characters (one delta each).
ARGUMENT_SLICE = 4096
#: Standard tool-call keys that a provider's ``extra`` fields may not shadow.
_CALL_KEYS = frozenset({"index", "id", "type", "function"})
_DONE = b"data: [DONE]\n\n"
_KEEPALIVE = b": keepalive\n\n"
_ZERO_USAGE: dict[str, int] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def _dumps(obj: Any) -> str:
    """Compact, ASCII-only JSON (PROTOCOLS.md 5.3)."""
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"))


class OpenAIChatEmitter:
    """Renders one OpenAI Chat response (the ``Emitter`` protocol of ``proxy.guard.protocols.emit``).

    ``model`` is the model name the client sees; ``include_usage`` is the client's
    ``stream_options.include_usage``; ``completion_id`` defaults to ``chatcmpl-`` + 24 random hex
    digits, ``created`` to now (unix seconds); ``system_fingerprint`` is sent only when given.
    Stateful per response; no I/O: every method returns the bytes to send.
    """

    protocol = "openai-chat"
    overflow_in_stream = False

    def __init__(self, *, model: str, include_usage: bool, completion_id: str | None = None,
                 created: int | None = None, system_fingerprint: str | None = None) -> None:
        self.model = model
        self.include_usage = include_usage
        self.completion_id = completion_id or f"chatcmpl-{secrets.token_hex(12)}"
        self.created = int(time.time()) if created is None else created
        self.system_fingerprint = system_fingerprint
        self._head = "data: " + self._envelope()[:-1] + ',"choices":'
        self._tail = ',"usage":null}\n\n' if include_usage else "}\n\n"
        self._text_heads: dict[tuple[int, str], str] = {}
        self._opened: set[int] = set()  # choices whose role went out
        self._closed = False

    def _envelope(self) -> str:
        """The constant chunk fields as a JSON object text (``choices`` and ``usage`` excluded)."""
        fields: dict[str, Any] = {"id": self.completion_id, "object": "chat.completion.chunk",
                                  "created": self.created, "model": self.model}
        if self.system_fingerprint is not None:
            fields["system_fingerprint"] = self.system_fingerprint
        return _dumps(fields)

    def _chunk(self, choices_json: str) -> str:
        """One SSE event around a ``choices`` array text."""
        return self._head + choices_json + self._tail

    def _choice(self, index: int, delta: dict[str, Any], finish: str | None = None) -> str:
        """One chunk with one choice (general path: role, tool calls, finish)."""
        choice: dict[str, Any] = {"index": index, "delta": delta}
        if finish is not None:
            choice["finish_reason"] = finish
        return self._chunk("[" + _dumps(choice) + "]")

    def _opening(self, index: int, delta: dict[str, Any]) -> str:
        """The chunk carrying ``delta`` for choice ``index``, with ``role`` if the choice opens here.

        Choices open in index order: openai-python builds its snapshot from the first chunk by
        position (``choices[choice.index] = …`` in ``_convert_initial_chunk_into_snapshot``, and
        ``append`` for later choices), so choice k must never open before choice k-1. Lower
        choices not yet opened get a role-only chunk first.
        """
        if index in self._opened:
            return self._choice(index, delta)
        fill = "".join(self._choice(j, {"role": "assistant"}) for j in range(index) if j not in self._opened)
        self._opened.update(range(index + 1))
        return fill + self._choice(index, {"role": "assistant", **delta})

    # -- streaming -----------------------------------------------------------------------------

    def open(self) -> bytes:
        """Nothing: the role goes out with each choice's first delta."""
        return b""

    def early_usage(self, usage: dict[str, Any]) -> None:
        """Nothing: this protocol says usage only at the end."""

    def text(self, choice: int, channel: Channel, text: str) -> bytes:
        """One text / reasoning / refusal delta (``""`` sends nothing)."""
        if self._closed or not text:
            return b""
        opener = ""
        if choice not in self._opened:
            if channel != "content":  # role rides on the first reasoning / refusal delta itself
                return self._opening(choice, {_CHANNEL_KEYS[channel]: text}).encode()
            opener = self._opening(choice, {"content": ""})
        return (opener + self._text_head(choice, channel) + encode_basestring_ascii(text) + "}}]"
                + self._tail).encode()

    def _text_head(self, choice: int, channel: str) -> str:
        """The cached bytes of a text chunk up to the escaped text."""
        key = (choice, channel)
        head = self._text_heads.get(key)
        if head is None:
            head = f'{self._head}[{{"index":{choice},"delta":{{"{_CHANNEL_KEYS[channel]}":'
            self._text_heads[key] = head
        return head

    def keepalive(self) -> bytes:
        """An SSE comment (PROTOCOLS.md 0.6; C40: comments, never ``data:``)."""
        return b"" if self._closed else _KEEPALIVE

    def close(self, turn: Turn) -> bytes:
        """Tool calls, a finish chunk per choice, the usage chunk (when asked), ``[DONE]``."""
        if self._closed:
            return b""
        parts: list[str] = []
        for choice in self._final_choices(turn):
            parts.extend(self._tool_call_chunks(choice))
            parts.append(self._finish_chunk(choice.index, _finish_reason(choice)))
        return self._terminate(parts, turn.usage)

    def _final_choices(self, turn: Turn) -> list[ChoiceTurn]:
        """The turn's choices plus choice 0 and any choice opened by ``text()`` that the turn lacks."""
        choices = {c.index: c for c in turn.choices}
        for index in sorted({0, *self._opened}):
            choices.setdefault(index, ChoiceTurn(index=index))
        return [choices[i] for i in sorted(choices)]

    def _tool_call_chunks(self, choice: ChoiceTurn) -> Iterator[str]:
        """Header then argument deltas for each call of ``choice`` (index = position)."""
        for k, call in enumerate(choice.tool_calls):
            yield self._opening(choice.index, {"tool_calls": [_header(k, call)]})
            for piece in _slices(call.arguments or "{}"):
                args = {"index": k, "function": {"arguments": piece}}
                yield self._choice(choice.index, {"tool_calls": [args]})

    def _finish_chunk(self, index: int, reason: str) -> str:
        """The finish chunk; a choice that never said anything gets its role opener first."""
        opener = "" if index in self._opened else self._opening(index, {"content": ""})
        return opener + self._choice(index, {}, reason)

    def _terminate(self, parts: list[str], usage: dict[str, Any] | None) -> bytes:
        """``parts``, the usage chunk when asked, ``[DONE]``; the emitter is closed afterwards."""
        self._closed = True
        if self.include_usage:
            parts.append(self._head + '[],"usage":' + _dumps(_usage(usage)) + "}\n\n")
        return "".join(parts).encode() + _DONE

    def close_exhausted(self, message: str) -> bytes:
        """``message`` as assistant content of every open choice (at least 0), finish ``stop``."""
        if self._closed:
            return b""
        parts: list[str] = []
        for index in sorted({0, *self._opened}):
            parts.append(self.text(index, "content", message).decode())
            parts.append(self._finish_chunk(index, "stop"))
        return self._terminate(parts, None)

    def close_error(self, error: UpstreamError) -> bytes:
        """The OpenAI in-stream error event (PROTOCOLS.md 1.6), ending the stream without ``[DONE]``."""
        if self._closed:
            return b""
        self._closed = True
        body = self.error_body(error.status, error.message, type=error.type, code=error.code)
        return f"data: {_dumps(body)}\n\n".encode()

    def close_terminal(self, message: str) -> bytes:
        """The in-stream error chunk ``{"error": {..., "code": "upstream_failed"}}``: openai-python and
        openai-node raise ``APIError`` on it (their ``Stream`` checks ``data.error``), the AI SDK's
        openai-compatible provider ends with an error part; OpenCode and Qwen Code show it, do not
        retry it and exit 1 headless (measured, docs/clients.md)."""
        return self.close_error(UpstreamError(502, message, "upstream_error", code="upstream_failed",
                                              retryable=False))

    # -- non-stream ----------------------------------------------------------------------------

    def complete(self, turn: Turn) -> dict[str, Any]:
        """The ``chat.completion`` object for ``turn`` (PROTOCOLS.md 1.2); zero usage when unknown."""
        choices = turn.choices or [ChoiceTurn()]
        body: dict[str, Any] = {
            "id": self.completion_id, "object": "chat.completion", "created": self.created,
            "model": self.model, "choices": [_complete_choice(c) for c in choices],
            "usage": _usage(turn.usage),
        }
        if self.system_fingerprint is not None:
            body["system_fingerprint"] = self.system_fingerprint
        return body

    def complete_exhausted(self, message: str) -> dict[str, Any]:
        """The ``chat.completion`` object whose assistant content is ``message`` (finish ``stop``)."""
        return self.complete(Turn(choices=[ChoiceTurn(content=message, finish_reason="stop")]))

    def error_body(self, status: int, message: str, *, type: str, param: str | None = None,
                   code: str | None = None) -> dict[str, Any]:
        """OpenAI's error shape (``error_body``)."""
        return error_body(status, message, type=type, param=param, code=code)


def error_body(status: int, message: str, *, type: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape ``{"error":{"message","type","param","code"}}`` (PROTOCOLS.md 1.6), the one
    builder of it: OpenAI Chat and Responses clients, HTTP errors and in-stream error events alike.

    ``status`` is the HTTP status sent with it; OpenAI bodies do not repeat it.
    """
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _header(k: int, call: ToolCall) -> dict[str, Any]:
    """A call's first delta; provider ``extra`` fields ride along without shadowing the standard ones."""
    header: dict[str, Any] = {"index": k, "id": call.id, "type": "function",
                              "function": {"name": call.name, "arguments": ""}}
    header.update((key, value) for key, value in call.extra.items() if key not in _CALL_KEYS)
    return header


def _slices(text: str) -> Iterator[str]:
    """``text`` in ``ARGUMENT_SLICE``-character pieces (one piece when short)."""
    for start in range(0, len(text), ARGUMENT_SLICE):
        yield text[start : start + ARGUMENT_SLICE]


def _finish_reason(choice: ChoiceTurn) -> str:
    """The choice's finish reason, defaulting by content (never null at the end, 1.3)."""
    return choice.finish_reason or ("tool_calls" if choice.tool_calls else "stop")


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    """The usage object with the three required counts present (zeros when unknown)."""
    if not isinstance(usage, dict):
        return dict(_ZERO_USAGE)
    out = dict(usage)
    for key in ("prompt_tokens", "completion_tokens"):
        out[key] = out[key] if isinstance(out.get(key), int) else 0
    if not isinstance(out.get("total_tokens"), int):
        out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    return out


def _complete_choice(choice: ChoiceTurn) -> dict[str, Any]:
    """One non-stream choice with its message."""
    message: dict[str, Any] = {"role": "assistant", "content": choice.content, "refusal": choice.refusal,
                               "annotations": []}
    if choice.reasoning is not None:
        message["reasoning_content"] = choice.reasoning
    if choice.tool_calls:
        message["tool_calls"] = [_complete_call(c) for c in choice.tool_calls]
    return {"index": choice.index, "message": message, "logprobs": None,
            "finish_reason": _finish_reason(choice)}


def _complete_call(call: ToolCall) -> dict[str, Any]:
    """One non-stream tool call (provider ``extra`` kept)."""
    body: dict[str, Any] = {"id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments or "{}"}}
    body.update((key, value) for key, value in call.extra.items() if key not in _CALL_KEYS)
    return body
