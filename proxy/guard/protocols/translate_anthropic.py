"""Anthropic Messages request -> chat.completions request (PROTOCOLS.md 2.1, 2.6, 2.8, 4.3).

``translate_messages(body)`` returns a ``Translation``: the chat body, the client fields that were
not carried over, and the map from shortened upstream tool names back to the client's names.
Malformed input raises ``TranslationError`` (with ``param``); nothing else is raised for any JSON
object.

Mapping (PROTOCOLS.md 2.6, after claude-code-router's ``anthropic.transformer.ts`` and LiteLLM's
``experimental_pass_through/adapters``):

- ``system`` (string or text blocks) -> the first message, role ``system``, texts joined by a blank
  line; Claude Code's first block ``x-anthropic-billing-header: …`` (an attribution line, 4.3) is
  dropped.
- ``messages[].role: "system"`` (Claude Code's mid-conversation system blocks, section 0 item 13)
  -> a system message at the same position.
- user blocks (``proxy.guard.protocols.anthropic_content``): ``text`` -> text; ``image`` -> ``image_url``
  (base64 as a data URL, or the URL); ``document`` -> text (text and content sources) or an OpenAI
  ``file`` part (base64 PDF); blocks a chat upstream cannot be given (Files API sources, URL
  documents) -> 400 naming the block; any other block -> its JSON as text. Each ``tool_result`` ->
  one ``tool`` message whose content is one string (text joined, other blocks as JSON, images and
  PDFs carried in a user message after the tool messages), emitted before the rest of that user
  message (CCR does exactly this). Text-only content is sent as one string (some chat upstreams
  accept only strings).
- assistant blocks: ``text`` -> ``content``; ``tool_use`` -> ``tool_calls`` (arguments =
  ``json.dumps(input)``); ``thinking`` -> ``reasoning_content`` whatever its signature (DeepSeek
  thinking mode requires it back on tool-call turns, 2.8; Claude Code echoes thinking blocks
  verbatim with the signature the emitter gave them, 4.3); ``redacted_thinking`` and server-tool
  blocks are dropped and reported.
- the history is then made valid around tool calls (``proxy.guard.protocols.tool_history``): consecutive
  assistant messages merged (as the Anthropic API merges consecutive turns), exactly one ``tool``
  message per ``tool_use_id`` right after its assistant message (system messages in between moved
  after them, missing results answered, stray results sent as user text; each repair reported).
- ``tools``: custom tools (``type`` absent or ``"custom"``) -> function tools with
  ``parameters = input_schema``; server tools (any other ``type``) are dropped and reported;
  ``defer_loading`` tools are dropped and reported unless a ``tool_reference`` in the history
  loaded them; names that are not valid OpenAI names (> 64 characters) are shortened and mapped back.
- ``tool_choice`` auto / any / tool / none -> ``"auto"`` / ``"required"`` / the named function /
  ``"none"`` (a name that is no declared function tool -> 400; no tool left -> reported);
  ``disable_parallel_tool_use: true`` -> ``parallel_tool_calls: false``.
- ``max_tokens``, ``temperature``, ``top_p`` as is; ``stop_sequences`` -> ``stop`` (at most 4);
  ``stream`` -> ``stream`` + ``stream_options.include_usage``.
- ``thinking: {"type":"enabled","budget_tokens":N}`` -> ``reasoning_effort`` (low / medium / high
  by budget, or ``output_config.effort`` when given). ``adaptive`` (which Claude Code sends even for
  non-Claude model names, 4.3) and ``disabled`` leave the upstream's default: an explicit
  ``reasoning_effort`` is refused by some non-reasoning upstreams.
- ``output_config.format`` (structured output, JSON schema) -> ``response_format``.
- Transport and caching hints (``metadata``, ``cache_control``, ``context_management``,
  ``container``, ``service_tier``, ``inference_geo``) are ignored silently; every other field not
  listed here is dropped and reported.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.guard.protocols.anthropic_content import tool_result_text, user_parts
from proxy.guard.protocols.tool_history import pair_tool_messages
from proxy.guard.protocols.translate import (
    Translation,
    TranslationError,
    optional_bool,
    optional_int,
    optional_number,
    require_dict,
    require_list,
    require_str,
    stream_fields,
    text_of_parts,
    upstream_tool_name,
)

#: Claude Code's attribution line, the first system block (PROTOCOLS.md 2.6, 4.3).
BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
#: Fields with no chat.completions meaning that are ignored without a report (PROTOCOLS.md 2.6 "drop").
_IGNORED = frozenset({"metadata", "cache_control", "context_management", "container", "service_tier",
                      "inference_geo"})
#: Fields this module translates.
_HANDLED = frozenset({"model", "max_tokens", "messages", "system", "tools", "tool_choice", "stream",
                      "stop_sequences", "temperature", "top_p", "thinking", "output_config"})
#: OpenAI accepts at most 4 stop sequences (PROTOCOLS.md 1.1).
_MAX_STOP = 4
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high", "xhigh": "high", "minimal": "low"}


def translate_messages(body: dict[str, Any]) -> Translation:
    """Translate an Anthropic Messages request body (``POST /v1/messages``) to chat.completions."""
    body = require_dict(body, "body")
    out = _Translator()
    chat: dict[str, Any] = {"model": require_str(body.get("model"), "model")}
    chat["messages"] = out.messages(body)
    chat.update(out.tools(body))
    chat.update(_sampling(body, out.dropped))
    chat.update(_reasoning(body))
    chat.update(_response_format(body))
    if optional_bool(body, "stream"):
        chat.update(stream_fields(True))
    for key in body:
        if key not in _HANDLED and key not in _IGNORED:
            out.dropped.append(key)
    return Translation(body=chat, dropped=tuple(out.dropped), tool_names=out.tool_names)


def count_tokens_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat body of a ``count_tokens`` request (PROTOCOLS.md 2.5: no ``max_tokens``)."""
    body = require_dict(body, "body")
    return translate_messages({**body, "max_tokens": 1, "stream": False}).body


def _sampling(body: dict[str, Any], dropped: list[str]) -> dict[str, Any]:
    """``max_tokens``, ``stop``, ``temperature`` and ``top_p``."""
    out: dict[str, Any] = {}
    max_tokens = optional_int(body, "max_tokens")
    if max_tokens is None:
        raise TranslationError("`max_tokens` is required", param="max_tokens")
    out["max_tokens"] = max_tokens
    stops = body.get("stop_sequences")
    if stops is not None:
        stops = [require_str(s, f"stop_sequences[{i}]") for i, s in enumerate(require_list(stops, "stop_sequences"))]
        if len(stops) > _MAX_STOP:
            dropped.append(f"stop_sequences[{_MAX_STOP}:]")
        if stops:
            out["stop"] = stops[:_MAX_STOP]
    for key in ("temperature", "top_p"):
        value = optional_number(body, key)
        if value is not None:
            out[key] = value
    return out


def _reasoning(body: dict[str, Any]) -> dict[str, Any]:
    """``reasoning_effort`` for explicitly enabled thinking (see the module docstring)."""
    thinking = body.get("thinking")
    if thinking is None:
        return {}
    thinking = require_dict(thinking, "thinking")
    kind = thinking.get("type")
    if kind not in ("enabled", "adaptive", "disabled"):
        raise TranslationError("`thinking.type` must be enabled, adaptive or disabled", param="thinking.type")
    if kind != "enabled":
        return {}
    config = body.get("output_config")
    effort = _EFFORTS.get(str(config.get("effort"))) if isinstance(config, dict) else None
    if effort is None:
        budget = thinking.get("budget_tokens")
        budget = budget if isinstance(budget, int) and not isinstance(budget, bool) else 8192
        effort = "low" if budget <= 2048 else "medium" if budget <= 8192 else "high"
    return {"reasoning_effort": effort}


def _response_format(body: dict[str, Any]) -> dict[str, Any]:
    """``output_config.format`` ``{"type":"json_schema","schema":…}`` -> ``response_format``."""
    config = body.get("output_config")
    if not isinstance(config, dict) or not isinstance(config.get("format"), dict):
        return {}
    fmt = config["format"]
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise TranslationError("`output_config.format` must be {\"type\":\"json_schema\",\"schema\":{…}}",
                               param="output_config.format")
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}}


class _Translator:
    """Messages and tools; collects dropped fields and renamed tools on the way."""

    def __init__(self) -> None:
        self.dropped: list[str] = []
        self.tool_names: dict[str, str] = {}

    def name(self, client_name: str) -> str:
        """The upstream name for ``client_name``, remembering any change."""
        upstream = upstream_tool_name(client_name)
        if upstream != client_name:
            self.tool_names[upstream] = client_name
        return upstream

    # -- messages ------------------------------------------------------------------------------

    def messages(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """``system`` then every message, in order."""
        out: list[dict[str, Any]] = []
        system = _system_text(body.get("system"))
        if system:
            out.append({"role": "system", "content": system})
        messages = require_list(body.get("messages"), "messages")
        if not messages:
            raise TranslationError("`messages` must not be empty", param="messages")
        for i, message in enumerate(messages):
            out.extend(self.message(require_dict(message, f"messages[{i}]"), f"messages[{i}]"))
        paired, notes = pair_tool_messages(out)
        self.dropped.extend(notes)
        return paired

    def message(self, message: dict[str, Any], param: str) -> list[dict[str, Any]]:
        """One Anthropic message as one or more chat messages."""
        role = message.get("role")
        content = message.get("content")
        if not isinstance(content, str | list):
            raise TranslationError(f"`{param}.content` must be a string or an array of blocks",
                                   param=f"{param}.content")
        if role == "system":
            text = content if isinstance(content, str) else text_of_parts(content, f"{param}.content", kinds=("text",))
            return [{"role": "system", "content": text}]
        if role == "user":
            return [{"role": "user", "content": content}] if isinstance(content, str) else self.user(content, param)
        if role == "assistant":
            return [{"role": "assistant", "content": content}] if isinstance(content, str) else [
                self.assistant(content, param)]
        raise TranslationError(f"`{param}.role` must be user, assistant or system", param=f"{param}.role")

    def user(self, blocks: list[Any], param: str) -> list[dict[str, Any]]:
        """Tool results first (one ``tool`` message each), then what they could not hold (images,
        PDFs) and the user's own content, as one user message (``proxy.guard.protocols.anthropic_content``)."""
        out: list[dict[str, Any]] = []
        attachments: list[dict[str, Any]] = []
        parts: list[dict[str, Any]] = []
        for i, block in enumerate(blocks):
            where = f"{param}.content[{i}]"
            block = require_dict(block, where)
            if block.get("type") == "tool_result":
                out.append(self.tool_result(block, where, attachments))
            else:
                parts.extend(user_parts(block, where))
        parts = attachments + parts
        if parts:
            out.append({"role": "user", "content": _user_content(parts)})
        elif not out:
            out.append({"role": "user", "content": ""})
        return out

    def tool_result(self, block: dict[str, Any], where: str, attachments: list[dict[str, Any]]) -> dict[str, Any]:
        """A ``tool_result`` block as a ``tool`` message whose content is one string."""
        call_id = require_str(block.get("tool_use_id"), f"{where}.tool_use_id")
        text = tool_result_text(block.get("content"), f"{where}.content", call_id, attachments)
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    def assistant(self, blocks: list[Any], param: str) -> dict[str, Any]:
        """Text, tool calls and reasoning of one assistant message."""
        texts: list[str] = []
        thinking: list[str] = []
        calls: list[dict[str, Any]] = []
        for i, block in enumerate(blocks):
            where = f"{param}.content[{i}]"
            block = require_dict(block, where)
            kind = block.get("type")
            if kind == "text":
                texts.append(require_str(block.get("text"), f"{where}.text", allow_empty=True))
            elif kind == "tool_use":
                calls.append(self.tool_use(block, where))
            elif kind == "thinking":
                thinking.append(require_str(block.get("thinking"), f"{where}.thinking", allow_empty=True))
            else:
                self.dropped.append(f"{where} ({kind})")
        message: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts) if texts else None}
        if calls:
            message["tool_calls"] = calls
        elif message["content"] is None:
            message["content"] = ""
        if any(thinking):
            message["reasoning_content"] = "".join(thinking)
        return message

    def tool_use(self, block: dict[str, Any], where: str) -> dict[str, Any]:
        """A ``tool_use`` block as a chat tool call."""
        call_id = require_str(block.get("id"), f"{where}.id")
        name = require_str(block.get("name"), f"{where}.name")
        arguments = block.get("input", {})
        if not isinstance(arguments, dict):
            raise TranslationError(f"`{where}.input` must be an object", param=f"{where}.input")
        return {"id": call_id, "type": "function",
                "function": {"name": self.name(name), "arguments": json.dumps(arguments, ensure_ascii=False)}}

    # -- tools ---------------------------------------------------------------------------------

    def tools(self, body: dict[str, Any]) -> dict[str, Any]:
        """``tools``, ``tool_choice`` and ``parallel_tool_calls`` (omitted when no tool is left)."""
        tools: list[dict[str, Any]] = []
        loaded = _referenced_tools(body.get("messages"))
        for i, tool in enumerate(require_list(body.get("tools") or [], "tools")):
            function = self.tool(require_dict(tool, f"tools[{i}]"), f"tools[{i}]", loaded)
            if function is not None:
                tools.append(function)
        choice, parallel = self.tool_choice(body.get("tool_choice"), {t["function"]["name"] for t in tools})
        if not tools:
            if body.get("tool_choice") is not None:
                self.dropped.append("tool_choice (no tool left to choose)")
            return {}
        out: dict[str, Any] = {"tools": tools}
        if choice is not None:
            out["tool_choice"] = choice
        if parallel is False:
            out["parallel_tool_calls"] = False
        return out

    def tool(self, tool: dict[str, Any], where: str, loaded: frozenset[str]) -> dict[str, Any] | None:
        """One declared tool as a chat function tool, or None (reported) when it cannot be one.

        Server tools (any ``type`` but ``custom``: ``web_search_*``, ``web_fetch_*``,
        ``code_execution_*``, ``bash_*``, ``text_editor_*``, ``computer_*``, ``memory_*``,
        ``tool_search_tool_*``, ``mcp_toolset``…) run on Anthropic's side or come with a schema
        only Claude models know: a chat upstream cannot run them. A ``defer_loading`` tool is
        declared once a ``tool_reference`` in the history loaded it (Claude Code's ToolSearch),
        else left out, as the Anthropic API does.
        """
        kind = tool.get("type")
        if kind not in (None, "custom"):
            self.dropped.append(f"{where} ({kind})")
            return None
        name = require_str(tool.get("name"), f"{where}.name")
        if tool.get("defer_loading") is True and name not in loaded:
            self.dropped.append(f"{where} (defer_loading {name})")
            return None
        schema = tool.get("input_schema")
        if schema is None:
            schema = {"type": "object", "properties": {}}
        function: dict[str, Any] = {"name": self.name(name),
                                    "parameters": require_dict(schema, f"{where}.input_schema")}
        description = tool.get("description")
        if isinstance(description, str) and description:
            function["description"] = description
        return {"type": "function", "function": function}

    def tool_choice(self, choice: Any, declared: set[str]) -> tuple[Any, bool | None]:
        """The chat ``tool_choice`` and ``parallel_tool_calls`` for an Anthropic ``tool_choice``
        (``declared``: the upstream names of the function tools sent)."""
        if choice is None:
            return None, None
        choice = require_dict(choice, "tool_choice")
        kind = choice.get("type")
        parallel = None if choice.get("disable_parallel_tool_use") is not True else False
        if kind == "auto":
            return "auto", parallel
        if kind == "any":
            return "required", parallel
        if kind == "none":
            return "none", None
        if kind == "tool":
            client_name = require_str(choice.get("name"), "tool_choice.name")
            name = self.name(client_name)
            if declared and name not in declared:
                raise TranslationError(f"`tool_choice.name` {client_name!r} is not a tool a chat.completions "
                                       "upstream can run (not declared, or a server tool)", param="tool_choice.name")
            return {"type": "function", "function": {"name": name}}, parallel
        raise TranslationError("`tool_choice.type` must be auto, any, tool or none", param="tool_choice.type")


def _system_text(system: Any) -> str:
    """``system`` as one string, without Claude Code's attribution block."""
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    blocks = require_list(system, "system")
    if blocks and isinstance(blocks[0], dict) and str(blocks[0].get("text", "")).startswith(BILLING_HEADER_PREFIX):
        return text_of_parts(blocks[1:], "system", kinds=("text",))
    return text_of_parts(blocks, "system", kinds=("text",))


def _referenced_tools(messages: Any) -> frozenset[str]:
    """Names in the ``tool_reference`` blocks of the history's tool results (Claude Code's ToolSearch)."""
    names: set[str] = set()
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            inner = block.get("content") if isinstance(block, dict) and block.get("type") == "tool_result" else None
            for part in inner if isinstance(inner, list) else ():
                if isinstance(part, dict) and part.get("type") == "tool_reference":
                    names.add(str(part.get("tool_name")))
    return frozenset(names)


def _user_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text-only content as one string; with images or files, the parts list."""
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts
