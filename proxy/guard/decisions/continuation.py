"""Continuing a cut text stream: whether to, and the request that asks for the rest of exactly the
delivered text. Sans-IO (dicts in, a dict out).

Two upstream families accept a trailing assistant message as the start of the answer to complete:

- ``deepseek-prefix``: DeepSeek's chat prefix completion (beta). The last message has role
  ``assistant`` and ``"prefix": true``; the upstream's base URL must be the beta one,
  ``https://api.deepseek.com/beta`` (which serves ordinary chat completions too). The answer holds the
  completion of the prefix only. Source: DeepSeek API docs, "Chat Prefix Completion (Beta)"
  (https://api-docs.deepseek.com/guides/chat_prefix_completion; read here in its mirror
  https://share.apidog.com/apidoc/docs-site/747793/chat-prefix-completion-beta-835845m0).
- ``continue-final-message``: vLLM's and SGLang's chat completions extra parameters
  ``continue_final_message: true`` with ``add_generation_prompt: false`` (the two cannot be used together):
  the chat template leaves the final assistant message open and the model continues it. Sources: vLLM
  ``vllm/entrypoints/openai/protocol.py`` ``ChatCompletionRequest`` (docs: "OpenAI Compatible Server",
  extra parameters for the Chat API); SGLang ``python/sglang/srt/entrypoints/openai/protocol.py``
  (``continue_final_message`` carried into its ``ChatCompletionRequest``).

The capability is configured per upstream (``Upstream.text_continuation``); nothing is learned.
"""

from __future__ import annotations

import enum
from typing import Any


class Shape(enum.StrEnum):
    """How an upstream takes a prefix to continue ("" = it does not, as far as toolrelay knows)."""

    NONE = ""
    DEEPSEEK_PREFIX = "deepseek-prefix"
    CONTINUE_FINAL_MESSAGE = "continue-final-message"

    @classmethod
    def of(cls, value: str) -> Shape:
        """The shape named ``value``; an unknown name is ``NONE`` (never continue on a guess)."""
        try:
            return cls(value)
        except ValueError:
            return cls.NONE


def continuation_body(body: dict[str, Any], delivered: str, shape: Shape) -> dict[str, Any]:
    """``body`` (a chat.completions request) asking for the continuation of ``delivered``.

    The delivered text goes in a trailing assistant message; a client's own trailing prefix message
    (DeepSeek ``prefix``, or a request already carrying ``continue_final_message``) is extended instead
    of followed by a second one. ``n`` is dropped (a continuation has one choice). Raises ``ValueError``
    for ``Shape.NONE`` or a body without a ``messages`` list.
    """
    if shape is Shape.NONE:
        raise ValueError("this upstream takes no prefix to continue")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ValueError("the request has no messages")
    out = {k: v for k, v in body.items() if k != "n"}
    last = messages[-1] if messages else None
    prefilled = isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), str) \
        and (last.get("prefix") is True or body.get("continue_final_message") is True)
    if prefilled:
        assert isinstance(last, dict)
        head, prefix = messages[:-1], {**last, "content": last["content"] + delivered}
    else:
        head, prefix = list(messages), {"role": "assistant", "content": delivered}
    if shape is Shape.DEEPSEEK_PREFIX:
        prefix["prefix"] = True
    else:
        prefix.pop("prefix", None)
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    out["messages"] = [*head, prefix]
    return out


def may_continue(*, opted_in: bool, shape: Shape, continued: int, limit: int, delivered: int, cap: int) -> bool:
    """True when a cut stream may be continued: the route opted in, the upstream takes a prefix, fewer than
    ``limit`` continuations were made for the request, and 0 < ``delivered`` <= ``cap`` characters."""
    return opted_in and shape is not Shape.NONE and continued < limit and 0 < delivered <= cap
