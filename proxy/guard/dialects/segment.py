"""Families without markers: a whole channel text that is exactly a list of calls of declared tools.

Llama 3.1 / 3.2 / 4 answer with bare ``{"name": …, "parameters": …}`` (their templates ask for it,
raullenchai/Rapid-MLX#700, jundot/omlx#1153); Llama 3.2 / 4 and ToolACE-style fine-tunes write
``[get_weather(city="Paris")]`` (vLLM ``pythonic_tool_parser``); xLAM writes a JSON array, often
in a ```` ```json ```` fence (vLLM ``xlam_tool_parser``). Without a marker such text is a call only
when the *whole* segment is the call list and every name is declared; anything else is text.

``WholeSegment`` holds the start of a channel while it can still be such a list (its first
characters decide within a few tokens for prose) and releases everything as text the moment it
cannot; at the end a held candidate is parsed.
"""

from __future__ import annotations

import re

from proxy.guard.dialects.base import Ctx, MarkupError, Parsed, calls_from_values, json_values, unfence
from proxy.guard.dialects.block import BLOCK_CAP, _Brackets
from proxy.guard.dialects.pythonic import calls_of

_FENCE_OPEN = re.compile(r"```[\w-]*[ \t]*\n")
_FENCE_PARTIAL = re.compile(r"`{1,3}[\w-]*[ \t]*")
_KEY = re.compile(r'\{\s*"([^"]*)("?)')
_KEY_PARTIAL = re.compile(r'\{\s*"?')
_NAME_KEYS = ("name", "type", "function", "tool_name")
_IDENT = re.compile(r"[A-Za-z_][\w.]*")


class WholeSegment:
    """The start of one channel, held while it may be a bare call list naming declared tools."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.active = bool(ctx.names)
        self.held = ""
        self._start = -1  # index in ``held`` where the first value starts, once known
        self._value: _Brackets | None = None
        self._done = -1  # end of the last complete value

    def feed(self, text: str) -> str:
        """Take a text delta; return what can go on as ordinary text (all held text once decided)."""
        if not self.active:
            return text
        self.held += text
        if self._plausible() is False:
            self.active = False
            out, self.held = self.held, ""
            return out
        return ""

    def finish(self) -> tuple[str, Parsed | None]:
        """End of the channel: the held text and, when it is exactly a call list, its calls."""
        text, self.held, self.active = self.held, "", False
        if not text.strip():
            return text, None
        try:
            parsed = parse_segment(text, self.ctx)
        except (MarkupError, ValueError, RecursionError):
            return text, None
        if parsed is None:
            return text, None
        stripped = text.strip()
        at = text.find(stripped)
        return text[:at] + text[at + len(stripped) :], parsed  # the whitespace around stays text

    def _plausible(self) -> bool | None:
        if len(self.held) > BLOCK_CAP:
            return False
        if self._start < 0:
            verdict = self._head()
            if verdict is not True:
                return verdict
        return self._tail()

    def _head(self) -> bool | None:
        """Decide from the first characters (after a fence) whether a call list can follow."""
        lead = len(self.held) - len(self.held.lstrip())
        text = self.held[lead:]
        if not text:
            return None
        if text[0] == "`":
            m = _FENCE_OPEN.match(text)
            if m is None:
                return None if _FENCE_PARTIAL.fullmatch(text) else False
            lead += m.end()
            text = text[m.end() :].lstrip()
            lead = len(self.held) - len(text)
            if not text:
                return None
        verdict = _call_head(text, self.ctx)
        if verdict is True:
            self._start = lead
        return verdict

    def _tail(self) -> bool | None:
        """After the head: follow the value(s) to their end; only whitespace, ``;`` / ``,`` joining
        another call, another call, or a closing fence may come after one."""
        while True:
            if self._value is None:
                self._value = _Brackets(self._start, python=True)
            if self._done < 0:
                end = self._value.scan(self.held)
                if end is None:
                    return None
                self._done = end
            rest = self.held[self._done :].lstrip()
            if not rest:
                return None
            if rest.startswith("```") or "```".startswith(rest):
                return None if not rest[3:].strip() else False
            if rest[0] in ";,":
                rest = rest[1:].lstrip()
                if not rest:
                    return None
            verdict = _call_head(rest, self.ctx)
            if verdict is not True:
                return verdict
            self._start, self._value, self._done = len(self.held) - len(rest), None, -1


def _call_head(text: str, ctx: Ctx) -> bool | None:
    """Can ``text`` (starting at a value) be a call object, a call array or a Python call?"""
    ch = text[0]
    if ch == "{":
        m = _KEY.match(text)
        if m is None:
            return None if _KEY_PARTIAL.fullmatch(text) else False
        key, closed = m.group(1), m.group(2)
        if not closed:
            return None if any(k.startswith(key) for k in _NAME_KEYS) else False
        return key in _NAME_KEYS
    if ch == "[":
        inner = text[1:].lstrip()
        if not inner:
            return None
        return _call_head(inner, ctx) if inner[0] in "{" or inner[0].isalpha() or inner[0] == "_" else False
    m = _IDENT.match(text)
    if m is None:
        return False
    name, rest = m.group(), text[m.end() :]
    if not rest:
        return None if ctx.may_name(name) else False
    if not rest.strip():
        return None if ctx.may_name(name) else False
    return name in ctx.names and rest.lstrip()[0] == "("


def parse_segment(text: str, ctx: Ctx) -> Parsed | None:
    """The calls of a whole text that is a JSON call list or a Python call list of declared tools."""
    body = unfence(text.strip()).strip()
    if not body:
        return None
    if body[0] in "{[" and not _IDENT.match(body[1:].lstrip()):
        values = json_values(body)
        family = "xlam" if len(values) == 1 and isinstance(values[0], list) else "llama3_json"
        calls = calls_from_values(values)
    else:
        family, calls = "pythonic", calls_of(body)
    if any(c.name not in ctx.names for c in calls):
        return None
    return Parsed(family, calls)
