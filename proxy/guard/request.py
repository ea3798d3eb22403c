"""A client request in chat.completions form, prepared once: checked, with its guard spec.

Every dialect turns its client's request into a chat.completions body (identity for OpenAI Chat,
``translate_*`` for the others) and hands it to ``prepare``, which checks what must fail with a
400 before anything goes upstream and reads the facts the rest of the request path needs (stream,
tools, ``stream_options.include_usage``, the guard's ``RequestSpec``) exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.guard.turn import RequestSpec
from proxy.guard.validate import tool_declaration_problem


class RequestInvalid(ValueError):
    """The client's request cannot be served as sent: an HTTP 400 in the client's protocol.

    ``param`` names the offending field (``messages``, ``tools[2].function.name``) or None.
    """

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A prepared chat.completions request.

    ``body`` is the request (``model`` = the client's public model name; the upstream client maps it);
    ``raw`` the client's exact bytes when it spoke OpenAI Chat (sent upstream unchanged when nothing
    needs rewriting, so a pass-through stays byte-identical both ways), else None; ``spec`` what the
    guard validates against; ``include_usage``: the client asked for a usage chunk.
    """

    body: dict[str, Any]
    spec: RequestSpec
    raw: bytes | None = None
    include_usage: bool = False

    @property
    def model(self) -> str:
        """The client's model name."""
        return str(self.body["model"])

    @property
    def stream(self) -> bool:
        """True for a streaming request."""
        return self.body.get("stream") is True

    @property
    def guarded(self) -> bool:
        """True when the request declares tools (its tool calls are checked)."""
        return bool(self.body.get("tools"))


def prepare(body: dict[str, Any], raw: bytes | None = None) -> ChatRequest:
    """Check ``body``'s tool declarations and build its ``ChatRequest``; ``RequestInvalid`` when a
    declaration can never be satisfied (``proxy.guard.validate.tool_declaration_problem``)."""
    spec = RequestSpec.from_openai(body)
    problem = tool_declaration_problem(spec)
    if problem is not None:
        raise RequestInvalid(problem[0], param=problem[1])
    return ChatRequest(body=body, spec=spec, raw=raw, include_usage=spec.usage_requested)


def check_chat_fields(data: dict[str, Any]) -> None:
    """Field checks of an OpenAI Chat client's own request that must fail with 400 and ``param`` before
    anything goes upstream (PROTOCOLS.md 1.1); ``RequestInvalid`` otherwise."""
    if not isinstance(data.get("model"), str) or not data["model"]:
        raise RequestInvalid("`model` is required and must be a string", param="model")
    if not isinstance(data.get("messages"), list) or not data["messages"]:
        raise RequestInvalid("`messages` is required and must be a non-empty array", param="messages")
    if "stream" in data and not isinstance(data["stream"], bool) and data["stream"] is not None:
        raise RequestInvalid("`stream` must be a boolean", param="stream")
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestInvalid("`tools` must be an array", param="tools")
    for position, tool in enumerate(tools or ()):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestInvalid("each tool needs `function.name`", param=f"tools[{position}].function.name")
    n = data.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128):
        raise RequestInvalid("`n` must be an integer between 1 and 128", param="n")
