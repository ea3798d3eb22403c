"""Consumers for the coding agents' own protocols (STYLE.md rule 3: thin adapters).

- ``POST /v1/messages`` (Anthropic Messages; Claude Code calls ``/v1/messages?beta=true``, the router
  ignores the query, PROTOCOLS.md section 0 item 14) and ``POST /v1/messages/count_tokens``;
- ``POST /v1/responses`` (OpenAI Responses; Codex CLI, section 0 items 3-4).

Each consumer authenticates (``x-api-key`` or ``Authorization: Bearer``, the base does it),
translates the request to chat.completions (``proxy.guard.translate_*``), picks its protocol's
emitter and hands over to the same relay as the chat path: same guard, policy, commit rule,
disconnect handling and audit, with the client protocol recorded. ``anthropic-version`` and
``anthropic-beta`` are accepted and not needed. Errors go out in each protocol's shape. Fields
the translation could not carry over are logged with the request id.
"""

from __future__ import annotations

import abc
import json
import logging
import math
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from proxy.consumers import ProxyConsumer, RequestError, check_tool_declarations, header, parse_json_object
from proxy.guard.emit import Emitter
from proxy.guard.emit_anthropic import AnthropicMessagesEmitter
from proxy.guard.emit_anthropic import error_body as anthropic_error_body
from proxy.guard.emit_responses import OpenAIResponsesEmitter
from proxy.guard.translate import Translation, TranslationError
from proxy.guard.translate_anthropic import count_tokens_body, translate_messages
from proxy.guard.translate_responses import translate_responses
from proxy.relay import Relay, RelayRequest
from proxy.upstream import get_client

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Characters per token for the local estimate (a common rule of thumb for English and code).
CHARS_PER_TOKEN = 4


def estimate_tokens(chat_body: dict[str, Any]) -> int:
    """A rough token count of a chat.completions request: ~4 characters per token of its JSON."""
    text = json.dumps({k: chat_body.get(k) for k in ("messages", "tools")}, ensure_ascii=False)
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def translate(fn: Callable[[dict[str, Any]], T], data: dict[str, Any]) -> T:
    """``fn(data)``, with a malformed request turned into a 400 ``RequestError`` naming its ``param``."""
    try:
        return fn(data)
    except TranslationError as exc:
        raise RequestError(400, exc.message, param=exc.param) from None


class _AgentConsumer(ProxyConsumer, abc.ABC):
    """Shared flow: authenticate, parse, translate, route, relay."""

    translator: Callable[[dict[str, Any]], Translation]

    async def handle(self, body: bytes) -> None:
        snapshot = await self.authenticate()
        data = parse_json_object(body)
        translation = translate(type(self).translator, data)
        check_tool_declarations(translation.body)
        model = translation.body["model"]
        plan = snapshot.resolve(model)
        if plan is None:
            raise RequestError(404, f"the model `{model}` does not exist or is not routed for this key",
                               param="model", code="model_not_found", type="not_found_error")
        request = RelayRequest(snapshot=snapshot, plan=plan, body=translation.body, protocol=self.protocol,
                               user_agent=header(self.scope, b"user-agent"),
                               emitter=self.emitter(data, translation))
        self.request_id = request.id
        if translation.dropped:
            logger.info("request %s (%s, tenant %s): not forwarded: %s", request.id, self.protocol,
                        snapshot.slug, ", ".join(translation.dropped))
        await Relay(request, self.responder, get_client()).run()

    @abc.abstractmethod
    def emitter(self, data: dict[str, Any], translation: Translation) -> Emitter:
        """The emitter for this protocol."""


class MessagesConsumer(_AgentConsumer):
    """``POST /v1/messages`` (Anthropic Messages, stream and non-stream; PROTOCOLS.md 2)."""

    protocol = "anthropic-messages"
    translator = staticmethod(translate_messages)

    def emitter(self, data: dict[str, Any], translation: Translation) -> Emitter:
        return AnthropicMessagesEmitter(model=translation.body["model"], tool_names=translation.tool_names,
                                        input_tokens=estimate_tokens(translation.body))

    def error_body(self, status: int, message: str, *, type: str, param: str | None = None,
                   code: str | None = None) -> dict[str, Any]:
        """Anthropic's error shape (PROTOCOLS.md 2.4)."""
        return anthropic_error_body(status, message, param=param)


class CountTokensConsumer(ProxyConsumer):
    """``POST /v1/messages/count_tokens`` -> ``{"input_tokens": N}``, a local estimate (PROTOCOLS.md 2.5:
    optional for Claude Code, which estimates locally when it is absent)."""

    protocol = "anthropic-messages"

    async def handle(self, body: bytes) -> None:
        await self.authenticate()  # a valid key is all this endpoint needs
        chat = translate(count_tokens_body, parse_json_object(body))
        await self.responder.start(200, [(b"content-type", b"application/json"),
                                         (b"x-request-id", str(uuid.uuid4()).encode())])
        await self.responder.send(json.dumps({"input_tokens": estimate_tokens(chat)}).encode(), more=False)

    def error_body(self, status: int, message: str, *, type: str, param: str | None = None,
                   code: str | None = None) -> dict[str, Any]:
        """Anthropic's error shape (PROTOCOLS.md 2.4)."""
        return anthropic_error_body(status, message, param=param)


class ResponsesConsumer(_AgentConsumer):
    """``POST /v1/responses`` (OpenAI Responses, stream and non-stream; PROTOCOLS.md 3). Errors keep
    the base's OpenAI shape (1.6)."""

    protocol = "openai-responses"
    translator = staticmethod(translate_responses)

    def emitter(self, data: dict[str, Any], translation: Translation) -> Emitter:
        return OpenAIResponsesEmitter(model=translation.body["model"], request=data,
                                      tool_names=translation.tool_names)


__all__ = ["CountTokensConsumer", "MessagesConsumer", "ResponsesConsumer", "estimate_tokens"]
