"""Shared shapes of the dialect library: the request context, a recogniser's result, call builders.

A *dialect* is one tool-call template family as a model emits it into text (``docs/dialects.md``).
Every recogniser gets the body of one block (the text between its opener and its closer) and a
``Ctx`` with the declared tools, and returns ``Parsed`` or raises ``MarkupError``. Recognisers never
see the stream: block boundaries are found by ``proxy.guard.dialects.block``.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.guard.turn import ToolCall, ToolSpec, synthesize_call_id


class MarkupError(ValueError):
    """A block that looks like leaked tool-call markup but cannot be read as calls."""


@dataclass(frozen=True, slots=True)
class Ctx:
    """The declared tools a recogniser types and checks against.

    ``schemas`` maps each declared tool name to its JSON Schema ``parameters`` (``{}`` when none);
    ``ordered`` holds the names sorted, for the prefix check of ``may_name`` (built in O(n log n)
    comparisons of the names, memory linear in their total length: never every prefix of every name,
    which was quadratic in a name's length, issue 24 item 2).
    """

    schemas: Mapping[str, dict[str, Any]]
    names: frozenset[str] = frozenset()
    ordered: tuple[str, ...] = ()

    @classmethod
    def of(cls, tools: tuple[ToolSpec, ...]) -> Ctx:
        """The context for a request's declared tools."""
        schemas = {t.name: t.parameters if isinstance(t.parameters, dict) else {} for t in tools}
        return cls(schemas, frozenset(schemas), tuple(sorted(n for n in schemas if n)))

    def props(self, name: str) -> dict[str, Any]:
        """The ``properties`` object of tool ``name`` (``{}`` when undeclared or absent)."""
        props = self.schemas.get(name, {}).get("properties")
        return props if isinstance(props, dict) else {}

    def may_name(self, ident: str) -> bool:
        """True when ``ident`` is a declared tool name or a non-empty prefix of one (streaming checks).

        The names that start with ``ident`` form one run of the sorted names, beginning at the first
        name not below ``ident``: ``ident`` is a prefix of some name exactly when it is one of that
        name's. O(log n) comparisons of at most ``len(ident)`` characters."""
        if not ident:
            return False
        at = bisect.bisect_left(self.ordered, ident)
        return at < len(self.ordered) and self.ordered[at].startswith(ident)


@dataclass(slots=True)
class Parsed:
    """What a recogniser found in one block: the family it belongs to and its calls, in order."""

    family: str
    calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Dialect:
    """One row of the registry: how a family's blocks open, end and are read.

    ``openers`` start a block (``|`` / ``_`` also match DeepSeek's ``｜`` / ``▁`` when ``fuzzy``);
    the block ends after the first of ``closers``, or, with ``value_end``, when the value after
    the header (``value_start`` finds it) is complete; ``trailers`` after such a value belong to
    the block. ``strong`` markers are special tokens: an unreadable block after one is a retry;
    after a *weak* marker (ordinary words) it is text. ``word``: the opener is a word (letters)
    that must start a word and is recognised only when followed by ``anchor``, the first
    character of its body.
    ``plausible(body, ctx)`` answers early whether a body can still be this family (None: not
    decided yet); an implausible block is released as text.
    """

    family: str
    openers: tuple[str, ...]
    parse: Callable[[str, Ctx], Parsed]
    closers: tuple[str, ...] = ()
    value_end: bool = False
    value_start: Callable[[str], int | None] | None = None
    trailers: tuple[str, ...] = ()
    joiners: str = ""
    strong: bool = True
    word: bool = False
    anchor: str = ""
    fuzzy: bool = False
    plausible: Callable[[str, Ctx], bool | None] | None = None
    python: bool = False
    quote: str = ""


def make_call(name: Any, arguments: Any) -> ToolCall:
    """A recovered call: raw argument text (validation repairs and checks it) or a serialised value.

    Raises ``MarkupError`` for an empty or non-string name.
    """
    if not isinstance(name, str) or not name.strip():
        raise MarkupError("empty tool name")
    if arguments is None:
        arguments = {}
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(synthesize_call_id(), name.strip(), text.strip() or "{}")


_FENCE = re.compile(r"\A\s*```[\w-]*[ \t]*\n?(.*?)\n?\s*```\s*\Z", re.S)
_WS_SEP = " \t\r\n,;"


def unfence(text: str) -> str:
    """The inside of one Markdown code fence, or ``text`` unchanged."""
    m = _FENCE.match(text)
    return m.group(1) if m else text


def json_values(text: str) -> list[Any]:
    """Every JSON value in ``text`` separated by whitespace, ``,`` or ``;`` (Llama 3 joins with ``;``).

    Raises ``MarkupError`` when anything else is in between or a value is not JSON.
    """
    text = unfence(text.strip())
    decoder = json.JSONDecoder(strict=False)
    values: list[Any] = []
    i = 0
    while i < len(text):
        if text[i] in _WS_SEP:
            i += 1
            continue
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError) as exc:
            raise MarkupError(f"not JSON ({exc})") from None
        values.append(value)
    return values


#: Keys that carry a call's name / arguments in the JSON dialects (OpenAI, Llama, Cohere, Inkling).
NAME_KEYS = ("name", "tool_name", "function_name")
ARG_KEYS = ("arguments", "parameters", "args", "input")


def call_from_obj(obj: Any) -> ToolCall:
    """One ``{"name": …, "arguments"|"parameters"|"args": …}`` object (``function`` wrapper allowed)."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]
    if not isinstance(obj, dict):
        raise MarkupError("a tool call must be a JSON object")
    name = next((obj[k] for k in NAME_KEYS if isinstance(obj.get(k), str)), None)
    if name is None:
        raise MarkupError("JSON without a tool name")
    args: Any = next((obj[k] for k in ARG_KEYS if k in obj), {})
    return make_call(name, args)


def calls_from_values(values: list[Any]) -> list[ToolCall]:
    """Calls from JSON values, each a call object or an array of call objects."""
    calls: list[ToolCall] = []
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            calls.append(call_from_obj(item))
    if not calls:
        raise MarkupError("no tool call inside the block")
    return calls


def json_calls(family: str) -> Callable[[str, Ctx], Parsed]:
    """A recogniser for bodies that are JSON call objects or arrays of them."""

    def parse(body: str, ctx: Ctx) -> Parsed:
        return Parsed(family, calls_from_values(json_values(body)))

    return parse


def starts_any(body: str, options: tuple[str, ...]) -> bool | None:
    """True when ``body`` (left-stripped) starts with an option, None while it is a prefix of one."""
    text = body.lstrip()
    if not text:
        return None
    if any(text.startswith(o) for o in options):
        return True
    return None if any(o.startswith(text) for o in options) else False


_IDENT = re.compile(r"[A-Za-z_][\w.\-]*")


def leading_name(body: str, ctx: Ctx, after: tuple[str, ...], *, declared: bool = False) -> bool | None:
    """Plausibility of a body that starts with a tool name followed by one of the ``after`` strings.

    With ``declared`` the name must be a declared tool (weak markers); otherwise any identifier
    followed by the structure counts (the call is still judged by validation).
    """
    text = body.lstrip()
    m = _IDENT.match(text)
    if m is None:
        return None if not text else False
    name, rest = m.group(), text[m.end() :]
    if declared and not ctx.may_name(name):
        return False
    if not rest:
        return None
    if declared and name not in ctx.names:
        return False
    return starts_any(rest, after) if rest.strip() else None
