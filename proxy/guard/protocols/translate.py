"""Shared pieces of the client-request translators (``translate_anthropic``, ``translate_responses``).

A translator turns one client request (Anthropic Messages, OpenAI Responses) into a chat.completions
request body (PROTOCOLS.md 1.1) and reports what it could not carry over. Sans-IO: plain dicts in,
a ``Translation`` out, ``TranslationError`` for input the client must fix.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

#: OpenAI function names: "a-z, A-Z, 0-9, underscores and dashes, max length 64" (PROTOCOLS.md 1.1).
MAX_TOOL_NAME = 64
#: The longest client tool name a translator takes (it is shortened to ``MAX_TOOL_NAME`` and mapped
#: back; a Responses namespace counts with its name). Longer ones are refused: every name is read,
#: hashed and echoed back, so its size is bounded like everything else a client sends (issue 24 item 2).
MAX_CLIENT_TOOL_NAME = 256
_NAME_OK = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_NAME_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


class TranslationError(ValueError):
    """The client's request is malformed: becomes an HTTP 400 in the client's protocol.

    ``param`` names the offending field as a path (``messages[2].content[0].type``) or None.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class Translation:
    """A translated request.

    ``body`` is the chat.completions request (``model`` = the client's model name; the relay maps it
    to the upstream's); ``dropped`` lists the client fields that were not carried over, as paths
    (``top_k``, ``tools[3] (web_search)``), for the caller to record; ``tool_names`` maps an upstream
    tool name back to what the client declared, for every name that had to change (shortened,
    sanitised or flattened), so emitters can restore it. Values are the client's name, or for
    Responses namespace tools a ``(namespace, name)`` pair.
    """

    body: dict[str, Any]
    dropped: tuple[str, ...] = ()
    tool_names: dict[str, Any] = field(default_factory=dict)


def upstream_tool_name(name: str) -> str:
    """The chat.completions name for a client tool name: unchanged when valid, else made valid.

    A name that is not valid (too long, other characters) has its invalid characters replaced by
    ``_``, is cut to 55 characters and gets ``_`` + 8 hex digits of its SHA-256 (LiteLLM keeps a
    "tool_name_mapping for OpenAI's 64-char limit", PROTOCOLS.md 2.6). Deterministic, so a name seen
    in history maps like the declared one. ``TranslationError`` (param ``tools``) for a name longer than
    ``MAX_CLIENT_TOOL_NAME``.
    """
    if len(name) > MAX_CLIENT_TOOL_NAME:
        raise TranslationError(f"tool name {name[:40]!r}… is {len(name)} characters long; at most "
                               f"{MAX_CLIENT_TOOL_NAME} are accepted", param="tools")
    if _NAME_OK.match(name):
        return name
    clean = _NAME_BAD_CHARS.sub("_", name)
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    return f"{clean[: MAX_TOOL_NAME - 9]}_{digest}"


def require_str(value: Any, param: str, *, allow_empty: bool = False) -> str:
    """``value`` if it is a string (non-empty unless ``allow_empty``), else ``TranslationError``."""
    if not isinstance(value, str) or (not allow_empty and not value):
        raise TranslationError(f"`{param}` must be a non-empty string", param=param)
    return value


def require_list(value: Any, param: str) -> list[Any]:
    """``value`` if it is a list, else ``TranslationError``."""
    if not isinstance(value, list):
        raise TranslationError(f"`{param}` must be an array", param=param)
    return value


def require_dict(value: Any, param: str) -> dict[str, Any]:
    """``value`` if it is an object, else ``TranslationError``."""
    if not isinstance(value, dict):
        raise TranslationError(f"`{param}` must be an object", param=param)
    return value


def optional_number(data: dict[str, Any], key: str) -> float | int | None:
    """``data[key]`` when it is a number (booleans refused), None when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TranslationError(f"`{key}` must be a number", param=key)
    return value


def optional_int(data: dict[str, Any], key: str, *, minimum: int = 1) -> int | None:
    """``data[key]`` when it is an integer >= ``minimum``, None when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TranslationError(f"`{key}` must be an integer >= {minimum}", param=key)
    return value


def optional_bool(data: dict[str, Any], key: str) -> bool | None:
    """``data[key]`` when it is a boolean, None when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise TranslationError(f"`{key}` must be a boolean", param=key)
    return value


def text_of_parts(parts: list[Any], param: str, *, kinds: tuple[str, ...]) -> str:
    """The texts of ``parts`` (blocks ``{"type": <one of kinds>, "text": str}``) joined with a blank line."""
    texts: list[str] = []
    for i, part in enumerate(parts):
        part = require_dict(part, f"{param}[{i}]")
        if part.get("type") not in kinds:
            raise TranslationError(f"`{param}[{i}].type` must be one of {', '.join(kinds)}", param=f"{param}[{i}].type")
        texts.append(require_str(part.get("text"), f"{param}[{i}].text", allow_empty=True))
    return "\n\n".join(texts)


def stream_fields(stream: bool) -> dict[str, Any]:
    """``stream`` plus ``stream_options.include_usage`` when streaming: Anthropic and Responses clients
    need the usage at the end of the stream (PROTOCOLS.md 0.9, 3.4); OpenAI allows ``stream_options``
    only with ``stream: true`` (1.1)."""
    return {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
