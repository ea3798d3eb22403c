"""Anthropic content blocks of user turns and tool results -> chat.completions content (PROTOCOLS.md 2.1, 2.6).

What a chat upstream can be given, and how (``user_parts``):

- ``text`` -> a ``text`` part;
- ``image`` with a ``base64`` source -> an ``image_url`` part with a ``data:<media_type>;base64,``
  URL; with a ``url`` source -> an ``image_url`` part with that URL (PROTOCOLS.md 2.6);
- ``document`` with a ``text`` source (plain text) -> a ``text`` part (title and context first,
  when given); with a ``content`` source -> its text and image blocks as above; with a ``base64``
  PDF -> a ``file`` part ``{"file": {"filename", "file_data": "data:application/pdf;base64,…"}}``
  (OpenAI Chat's own shape for PDFs, openai-python ``ChatCompletionContentPartParam`` ``File``);
  upstreams without PDF input answer that request with their own 400;
- ``search_result`` and any other block -> a ``text`` part with the block as JSON (without
  ``cache_control``): never dropped in silence.

Refused with a ``TranslationError`` naming the block (``messages[i].content[j]``): images and
documents with a ``file`` source (the Anthropic Files API; the upstream has no such file),
documents with a ``url`` source (chat upstreams take PDFs only as data), base64 documents that are
not PDFs, and malformed blocks.

A ``tool_result``'s ``content`` (``tool_result_text``) is always one string, as every chat upstream
accepts: a string as is, nothing or ``[]`` -> ``""``, text blocks joined by a blank line, other
blocks serialised as JSON (Claude Code's ``tool_reference`` blocks included), images and PDFs
named in the text and carried in a user message after the tool messages (a tool message cannot
hold them), as ``Attachment`` parts.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.guard.protocols.translate import TranslationError, require_dict, require_str

#: Block keys that are caching hints, not content.
_HINTS = frozenset({"cache_control", "citations"})


def user_parts(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The chat content parts for one user block found at ``where`` (see the module docstring)."""
    kind = block.get("type")
    if kind == "text":
        return [{"type": "text", "text": require_str(block.get("text"), f"{where}.text", allow_empty=True)}]
    if kind == "image":
        return [image_part(block, where)]
    if kind == "document":
        return document_parts(block, where)
    return [{"type": "text", "text": serialised(block)}]


def image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``image`` block as an ``image_url`` part (PROTOCOLS.md 2.6)."""
    source = require_dict(block.get("source"), f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media = require_str(source.get("media_type"), f"{where}.source.media_type")
        data = require_str(source.get("data"), f"{where}.source.data")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url":
        return {"type": "image_url", "image_url": {"url": require_str(source.get("url"), f"{where}.source.url")}}
    if kind == "file":
        raise _uncarried(where, "an image with a `file` source (Anthropic Files API); send it as base64 or url")
    raise TranslationError(f"`{where}.source.type` must be base64, url or file", param=f"{where}.source.type")


def document_parts(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A ``document`` block as text, image or file parts, or a ``TranslationError`` naming it."""
    source = require_dict(block.get("source"), f"{where}.source")
    kind = source.get("type")
    if kind == "text":
        data = require_str(source.get("data"), f"{where}.source.data", allow_empty=True)
        return [{"type": "text", "text": "\n\n".join(_labels(block) + [data])}]
    if kind == "content":
        return _document_content(block, source.get("content"), f"{where}.source.content")
    if kind == "base64":
        media = source.get("media_type")
        if media != "application/pdf":
            raise _uncarried(where, f"a base64 document of type {media!r} (only application/pdf can be carried)")
        data = require_str(source.get("data"), f"{where}.source.data")
        title = block.get("title")
        filename = title if isinstance(title, str) and title else "document.pdf"
        return [{"type": "file", "file": {"filename": filename, "file_data": f"data:application/pdf;base64,{data}"}}]
    if kind == "url":
        raise _uncarried(where, "a document with a `url` source (chat upstreams take PDFs only as base64 data)")
    if kind == "file":
        raise _uncarried(where, "a document with a `file` source (Anthropic Files API); send it as base64 or text")
    raise TranslationError(f"`{where}.source.type` must be text, content, base64, url or file",
                           param=f"{where}.source.type")


def _document_content(block: dict[str, Any], content: Any, path: str) -> list[dict[str, Any]]:
    """A ``content`` document source: a string, or text and image blocks."""
    labels = [{"type": "text", "text": label} for label in _labels(block)]
    if isinstance(content, str):
        return [*labels, {"type": "text", "text": content}]
    if not isinstance(content, list):
        raise TranslationError(f"`{path}` must be a string or an array of blocks", param=path)
    parts = [p for j, item in enumerate(content) for p in user_parts(require_dict(item, f"{path}[{j}]"),
                                                                     f"{path}[{j}]")]
    return labels + parts


def _labels(block: dict[str, Any]) -> list[str]:
    return [v for v in (block.get("title"), block.get("context")) if isinstance(v, str) and v]


def _uncarried(where: str, what: str) -> TranslationError:
    return TranslationError(f"`{where}`: {what} cannot be carried to a chat.completions upstream", param=where)


def serialised(block: dict[str, Any]) -> str:
    """A block as compact JSON text, without caching hints."""
    return json.dumps({k: v for k, v in block.items() if k not in _HINTS}, ensure_ascii=False,
                      separators=(",", ":"))


def tool_result_text(content: Any, where: str, call_id: str, attachments: list[dict[str, Any]]) -> str:
    """A ``tool_result.content`` (found at ``where``) as one string; images and files go to ``attachments``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TranslationError(f"`{where}` must be a string or an array of blocks", param=where)
    texts: list[str] = []
    for j, part in enumerate(content):
        part = require_dict(part, f"{where}[{j}]")
        kind = part.get("type")
        if kind not in ("text", "image", "document"):
            texts.append(serialised(part))
            continue
        for piece in user_parts(part, f"{where}[{j}]"):
            if piece["type"] == "text":
                texts.append(piece["text"])
            else:
                label = f"[attachment {sum(a['type'] != 'text' for a in attachments) + 1}: {kind}]"
                texts.append(f"{label} (sent after the tool results)")
                attachments += [{"type": "text", "text": f"{label} from the result of tool call {call_id}:"}, piece]
    return "\n\n".join(texts)
