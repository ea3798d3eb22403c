"""Where an open block ends: at its closer, or when the JSON / Python value after its header closes.

``Block`` is fed the stream's text after the opener and answers ``end()``: the length of the block
(opener included) once it is complete, else None. Work per feed is proportional to the new text:
the closer search resumes where it stopped and the bracket scan keeps its nesting state.
"""

from __future__ import annotations

import re

from proxy.guard.dialects.base import Ctx, Dialect
from proxy.guard.dialects.tokens import NORM

#: A block larger than this (characters) is ended where it stands and read as it is.
BLOCK_CAP = 1 << 20
#: A weak marker whose body is still undecided after this many characters is text.
DECIDE_CAP = 256
_JSON_SPECIAL = re.compile(r'["\\\[\]{}]')
_PY_SPECIAL = re.compile(r'["\'\\\[\](){}]')
_OPEN, _CLOSE = "[{(", "]})"


class _Brackets:
    """Nesting depth over a JSON (or Python) value, strings skipped; one instance per value."""

    __slots__ = ("depth", "quote", "esc", "pos", "special", "back")

    def __init__(self, start: int, python: bool, quote: str = "") -> None:
        self.depth, self.quote, self.esc, self.pos = 0, "", False, start
        self.special = _PY_SPECIAL if python else _JSON_SPECIAL
        self.back = max(0, len(quote) - 1)  # a delimiter may be cut by the end of the text
        if quote:  # a multi-character string delimiter (Gemma's ``<|"|>``): no escapes, no other quotes
            self.special = re.compile(re.escape(quote) + r"|[\[\]{}]")

    def scan(self, text: str) -> int | None:
        """Advance over ``text[pos:]``; the index just after the value once it closes."""
        if self.esc and self.pos < len(text):
            self.esc, self.pos = False, self.pos + 1
        while not self.esc:
            m = self.special.search(text, self.pos)
            if m is None:
                self.pos = max(self.pos, len(text) - self.back)  # nothing matched there: safe to look again
                return None
            ch, self.pos = m.group(), m.end()
            if self.quote:
                if ch == "\\":
                    self.esc = self.pos >= len(text)
                    self.pos += 0 if self.esc else 1
                elif ch == self.quote:
                    self.quote = ""
            elif ch in "\"'" or len(ch) > 1:
                self.quote = ch
            elif ch in _OPEN:
                self.depth += 1
            elif ch in _CLOSE:
                self.depth -= 1
                if self.depth <= 0:
                    return self.pos
        return None


class Block:
    """One open block of ``dialect`` that began with ``opener``."""

    def __init__(self, dialect: Dialect, opener: str, ctx: Ctx) -> None:
        self.dialect, self.ctx = dialect, ctx
        self.opener_len = len(opener)
        self.text = opener
        self._norm = opener.translate(NORM) if dialect.fuzzy else ""
        self._searched = self.opener_len
        self._value: _Brackets | None = None
        self._value_end = self._last_end = self._resume = -1
        self.decided = dialect.plausible is None

    def feed(self, text: str) -> None:
        """Append stream text to the block."""
        self.text += text
        if self.dialect.fuzzy:
            self._norm += text.translate(NORM)

    @property
    def body(self) -> str:
        """The text after the opener."""
        return self.text[self.opener_len :]

    def plausible(self) -> bool:
        """False once the body can no longer be this dialect (the block is then text)."""
        if self.decided:
            return True
        assert self.dialect.plausible is not None
        verdict = self.dialect.plausible(self.body, self.ctx)
        if verdict is None and len(self.text) - self.opener_len > DECIDE_CAP:
            verdict = self.dialect.strong
        self.decided = verdict is not None
        return verdict is not False

    def end(self) -> int | None:
        """The block's length (opener included) once it is complete, else None."""
        if len(self.text) > BLOCK_CAP:
            return len(self.text)
        if self.dialect.value_end:
            found = self._end_of_value()
            if found is not None:
                return found
        return self._end_of_closer() if self.dialect.closers else None

    def final_end(self) -> int:
        """At the end of the stream: where an unclosed block ends (after its last complete value)."""
        return self._last_end if self.dialect.value_end and self._last_end > 0 else len(self.text)

    def _end_of_closer(self) -> int | None:
        hay = self._norm if self.dialect.fuzzy else self.text
        longest = max(len(c) for c in self.dialect.closers)
        best = -1
        for closer in self.dialect.closers:
            at = hay.find(closer, self._searched)
            if at >= 0 and (best < 0 or at < best):
                best, length = at, len(closer)
        if best < 0:
            self._searched = max(self._searched, len(hay) - longest + 1)
            return None
        return best + length

    def _end_of_value(self) -> int | None:
        """Value-terminated dialects: the header, one value (``joiners`` chain more), ``trailers``."""
        text = self.text
        while True:
            if self._value is None:
                start = self._find_start(text)
                if start is None:
                    return None
                if start < 0:  # no value can follow: the block ends after the last one (or now)
                    return self._last_end if self._last_end > 0 else len(text)
                self._value = _Brackets(start, self.dialect.python, self.dialect.quote)
            if self._value_end < 0:
                done = self._value.scan(text)
                if done is None:
                    return None
                self._value_end = self._last_end = done
            verdict = self._after_value(text)
            if verdict != -2:
                return verdict

    def _find_start(self, text: str) -> int | None:
        base = self.opener_len if self._last_end < 0 else self._resume
        finder = self.dialect.value_start or first_bracket
        offset = finder(text[base:])
        return offset if offset is None or offset < 0 else base + offset

    def _after_value(self, text: str) -> int | None:
        """After a complete value: its end, None (wait), or -2 when a joiner starts another value."""
        i = self._value_end
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        rest = text[i:]
        if not rest:
            return None
        if rest[0] in self.dialect.joiners:
            self._value, self._value_end, self._resume = None, -1, i + 1
            return -2
        for trailer in self.dialect.trailers:
            if rest.startswith(trailer):
                return i + len(trailer)
            if trailer.startswith(rest):
                return None
        return self._value_end


def first_bracket(text: str) -> int | None:
    """Default value start: the first ``{`` / ``[`` after optional whitespace; -1 when impossible."""
    stripped = text.lstrip()
    if not stripped:
        return None
    return len(text) - len(stripped) if stripped[0] in "{[" else -1
