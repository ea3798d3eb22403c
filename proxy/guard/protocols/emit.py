"""The emitter interface: the relay hands deltas and turns to an emitter chosen by the consumer.

The relay stays protocol-agnostic: OpenAI Chat (``emit_openai``), Anthropic Messages and OpenAI
Responses emitters implement this protocol. Emitters are stateful per response (ids, block indexes,
what was opened) but do no I/O: they return the bytes to send.
"""

from __future__ import annotations

from typing import Any, Protocol

from proxy.guard.events import Channel
from proxy.guard.turn import Turn, UpstreamError


class Emitter(Protocol):
    """Renders one client response. Streaming calls happen in this order:

    ``open()`` once at commit, then any number of ``text()`` / ``keepalive()``, then exactly one
    of ``close(turn)``, ``close_exhausted(message)`` or ``close_error(error)``. ``close(turn)``
    renders everything but text (tool calls, finish, usage if asked, terminator): all text goes
    through ``text()``. Non-stream responses use ``complete(turn)`` only.
    """

    protocol: str  # "openai-chat" | "anthropic-messages" | "openai-responses"
    #: A context-window refusal goes out as the stream's error, not an HTTP 400 (Responses: Codex reads it
    #: only from ``response.failed``; ``proxy.guard.decisions.answer.answer_for``).
    overflow_in_stream: bool

    def open(self) -> bytes:
        """Bytes to send right after the response headers (may be empty)."""
        ...

    def early_usage(self, usage: dict[str, Any]) -> None:
        """The upstream's usage seen before the stream opened (vLLM's ``continuous_usage_stats`` sends it
        on the first chunk): Anthropic's ``message_start`` carries its prompt counts; others ignore it."""
        ...

    def text(self, choice: int, channel: Channel, text: str) -> bytes:
        """Bytes for a text / reasoning / refusal delta."""
        ...

    def keepalive(self) -> bytes:
        """A keep-alive the client's parser ignores (OpenAI: an SSE comment; Anthropic: ``ping``)."""
        ...

    def close(self, turn: Turn) -> bytes:
        """Tool calls, finish reason, usage (when asked) and the terminator."""
        ...

    def close_exhausted(self, message: str) -> bytes:
        """A terminal assistant message (``message`` as text) with a normal stop, then the terminator."""
        ...

    def close_error(self, error: UpstreamError) -> bytes:
        """The protocol's in-stream error, ending the stream."""
        ...

    def close_terminal(self, message: str) -> bytes:
        """The protocol's in-stream error that agents show and never retry, carrying ``message``: a
        headless run ends with a failure status (docs/clients.md, "How a turn ends")."""
        ...

    def complete(self, turn: Turn) -> dict[str, Any]:
        """The non-stream response object for ``turn`` (text included)."""
        ...

    def complete_exhausted(self, message: str) -> dict[str, Any]:
        """The non-stream response object for the exhaustion answer."""
        ...

    def error_body(self, status: int, message: str, *, type: str, param: str | None = None,
                   code: str | None = None) -> dict[str, Any]:
        """The HTTP error body in the client's protocol."""
        ...
