"""OpenAI Responses request -> chat.completions request (PROTOCOLS.md 3.3, 1.1).

``translate_responses(body)`` returns a ``Translation``: the chat body, the client fields that were
not carried over, and the map from upstream tool names to ``ClientTool(namespace, name, kind)``
(``proxy.guard.protocols.responses_tools``) for every tool whose name changed or that is not a plain
function. Malformed input raises ``TranslationError`` (with ``param``); nothing else is raised for
any JSON object.

Mapping (request shapes from openai-python ``src/openai/types/responses/response_create_params.py``,
``response_input_item_param.py``; what Codex CLI 0.171.0 sends, PROTOCOLS.md 3.3):

- ``instructions`` -> the first message, role ``system``; ``input`` as a string -> one user message.
- ``input`` items: ``message`` (``type`` may be omitted) with role ``user`` -> user message
  (``input_text`` -> text, ``input_image`` with an ``image_url`` -> ``image_url``, ``input_file``
  with ``file_data`` -> a ``file`` part; images and files by ``file_id`` / ``file_url`` -> 400,
  this proxy has no file store); roles ``developer`` / ``system`` -> a ``system`` message (many
  chat upstreams do not know ``developer``); role ``assistant`` (``output_text`` / ``refusal``
  parts) -> assistant content.
- calls: ``function_call``, ``custom_tool_call`` (raw ``input`` -> arguments ``{"input": …}``) and
  ``local_shell_call`` (``action`` -> arguments) -> tool calls of the assistant message
  (consecutive calls, and the text and reasoning just before them, form one assistant message, as
  a chat upstream produced them); ``function_call_output``, ``custom_tool_call_output`` and
  ``local_shell_call_output`` -> a ``tool`` message whose content is one string (list outputs:
  text joined, images and files carried in a user message after the tool messages); an output
  without ``call_id`` but with a ``name`` (Codex's ``agent.goal_objective`` context) -> user text
  naming it, reported.
- ``reasoning`` (``reasoning_text`` content, else its summary text) -> ``reasoning_content`` of
  the next assistant message (DeepSeek thinking mode needs it back on tool-call turns, 2.8);
  ``encrypted_content`` (opaque to any upstream but OpenAI's) is dropped and reported, as is
  reasoning that no assistant output follows. Never a 400: Codex sends these on every turn.
- ``item_reference`` -> 400 (nothing is stored here); other item types are dropped and reported.
- the history is then made valid around tool calls (``proxy.guard.protocols.tool_history``).
- ``tools`` / ``tool_choice`` / ``parallel_tool_calls``: ``proxy.guard.protocols.responses_tools`` (function,
  namespace, custom and local_shell tools declared as functions; hosted tools dropped and reported).
- ``max_output_tokens`` -> ``max_tokens``; ``temperature``, ``top_p``; ``reasoning.effort`` ->
  ``reasoning_effort``; ``text.format`` ``json_schema`` / ``json_object`` -> ``response_format``
  (``text.verbosity`` has no chat equivalent most upstreams know: reported);
  ``stream`` -> ``stream`` + ``stream_options.include_usage``.
- ``store: false``, ``include``, ``prompt_cache_key``, ``client_metadata``, ``metadata``,
  ``service_tier``, ``truncation``, ``user``, ``safety_identifier``, ``reasoning.summary`` are
  ignored silently (nothing is stored upstream); ``store: true`` and every other field are
  reported. ``previous_response_id`` / ``conversation`` are refused: this proxy stores no
  responses, the client must send the whole history (Codex does, with ``store: false``).
"""

from __future__ import annotations

from typing import Any

from proxy.guard.protocols.responses_tools import (
    NAMESPACE_SEPARATOR,
    ClientTool,
    ToolDeclarations,
    custom_arguments,
    flat_tool_name,
    local_shell_arguments,
)
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
)

_IGNORED = frozenset({"store", "include", "prompt_cache_key", "client_metadata", "metadata", "service_tier",
                      "truncation", "user", "safety_identifier", "prompt_cache_retention"})
_HANDLED = frozenset({"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
                      "max_output_tokens", "temperature", "top_p", "reasoning", "text", "stream"})
_STATEFUL = ("previous_response_id", "conversation")
_EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_CALLS = ("function_call", "custom_tool_call", "local_shell_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


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
    chat.update(out.tools.tools(body))
    chat.update(_sampling(body))
    chat.update(_text_format(body.get("text"), out.dropped))
    if optional_bool(body, "stream"):
        chat.update(stream_fields(True))
    if body.get("store") is True:
        out.dropped.append("store")
    out.dropped.extend(k for k in body if k not in _HANDLED and k not in _IGNORED)
    return Translation(body=chat, dropped=tuple(out.dropped), tool_names=dict(out.tools.tool_names))


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


def _text_format(text: Any, dropped: list[str]) -> dict[str, Any]:
    """``text.format`` -> ``response_format`` (``text`` is the default and sends nothing)."""
    if text is None:
        return {}
    text = require_dict(text, "text")
    dropped.extend(f"text.{key}" for key in text if key != "format")
    fmt = text.get("format")
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
    """Input items; collects dropped entries and (through ``tools``) renamed tools on the way."""

    def __init__(self) -> None:
        self.dropped: list[str] = []
        self.tools = ToolDeclarations(self.dropped)
        self.out: list[dict[str, Any]] = []
        self.pending = _Assistant()
        self.reasoning_at: list[str] = []  # where the pending reasoning came from
        self.shell_ids: dict[str, str] = {}  # local_shell_call item id -> call_id

    # -- input ---------------------------------------------------------------------------------

    def messages(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """``instructions`` then every input item, in order, made valid around tool calls."""
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
        paired, notes = pair_tool_messages(self.out)
        self.dropped.extend(notes)
        return paired

    def flush(self) -> None:
        """Emit the pending assistant message, if it has text or calls (reasoning alone is reported)."""
        if not self.pending.empty():
            self.out.append(self.pending.message())
        elif any(self.pending.reasoning):
            self.dropped.extend(f"{where} (reasoning no assistant output follows)" for where in self.reasoning_at)
        self.pending = _Assistant()
        self.reasoning_at = []

    def item(self, item: dict[str, Any], where: str) -> None:
        """One input item."""
        kind = item.get("type", "message")
        if kind == "message":
            self.message(item, where)
        elif kind in _CALLS:
            self.pending.calls.append(self.call(kind, item, where))
        elif kind in _OUTPUTS:
            self.flush()
            self.output(kind, item, where)
        elif kind == "reasoning":
            if not self.pending.empty():
                self.flush()
            self.pending.reasoning.append(self.reasoning_text(item, where))
            self.reasoning_at.append(where)
        elif kind == "item_reference":
            raise TranslationError(f"`{where}`: item references need stored items; toolrelay stores none, send "
                                   "the item itself", param=where)
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
            parts = content if isinstance(content, str) else self.parts(content, f"{where}.content")
            self.out.append({"role": "user", "content": parts if isinstance(parts, str) else _content(parts)})
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

    def parts(self, parts: list[Any], path: str) -> list[dict[str, Any]]:
        """Input content parts as chat parts: text, ``image_url``, ``file``; others reported."""
        out: list[dict[str, Any]] = []
        for j, part in enumerate(parts):
            where = f"{path}[{j}]"
            part = require_dict(part, where)
            kind = part.get("type")
            if kind in _TEXT_PARTS:
                out.append({"type": "text", "text": require_str(part.get("text"), f"{where}.text", allow_empty=True)})
            elif kind in ("input_image", "input_file"):
                out.append(_media_part(part, where))
            else:
                self.dropped.append(f"{where} ({kind})")
        return out

    def call(self, kind: str, item: dict[str, Any], where: str) -> dict[str, Any]:
        """A ``function_call`` / ``custom_tool_call`` / ``local_shell_call`` item as a chat tool call."""
        namespace = item.get("namespace") if isinstance(item.get("namespace"), str) and item["namespace"] else None
        if kind == "local_shell_call":
            call_id = require_str(item.get("call_id") or item.get("id"), f"{where}.call_id")
            if isinstance(item.get("id"), str):
                self.shell_ids[item["id"]] = call_id
            name = self.tools.name(None, "local_shell", "local_shell")
            arguments = local_shell_arguments(require_dict(item.get("action"), f"{where}.action"))
        else:
            call_id = require_str(item.get("call_id"), f"{where}.call_id")
            client_name = require_str(item.get("name"), f"{where}.name")
            if kind == "custom_tool_call":
                name = self.tools.name(namespace, client_name, "custom")
                arguments = custom_arguments(require_str(item.get("input"), f"{where}.input", allow_empty=True))
            else:
                name = self.tools.name(namespace, client_name)
                arguments = item.get("arguments", "{}")
                if not isinstance(arguments, str):
                    raise TranslationError(f"`{where}.arguments` must be a string", param=f"{where}.arguments")
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}

    def output(self, kind: str, item: dict[str, Any], where: str) -> None:
        """A call output item as a ``tool`` message (list output: text, then a user message for media)."""
        if kind == "local_shell_call_output":
            raw = require_str(item.get("call_id") or item.get("id"), f"{where}.id")
            call_id = self.shell_ids.get(raw, raw)
        elif item.get("call_id") in (None, "") and isinstance(item.get("name"), str) and item["name"]:
            self.context_output(item, where)
            return
        else:
            call_id = require_str(item.get("call_id"), f"{where}.call_id")
        output = item.get("output", "")
        media: list[dict[str, Any]] = []
        if isinstance(output, list):
            output, media = self.output_parts(output, f"{where}.output", call_id)
        elif not isinstance(output, str):
            raise TranslationError(f"`{where}.output` must be a string or an array of parts", param=f"{where}.output")
        self.out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        if media:
            self.out.append({"role": "user", "content": media})

    def context_output(self, item: dict[str, Any], where: str) -> None:
        """An output that answers no call: Codex 0.171.0 sends ``{"type": "function_call_output",
        "name": "goal_objective", "namespace": "agent", "output": …}`` without ``call_id`` after its
        goal tools (seen through the proxy). Carried as user text naming it, and reported."""
        name = ".".join(str(item[k]) for k in ("namespace", "name") if isinstance(item.get(k), str) and item[k])
        output = item.get("output", "")
        text = output if isinstance(output, str) else self.text(require_list(output, f"{where}.output"),
                                                                f"{where}.output")
        self.out.append({"role": "user", "content": f"[{name or 'tool'} output]\n{text}"})
        self.dropped.append(f"{where} ({item.get('type')} without call_id, sent as user text)")

    def output_parts(self, parts: list[Any], path: str, call_id: str) -> tuple[str, list[dict[str, Any]]]:
        """A list output as (its text, the user parts carrying its images and files)."""
        texts: list[str] = []
        media: list[dict[str, Any]] = []
        for part in self.parts(parts, path):
            if part["type"] == "text":
                texts.append(part["text"])
                continue
            label = f"[attachment {len(media) // 2 + 1}: {part['type']}]"
            texts.append(f"{label} (sent after the tool results)")
            media += [{"type": "text", "text": f"{label} from the output of tool call {call_id}:"}, part]
        return "\n\n".join(texts), media

    def reasoning_text(self, item: dict[str, Any], where: str) -> str:
        """The reasoning text of a ``reasoning`` item: its ``reasoning_text`` content, else its summary."""
        if item.get("encrypted_content"):
            self.dropped.append(f"{where}.encrypted_content")
        content = item.get("content")
        if isinstance(content, list) and content:
            return self.text(content, f"{where}.content")
        summary = item.get("summary")
        if isinstance(summary, list) and summary:
            return self.text(summary, f"{where}.summary")
        return ""


def _media_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``input_image`` / ``input_file`` part as an ``image_url`` / ``file`` part, or a 400 naming it."""
    if part["type"] == "input_image":
        if not isinstance(part.get("image_url"), str):
            raise TranslationError(f"`{where}`: an image by `file_id` cannot be carried to a chat.completions "
                                   "upstream (toolrelay has no file store); send `image_url`", param=where)
        image: dict[str, Any] = {"url": part["image_url"]}
        if part.get("detail") in ("low", "high", "auto"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if not isinstance(part.get("file_data"), str):
        raise TranslationError(f"`{where}`: a file by `file_id` or `file_url` cannot be carried to a "
                               "chat.completions upstream; send `file_data`", param=where)
    name = part.get("filename") if isinstance(part.get("filename"), str) else "file"
    return {"type": "file", "file": {"filename": name, "file_data": part["file_data"]}}


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text-only content as one string; with images or files, the parts list."""
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts


__all__ = ["NAMESPACE_SEPARATOR", "ClientTool", "flat_tool_name", "translate_responses"]
