"""A client request in chat.completions form, prepared once: checked, with its guard spec.

Every client protocol turns its client's request into a chat.completions body (identity for OpenAI Chat,
``translate_*`` for the others) and hands it to ``prepare``, which checks what must fail with a
400 before anything goes upstream and reads the facts the rest of the request path needs (stream,
tools, ``stream_options.include_usage``, the guard's ``RequestSpec``) exactly once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from proxy.guard.checks.schema_bounds import SchemaBounds, SchemaCost, SchemaTooComplex, exceeded, measure
from proxy.guard.checks.validate import cached_schema, compile_schema, schema_key, tool_declaration_problem
from proxy.guard.turn import RequestSpec, ToolSpec


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
    guard validates against; ``include_usage``: the client asked for a usage chunk; ``unchecked``: the
    ``(tool name, position in tools, schema key)`` of declared schemas too large to check against their
    metaschema on the event loop (``proxy.relay.schema_pool.check_schemas`` checks them before any upstream call).
    """

    body: dict[str, Any]
    spec: RequestSpec
    raw: bytes | None = None
    include_usage: bool = False
    unchecked: tuple[tuple[str, int, str], ...] = ()

    @property
    def model(self) -> str:
        """The client's model name."""
        return str(self.body["model"])

    @property
    def stream(self) -> bool:
        """True for a streaming request."""
        return self.body.get("stream") is True

    @property
    def declares_tools(self) -> bool:
        """True when the request declares tools (its tool calls are checked: the ``Guarded`` path's work)."""
        return bool(self.body.get("tools"))


def prepare(body: dict[str, Any], raw: bytes | None = None, bounds: SchemaBounds | None = None) -> ChatRequest:
    """Check ``body``'s tool declarations and build its ``ChatRequest``; ``RequestInvalid`` when a
    declaration can never be satisfied (``proxy.guard.checks.validate.tool_declaration_problem``) or a tool's
    ``parameters`` schema is beyond ``bounds`` (``measure_schemas``; default ``SchemaBounds()``)."""
    bounds = bounds or SchemaBounds()
    check_tool_names(body)
    spec = RequestSpec.from_openai(body)
    problem = tool_declaration_problem(spec)
    if problem is not None:
        raise RequestInvalid(problem[0], param=problem[1])
    unchecked = measure_schemas(body, spec, bounds)
    spec = dataclasses.replace(spec, inline_cost=bounds.inline_cost, inline_check_nodes=bounds.inline_check_nodes)
    return ChatRequest(body=body, spec=spec, raw=raw, include_usage=spec.usage_requested, unchecked=unchecked)


def measure_schemas(body: dict[str, Any], spec: RequestSpec,
                    bounds: SchemaBounds) -> tuple[tuple[str, int, str], ...]:
    """Measure every declared tool's ``parameters`` against ``bounds`` and compile it (into the schema
    cache), before any upstream call; return the ``(name, position, schema key)`` of the schemas left to check in
    the validation pool (not cached, and past ``bounds.inline_check_nodes`` JSON values together,
    counted from the smallest schema up).

    ``RequestInvalid`` (code ``tool_schema_too_complex``, ``param`` ``tools[i].function.parameters``)
    names the tool and the bound it exceeds. Linear in the schemas' size
    (``proxy.guard.checks.schema_bounds.measure``); the metaschema check of the schemas compiled here is bounded
    by ``inline_check_nodes``, and validating a call by the inline budget and the validation pool."""
    positions = {name: i for i, name in enumerate(_declared_names(body))}
    fresh: list[tuple[ToolSpec, int]] = []
    total = 0.0
    for tool in spec.tools:
        if tool.parameters is None:
            continue
        measured = _measured(tool, positions.get(tool.name, 0), bounds)
        if measured is None:
            continue
        cost, nodes = measured
        total += _request_cost(cost)
        _within_request_cost(total, bounds)
        if nodes is not None:
            fresh.append((tool, nodes))
    left: list[tuple[str, int, str]] = []
    budget = bounds.inline_check_nodes
    for tool, nodes in sorted(fresh, key=lambda item: item[1]):  # the smallest first, while they fit
        if nodes <= budget:
            budget -= nodes
            compile_schema(tool.parameters or {})
        else:
            left.append((tool.name, positions.get(tool.name, 0), schema_key(tool.parameters or {})))
    return tuple(left)


def _measured(tool: ToolSpec, position: int, bounds: SchemaBounds) -> tuple[SchemaCost, int | None] | None:
    """The static cost of ``tool``'s schema and, when it is not compiled yet, its node count (None: cached,
    its figures suffice); None for a schema that cannot be measured (the validator reports it as
    unusable). ``RequestInvalid`` when it exceeds ``bounds``."""
    assert tool.parameters is not None
    cached = cached_schema(tool.parameters)
    if cached is not None and cached.validator is not None:  # measured when compiled
        over = exceeded(cached.cost, bounds)
        if over is not None:
            raise schema_refused(tool.name, position, over.bound, over.message)
        return cached.cost, None
    try:
        measured = measure(tool.parameters, bounds)
    except SchemaTooComplex as exc:
        raise schema_refused(tool.name, position, exc.bound, exc.message) from None
    except (ValueError, RecursionError):  # not serialisable
        return None
    return measured, measured.nodes


def _request_cost(cost: SchemaCost) -> float:
    """What one schema adds to its request's total: its static cost, or its nodes when recursive."""
    return cost.cost if math.isfinite(cost.cost) else float(cost.nodes)


def _within_request_cost(total: float, bounds: SchemaBounds) -> None:
    """``RequestInvalid`` (bound ``request``, ``param`` ``tools``) once the request's schemas together are
    past ``bounds.max_request_cost`` (never below ``max_cost``: one schema within its own bound passes)."""
    limit = max(bounds.max_request_cost, bounds.max_cost)
    if total > limit:
        raise RequestInvalid(f"the tools' parameters schemas together are too complex to validate (request: "
                             f"static cost over {limit}; declare fewer or simpler tools)",
                             param="tools", code="tool_schema_too_complex")


def schema_refused(name: str, position: int, bound: str, message: str) -> RequestInvalid:
    """The 400 for tool ``name`` (at ``tools[position]``) whose schema is past ``bound`` (``message``)."""
    return RequestInvalid(f"tool {name[:100]!r}: its parameters schema is too complex to validate "
                          f"({bound}: {message})", param=f"tools[{position}].function.parameters",
                          code="tool_schema_too_complex")


def _declared_names(body: dict[str, Any]) -> list[str | None]:
    """The function name of each entry of ``body["tools"]`` (None for one without), in order."""
    names: list[str | None] = []
    for tool in body.get("tools") or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        names.append(fn.get("name") if isinstance(fn, dict) and isinstance(fn.get("name"), str) else None)
    return names


#: The longest declared tool name (OpenAI: "a-z, A-Z, 0-9, underscores and dashes, max length 64",
#: PROTOCOLS.md 1.1; the providers refuse longer ones), checked on the chat request after translation.
MAX_TOOL_NAME = 64


def check_tool_names(body: dict[str, Any]) -> None:
    """``RequestInvalid`` (param ``tools[i].function.name``) for a declared function name longer than
    ``MAX_TOOL_NAME`` characters: the guard reads every declared name per choice and attempt, so their
    size is bounded before anything else looks at them (issue 24 item 2). The translators shorten
    longer client names of Anthropic and Responses clients, so there this only holds them to it."""
    for position, name in enumerate(_declared_names(body)):
        if name is not None and len(name) > MAX_TOOL_NAME:
            raise RequestInvalid(f"tool name {name[:40]!r}… is {len(name)} characters long; tool names may have "
                                 f"at most {MAX_TOOL_NAME}", param=f"tools[{position}].function.name")


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
