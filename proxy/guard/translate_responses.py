"""OpenAI Responses request -> chat.completions request (PROTOCOLS.md 3.3, 1.1).

``translate_responses(body)`` returns a ``Translation``: the chat body, the client fields that were
not carried over, and the map from upstream tool names back to ``(namespace, name)`` for every
name that had to change. Malformed input raises ``TranslationError`` (with ``param``); nothing else
is raised for any JSON object.

Mapping (request shapes from openai-python ``src/openai/types/responses/response_create_params.py``,
``response_input_item_param.py``; what Codex CLI 0.171.0 sends, PROTOCOLS.md 3.3):

- ``instructions`` -> the first message, role ``system``; ``input`` as a string -> one user message.
- ``input`` items: ``message`` (``type`` may be omitted) with role ``user`` -> user message
  (``input_text`` -> text, ``input_image`` with an ``image_url`` -> ``image_url``); roles
  ``developer`` / ``system`` -> a ``system`` message (many chat upstreams do not know
  ``developer``); role ``assistant`` (``output_text`` / ``refusal`` parts) -> assistant content.
  ``function_call`` -> a tool call of the assistant message (consecutive calls, and the text and
  reasoning just before them, form one assistant message, as a chat upstream produced them);
  ``function_call_output`` -> a ``tool`` message; ``reasoning`` (``reasoning_text`` content, else
  its summary) -> ``reasoning_content`` of the next assistant message (DeepSeek thinking mode
  needs it back on tool-call turns, 2.8). Other item types are dropped and reported.
- ``tools``: ``function`` tools as chat function tools; ``namespace`` tools (Codex's
  ``multi_agent_v1``) flattened to ``<namespace>__<name>`` and mapped back (the emitter restores
  ``name`` and ``namespace`` on the ``function_call`` item, as in openai-python's
  ``ResponseFunctionToolCall.namespace``); hosted tools (``web_search`` …) and ``custom`` tools are
  dropped and reported.
- ``tool_choice`` ``auto`` / ``none`` / ``required`` / ``{"type":"function","name"}``;
  ``parallel_tool_calls``; ``max_output_tokens`` -> ``max_tokens``; ``temperature``, ``top_p``;
  ``reasoning.effort`` -> ``reasoning_effort``; ``text.format`` -> ``response_format``;
  ``stream`` -> ``stream`` + ``stream_options.include_usage``.
- ``store: false``, ``include``, ``prompt_cache_key``, ``client_metadata``, ``metadata``,
  ``service_tier``, ``truncation``, ``user``, ``safety_identifier``, ``reasoning.summary`` are
  ignored silently (nothing is stored upstream); ``store: true`` and every other field are
  reported. ``previous_response_id`` / ``conversation`` are refused: this proxy stores no
  responses, the client must send the whole history (Codex does, with ``store: false``).
"""

from __future__ import annotations

from typing import Any

from proxy.guard.translate import (
    Translation,
    TranslationError,
    optional_bool,
    optional_int,
    optional_number,
    require_dict,
    require_list,
    require_str,
    stream_fields,
    upstream_tool_name,
)

#: Separator between a namespace and a tool name in flattened names.
NAMESPACE_SEPARATOR = "__"
_IGNORED = frozenset({"store", "include", "prompt_cache_key", "client_metadata", "metadata", "service_tier",
                      "truncation", "user", "safety_identifier", "prompt_cache_retention"})
_HANDLED = frozenset({"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
                      "max_output_tokens", "temperature", "top_p", "reasoning", "text", "stream"})
_STATEFUL = ("previous_response_id", "conversation")
_EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def translate_responses(body: dict[str, Any]) -> Translation:
    """Translate an OpenAI Responses request body (``POST /v1/responses``) to chat.completions."""
    body = require_dict(body, "body")
    for key in _STATEFUL:
        if body.get(key) is not None:
            raise TranslationError(f"`{key}` is not supported: toolrelay stores no responses; send the whole "
                                   "conversation in `input` (with `store: false`)", param=key)
    out = _Translator()
    chat: dict[str, Any] = {"model": require_str(body.get("model"), "model")}
    chat["messages"] = out.messages(body)
    chat.update(out.tools(body))
    chat.update(_sampling(body))
    chat.update(_text_format(body.get("text")))
    if optional_bool(body, "stream"):
        chat.update(stream_fields(True))
    if body.get("store") is True:
        out.dropped.append("store")
    out.dropped.extend(k for k in body if k not in _HANDLED and k not in _IGNORED)
    return Translation(body=chat, dropped=tuple(out.dropped), tool_names=out.tool_names)


def flat_tool_name(namespace: str | None, name: str) -> str:
    """The upstream name of tool ``name`` (inside ``namespace`` when given)."""
    return upstream_tool_name(f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name)


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    """``max_tokens``, ``temperature``, ``top_p`` and ``reasoning_effort``."""
    out: dict[str, Any] = {}
    max_tokens = optional_int(body, "max_output_tokens")
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    for key in ("temperature", "top_p"):
        value = optional_number(body, key)
        if value is not None:
            out[key] = value
    reasoning = body.get("reasoning")
    if reasoning is not None:
        effort = require_dict(reasoning, "reasoning").get("effort")
        if effort in _EFFORTS:
            out["reasoning_effort"] = _EFFORTS[effort]
        elif effort not in (None, "none"):
            raise TranslationError("`reasoning.effort` must be none, minimal, low, medium, high or xhigh",
                                   param="reasoning.effort")
    return out


def _text_format(text: Any) -> dict[str, Any]:
    """``text.format`` -> ``response_format`` (``text`` is the default and sends nothing)."""
    if text is None:
        return {}
    fmt = require_dict(text, "text").get("format")
    if fmt is None:
        return {}
    fmt = require_dict(fmt, "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "json_schema":
        schema = require_dict(fmt.get("schema"), "text.format.schema")
        spec: dict[str, Any] = {"name": fmt.get("name") if isinstance(fmt.get("name"), str) else "output",
                                "schema": schema}
        if isinstance(fmt.get("strict"), bool):
            spec["strict"] = fmt["strict"]
        return {"response_format": {"type": "json_schema", "json_schema": spec}}
    raise TranslationError("`text.format.type` must be text, json_object or json_schema", param="text.format.type")


class _Assistant:
    """The assistant message being assembled from consecutive output items."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.reasoning: list[str] = []

    def empty(self) -> bool:
        return not (self.texts or self.calls)

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(self.texts) if self.texts else None}
        if self.calls:
            message["tool_calls"] = self.calls
        elif message["content"] is None:
            message["content"] = ""
        if any(self.reasoning):
            message["reasoning_content"] = "\n\n".join(r for r in self.reasoning if r)
        return message


class _Translator:
    """Input items and tools; collects dropped fields and renamed tools on the way."""

    def __init__(self) -> None:
        self.dropped: list[str] = []
        self.tool_names: dict[str, tuple[str | None, str]] = {}
        self.out: list[dict[str, Any]] = []
        self.pending = _Assistant()

    def name(self, namespace: str | None, name: str) -> str:
        """The upstream name for ``name`` in ``namespace``, remembering any change."""
        upstream = flat_tool_name(namespace, name)
        if upstream != name or namespace:
            self.tool_names[upstream] = (namespace, name)
        return upstream

    # -- input ---------------------------------------------------------------------------------

    def messages(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """``instructions`` then every input item, in order."""
        instructions = body.get("instructions")
        if instructions is not None and require_str(instructions, "instructions", allow_empty=True):
            self.out.append({"role": "system", "content": instructions})
        items = body.get("input")
        if isinstance(items, str):
            self.out.append({"role": "user", "content": items})
            return self.out
        for i, item in enumerate(require_list(items, "input")):
            self.item(require_dict(item, f"input[{i}]"), f"input[{i}]")
        self.flush()
        if not any(m["role"] != "system" for m in self.out):
            raise TranslationError("`input` must contain at least one message", param="input")
        return self.out

    def flush(self) -> None:
        """Emit the pending assistant message, if it has text or calls."""
        if not self.pending.empty():
            self.out.append(self.pending.message())
        self.pending = _Assistant()

    def item(self, item: dict[str, Any], where: str) -> None:
        """One input item."""
        kind = item.get("type", "message")
        if kind == "message":
            self.message(item, where)
        elif kind == "function_call":
            self.pending.calls.append(self.function_call(item, where))
        elif kind == "function_call_output":
            self.flush()
            self.out.append(self.function_call_output(item, where))
        elif kind == "reasoning":
            if not self.pending.empty():
                self.flush()
            self.pending.reasoning.append(self.reasoning_text(item, where))
        else:
            self.dropped.append(f"{where} ({kind})")

    def message(self, item: dict[str, Any], where: str) -> None:
        """A ``message`` item (easy form ``{role, content}`` included)."""
        role = item.get("role")
        content = item.get("content")
        if not isinstance(content, str | list):
            raise TranslationError(f"`{where}.content` must be a string or an array of parts",
                                   param=f"{where}.content")
        if role == "assistant":
            if self.pending.calls:
                self.flush()
            self.pending.texts.append(content if isinstance(content, str) else self.text(content, f"{where}.content"))
            return
        self.flush()
        if role in ("system", "developer"):
            text = content if isinstance(content, str) else self.text(content, f"{where}.content")
            self.out.append({"role": "system", "content": text})
        elif role == "user":
            self.out.append({"role": "user", "content": content if isinstance(content, str) else self.user(
                content, where)})
        else:
            raise TranslationError(f"`{where}.role` must be user, assistant, system or developer",
                                   param=f"{where}.role")

    def text(self, parts: list[Any], path: str) -> str:
        """The text parts of ``parts`` (found at ``path``) joined by a blank line; other parts are reported."""
        texts: list[str] = []
        for j, part in enumerate(parts):
            part = require_dict(part, f"{path}[{j}]")
            kind = part.get("type")
            if kind in _TEXT_PARTS:
                texts.append(require_str(part.get("text"), f"{path}[{j}].text", allow_empty=True))
            elif kind == "refusal":
                texts.append(require_str(part.get("refusal"), f"{path}[{j}].refusal", allow_empty=True))
            else:
                self.dropped.append(f"{path}[{j}] ({kind})")
        return "\n\n".join(texts)

    def user(self, parts: list[Any], where: str) -> str | list[dict[str, Any]]:
        """User content: one string when text-only, else text and ``image_url`` parts."""
        out: list[dict[str, Any]] = []
        for j, part in enumerate(parts):
            part = require_dict(part, f"{where}.content[{j}]")
            kind = part.get("type")
            if kind in _TEXT_PARTS:
                out.append({"type": "text",
                            "text": require_str(part.get("text"), f"{where}.content[{j}].text", allow_empty=True)})
            elif kind == "input_image" and isinstance(part.get("image_url"), str):
                image: dict[str, Any] = {"url": part["image_url"]}
                if part.get("detail") in ("low", "high", "auto"):
                    image["detail"] = part["detail"]
                out.append({"type": "image_url", "image_url": image})
            else:
                self.dropped.append(f"{where}.content[{j}] ({kind})")
        if all(p["type"] == "text" for p in out):
            return "\n\n".join(p["text"] for p in out)
        return out

    def function_call(self, item: dict[str, Any], where: str) -> dict[str, Any]:
        """A ``function_call`` item as a chat tool call."""
        call_id = require_str(item.get("call_id"), f"{where}.call_id")
        name = require_str(item.get("name"), f"{where}.name")
        namespace = item.get("namespace") if isinstance(item.get("namespace"), str) and item["namespace"] else None
        arguments = item.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise TranslationError(f"`{where}.arguments` must be a string", param=f"{where}.arguments")
        return {"id": call_id, "type": "function",
                "function": {"name": self.name(namespace, name), "arguments": arguments}}

    def function_call_output(self, item: dict[str, Any], where: str) -> dict[str, Any]:
        """A ``function_call_output`` item as a ``tool`` message (list output -> its joined text)."""
        call_id = require_str(item.get("call_id"), f"{where}.call_id")
        output = item.get("output", "")
        if isinstance(output, list):
            output = self.text(output, f"{where}.output")
        elif not isinstance(output, str):
            raise TranslationError(f"`{where}.output` must be a string or an array of parts", param=f"{where}.output")
        return {"role": "tool", "tool_call_id": call_id, "content": output}

    def reasoning_text(self, item: dict[str, Any], where: str) -> str:
        """The reasoning text of a ``reasoning`` item: its ``reasoning_text`` content, else its summary."""
        content = item.get("content")
        if isinstance(content, list) and content:
            return self.text(content, f"{where}.content")
        summary = item.get("summary")
        if isinstance(summary, list) and summary:
            return self.text(summary, f"{where}.summary")
        return ""

    # -- tools ---------------------------------------------------------------------------------

    def tools(self, body: dict[str, Any]) -> dict[str, Any]:
        """``tools``, ``tool_choice`` and ``parallel_tool_calls`` (omitted when no tool is left)."""
        tools: list[dict[str, Any]] = []
        for i, tool in enumerate(require_list(body.get("tools") or [], "tools")):
            tools.extend(self.tool(require_dict(tool, f"tools[{i}]"), f"tools[{i}]"))
        choice = self.tool_choice(body.get("tool_choice"))
        parallel = optional_bool(body, "parallel_tool_calls")
        if not tools:
            return {}
        out: dict[str, Any] = {"tools": tools}
        if choice is not None:
            out["tool_choice"] = choice
        if parallel is not None:
            out["parallel_tool_calls"] = parallel
        return out

    def tool(self, tool: dict[str, Any], where: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """One declared tool as chat function tools (a namespace yields one per member)."""
        kind = tool.get("type")
        if kind == "function":
            return [self.function_tool(tool, where, namespace)]
        if kind == "namespace" and namespace is None:
            inner = require_str(tool.get("name"), f"{where}.name")
            members = require_list(tool.get("tools") or [], f"{where}.tools")
            return [t for j, member in enumerate(members)
                    for t in self.tool(require_dict(member, f"{where}.tools[{j}]"), f"{where}.tools[{j}]", inner)]
        self.dropped.append(f"{where} ({kind})")
        return []

    def function_tool(self, tool: dict[str, Any], where: str, namespace: str | None) -> dict[str, Any]:
        """A ``function`` tool (flat in Responses) as a chat function tool."""
        name = require_str(tool.get("name"), f"{where}.name")
        parameters = tool.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        function: dict[str, Any] = {"name": self.name(namespace, name),
                                    "parameters": require_dict(parameters, f"{where}.parameters")}
        description = tool.get("description")
        if isinstance(description, str) and description:
            function["description"] = description
        return {"type": "function", "function": function}

    def tool_choice(self, choice: Any) -> Any:
        """The chat ``tool_choice`` for a Responses ``tool_choice`` (None: leave the default)."""
        if choice is None or choice in ("auto", "none", "required"):
            return choice
        if isinstance(choice, str):
            raise TranslationError("`tool_choice` must be auto, none, required or an object", param="tool_choice")
        choice = require_dict(choice, "tool_choice")
        kind = choice.get("type")
        if kind == "function":
            name = require_str(choice.get("name"), "tool_choice.name")
            namespace = choice.get("namespace") if isinstance(choice.get("namespace"), str) else None
            return {"type": "function", "function": {"name": self.name(namespace, name)}}
        if kind == "allowed_tools" and choice.get("mode") in ("auto", "required"):
            self.dropped.append("tool_choice.tools")
            return choice["mode"]
        self.dropped.append(f"tool_choice ({kind})")
        return None
