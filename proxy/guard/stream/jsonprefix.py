"""Incremental viability check for streamed tool-call arguments.

``JsonPrefix`` is fed argument fragments as they arrive and answers two questions without
re-parsing the buffer: has the text formed one complete top-level object/array yet, and can it
still become one? It is deliberately *lenient*: it only tracks strings and bracket nesting, so it
never declares text dead that a deterministic repair could still fix (fault-cases CASES.md
"Cross-cutting rules"): raw control characters inside strings (C21) are skipped with the string,
a leading code-fence / ``json`` tag (C23) and a trailing fence are tolerated, and a stray backslash
outside strings makes it give up (``OPAQUE``) rather than guess.

Cost: O(len(fragment)) per fragment; string bodies are skipped with one regex search per escape.
"""

from __future__ import annotations

import re

PRE, IN, DONE, DEAD, OPAQUE = range(5)

_STR_SPECIAL = re.compile(r'["\\]')
# Characters allowed between tokens: whitespace, separators, numbers, true/false/null (lenient).
_OUTSIDE = re.compile(r"[\s\x00-\x1f,:0-9A-Za-z+\-.]+")
_FENCE_CHARS = frozenset("`jsonJSON \t\r\n")
_WS_FENCE = frozenset("` \t\r\n")
_MAX_PREFIX = 16  # characters of fence residue tolerated before the value
#: Characters of a tool name tolerated between two complete values (a fused call's name), and how many.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_MAX_BETWEEN = 64


class JsonPrefix:
    """State of one argument text: ``PRE`` (nothing yet), ``IN``, ``DONE``, ``DEAD`` or ``OPAQUE``.

    ``DONE``: a complete top-level object/array was seen (trailing whitespace or a closing fence
    allowed); another object/array may follow it (``values`` counts them: a sequence of complete
    values is one of the assemblies ``proxy.guard.stream.assemble`` tries, so it is not dead). ``DEAD``: no
    deterministic repair can make the text valid JSON. ``OPAQUE``: the
    text has a shape this check does not follow (a top-level scalar or string, a stray
    backslash); callers must parse it at the end instead.
    """

    __slots__ = ("state", "values", "_stack", "_in_str", "_esc", "_prefix", "_between")

    def __init__(self) -> None:
        self.state = PRE
        self.values = 1  # top-level values begun: > 1 is a sequence (``proxy.guard.stream.assemble`` reads it)
        self._stack: list[str] = []
        self._in_str = False
        self._esc = False
        self._prefix = 0
        self._between = 0  # name characters after a complete value (a fused call's name, ``{..}read_file{..}``)

    def copy(self) -> JsonPrefix:
        """An independent copy of the current state."""
        c = JsonPrefix()
        c.state, c.values, c._stack, c._in_str = self.state, self.values, list(self._stack), self._in_str
        c._esc, c._prefix, c._between = self._esc, self._prefix, self._between
        return c

    @property
    def complete(self) -> bool:
        """True when a whole top-level object/array has been seen."""
        return self.state == DONE

    @property
    def dead(self) -> bool:
        """True when the text can no longer become valid JSON."""
        return self.state == DEAD

    def feed(self, text: str) -> None:
        """Advance over ``text``."""
        i, n = 0, len(text)
        while i < n and self.state in (PRE, IN, DONE):
            if self.state == IN:
                i = self._string(text, i) if self._in_str else self._outside(text, i)
            elif self.state == PRE:
                i = self._pre(text, i)
            else:
                i = self._after(text, i)

    def _pre(self, text: str, i: int) -> int:
        ch = text[i]
        if ch in "{[":
            self.state, self._stack = IN, [ch]
        elif ch in _FENCE_CHARS and self._prefix < _MAX_PREFIX:
            self._prefix += 1
        else:
            self.state = OPAQUE  # a scalar / string top level: parsed at the end instead
        return i + 1

    def _after(self, text: str, i: int) -> int:
        ch = text[i]
        if ch in "{[":  # a second complete value may follow (a repeat, a placeholder then the real one)
            self.state, self._stack, self.values, self._between = IN, [ch], self.values + 1, 0
        elif ch in _NAME_CHARS and self._between < _MAX_BETWEEN:
            self._between += 1  # a fused call's name between two values (proxy.guard.stream.assemble, FUSED)
        elif ch not in _WS_FENCE:
            self.state = DEAD  # anything else after a complete value
        return i + 1

    def _string(self, text: str, i: int) -> int:
        if self._esc:
            self._esc = False
            return i + 1
        m = _STR_SPECIAL.search(text, i)
        if m is None:
            return len(text)
        j = m.start()
        if text[j] == '"':
            self._in_str = False
            return j + 1
        if j + 1 < len(text):
            return j + 2
        self._esc = True
        return j + 1

    def _outside(self, text: str, i: int) -> int:
        ch = text[i]
        if ch == '"':
            self._in_str = True
        elif ch in "{[":
            self._stack.append(ch)
        elif ch in "}]":
            self._close(ch)
        elif ch == "\\":
            self.state = OPAQUE  # stray escape: repairable, not followed here
        else:
            m = _OUTSIDE.match(text, i)
            if m is None:
                self.state = DEAD
                return i + 1
            return m.end()
        return i + 1

    def _close(self, ch: str) -> None:
        if not self._stack or (self._stack[-1] == "{") != (ch == "}"):
            self.state = DEAD
            return
        self._stack.pop()
        if not self._stack:
            self.state = DONE
