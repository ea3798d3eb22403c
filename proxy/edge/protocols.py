"""Client protocols as data: one ``ClientProtocol`` per protocol the proxy speaks to its clients.

A protocol turns its client's request into a prepared chat.completions request (``prepare``), picks
the emitter that renders the answer (``emitter``), writes HTTP errors in its protocol
(``error_body``), lists models in its format (``models_listing``) and says what else differs: whether
an upstream's bytes may reach its clients unchanged (``passes_through``), the rate-limit header names
(``anthropic_headers``), the error types of a 404 and a 403. The relay and the consumer ask it and never
compare protocols; the protocol a ``GET /v1/models`` answers in is chosen here too (``listing_protocol``).
The consumer (``proxy.edge.consumers.ProxyConsumer``) is parameterized by one; a fourth protocol needs a
``ClientProtocol`` subclass, a translator and an emitter, and no consumer or relay code.

- ``OPENAI_CHAT``: OpenAI Chat Completions (PROTOCOLS.md 1), identity translation, the client's bytes
  kept for the byte-exact pass-through;
- ``ANTHROPIC_MESSAGES``: Anthropic Messages (PROTOCOLS.md 2; Claude Code);
- ``OPENAI_RESPONSES``: OpenAI Responses (PROTOCOLS.md 3; Codex CLI), OpenAI's error shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from infra.tokenizers import count_prompt
from proxy.guard.checks.request import ChatRequest, RequestInvalid, check_chat_fields, prepare
from proxy.guard.checks.schema_bounds import SchemaBounds
from proxy.guard.protocols.emit import Emitter
from proxy.guard.protocols.emit_anthropic import AnthropicMessagesEmitter
from proxy.guard.protocols.emit_anthropic import error_body as anthropic_error_body
from proxy.guard.protocols.emit_openai import OpenAIChatEmitter
from proxy.guard.protocols.emit_openai import error_body as openai_error_body
from proxy.guard.protocols.emit_responses import OpenAIResponsesEmitter
from proxy.guard.protocols.translate import TranslationError
from proxy.guard.protocols.translate_anthropic import translate_messages
from proxy.guard.protocols.translate_responses import translate_responses

T = TypeVar("T")

#: Characters per token of the admission estimate (the client's bytes, ``proxy.edge.consumers``).
CHARS_PER_TOKEN = 4


def estimate_tokens(chat_body: dict[str, Any], *, load: bool = False) -> int:
    """The prompt tokens of a chat.completions request, counted for its model's tokenizer family
    (``proxy.guard.checks.token_count.count_prompt``: the family's own tokenizer where one is installed,
    exact for DeepSeek V4, Qwen2.5, Qwen3.5/3.6 and cl100k; else an estimate: docs/clients.md,
    "count_tokens"). ``load=True`` may block up to about a second on a family's first count."""
    return count_prompt(chat_body, load=load)


def _bounds() -> SchemaBounds:
    """The tool-schema bounds of the settings (``proxy.relay.schema_pool.schema_bounds``)."""
    from proxy.relay.schema_pool import schema_bounds  # Django settings: read when a request arrives

    return schema_bounds()


def translated(fn: Callable[[dict[str, Any]], T], data: dict[str, Any]) -> T:
    """``fn(data)``, with a malformed request turned into ``RequestInvalid`` naming its ``param``."""
    try:
        return fn(data)
    except TranslationError as exc:
        raise RequestInvalid(exc.message, param=exc.param) from None


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a protocol made of its client's request: the chat request, the client fields it could not
    carry over (``dropped``, as paths) and the upstream -> client tool names it had to change."""

    request: ChatRequest
    dropped: tuple[str, ...] = ()
    tool_names: dict[str, Any] = field(default_factory=dict)


class ClientProtocol:
    """OpenAI Chat Completions; the other protocols override what differs."""

    name = "openai-chat"
    #: The upstreams speak this protocol: a request without ``tools`` may take their bytes unchanged
    #: (``proxy.relay.loop.RelayCall.forwards_raw``); the others are translated frame by frame.
    passes_through = True
    #: Rate-limit headers under Anthropic's names (``anthropic-ratelimit-*``, ``proxy.policy.limits``).
    anthropic_headers = False
    #: Error ``type`` for an unknown model (OpenAI: ``invalid_request_error``, Anthropic: ``not_found_error``).
    not_found_type = "invalid_request_error"
    #: Error ``type`` of a 403 (a model this key may not use): OpenAI ``permission_error``, Anthropic the same.
    forbidden_type = "permission_error"

    def prepare(self, data: dict[str, Any], raw: bytes) -> Prepared:
        """The client's request (``data``, parsed from ``raw``) as a prepared chat request;
        ``RequestInvalid`` for a request the client must fix."""
        check_chat_fields(data)
        return Prepared(prepare(data, raw, _bounds()))

    def emitter(self, data: dict[str, Any], prepared: Prepared) -> Emitter:
        """The emitter for one response to this request."""
        return OpenAIChatEmitter(model=data["model"], include_usage=prepared.request.include_usage)

    def error_body(self, status: int, message: str, *, type: str, param: str | None = None,
                   code: str | None = None) -> dict[str, Any]:
        """OpenAI's error shape ``{"error":{"message","type","param","code"}}`` (PROTOCOLS.md 1.6)."""
        return openai_error_body(status, message, type=type, param=param, code=code)

    def models_listing(self, names: list[str], owner: str) -> dict[str, Any]:
        """``GET /v1/models`` in OpenAI's list format."""
        return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": owner}
                                           for n in names]}


class AnthropicMessagesProtocol(ClientProtocol):
    """Anthropic Messages (``POST /v1/messages``; Claude Code calls ``/v1/messages?beta=true``)."""

    name = "anthropic-messages"
    passes_through = False
    anthropic_headers = True
    not_found_type = "not_found_error"

    def prepare(self, data: dict[str, Any], raw: bytes) -> Prepared:
        t = translated(translate_messages, data)
        return Prepared(prepare(t.body, bounds=_bounds()), t.dropped, t.tool_names)

    def emitter(self, data: dict[str, Any], prepared: Prepared) -> Emitter:
        body = prepared.request.body
        return AnthropicMessagesEmitter(model=body["model"], tool_names=prepared.tool_names,
                                        input_tokens=estimate_tokens(body))

    def error_body(self, status: int, message: str, *, type: str, param: str | None = None,
                   code: str | None = None) -> dict[str, Any]:
        """Anthropic's error shape (PROTOCOLS.md 2.4); ``param`` prefixes the message."""
        return anthropic_error_body(status, message, param=param)

    def models_listing(self, names: list[str], owner: str) -> dict[str, Any]:
        """``GET /v1/models`` in Anthropic's format (Claude Code's gateway model discovery, PROTOCOLS.md 4.1)."""
        return {"data": [{"type": "model", "id": n, "display_name": n, "created_at": "1970-01-01T00:00:00Z"}
                         for n in names],
                "has_more": False, "first_id": names[0] if names else None, "last_id": names[-1] if names else None}


class OpenAIResponsesProtocol(ClientProtocol):
    """OpenAI Responses (``POST /v1/responses``; Codex CLI). Errors in OpenAI's shape (1.6)."""

    name = "openai-responses"
    passes_through = False

    def prepare(self, data: dict[str, Any], raw: bytes) -> Prepared:
        t = translated(translate_responses, data)
        return Prepared(prepare(t.body, bounds=_bounds()), t.dropped, t.tool_names)

    def emitter(self, data: dict[str, Any], prepared: Prepared) -> Emitter:
        return OpenAIResponsesEmitter(model=prepared.request.body["model"], request=data,
                                      tool_names=prepared.tool_names)


OPENAI_CHAT = ClientProtocol()
ANTHROPIC_MESSAGES = AnthropicMessagesProtocol()
OPENAI_RESPONSES = OpenAIResponsesProtocol()


def listing_protocol(anthropic_version: str) -> ClientProtocol:
    """The protocol of a ``GET /v1/models`` answer: Anthropic's for a request carrying ``anthropic-version``
    (its value; Claude Code's gateway model discovery, PROTOCOLS.md 4.1), else OpenAI's."""
    return ANTHROPIC_MESSAGES if anthropic_version else OPENAI_CHAT
