"""Incremental, spec-tolerant SSE decoder (bytes in, events out) and the canonical encoders.

Decoding follows the WHATWG event-stream rules (PROTOCOLS.md 5.1): UTF-8, one leading BOM
stripped, lines ended by CRLF, LF or CR, ``:`` comments, one optional space after the field colon,
multi-line ``data`` joined with ``\\n``, a blank line dispatches. It departs from the spec where an
upstream's fault must stay visible to the guard instead of being silently dropped:

- a non-standard ``error:`` field (fault case C43) is kept and dispatches the event even without a
  ``data`` line;
- the last event at EOF without its blank line is dispatched by ``flush()`` with
  ``terminated=False`` (the spec discards it; the accumulator records a finding instead);
- a data line without the space after the colon (C38) and the comments seen before an event (C40)
  are reported on the event.

Bytes may be fed in any split, including inside a UTF-8 sequence or between CR and LF (lines are
cut on the ASCII bytes CR/LF, which never occur inside a UTF-8 sequence, and decoded whole).
Nothing here raises on any input: undecodable bytes become U+FFFD, and the event says so
(``invalid_utf8``): the protocol allows only UTF-8 (PROTOCOLS.md 5.1), so the guard decides what a
replaced byte touched (``proxy.guard.stream.integrity``); a field line whose name is invalid UTF-8 or one
edit from ``data``, or an unknown field carrying a JSON value, is counted in ``corrupt_fields`` (its
frame is lost). A line longer than ``max_line`` bytes is never
held without end: the decoder drops it and sets ``overflow`` (the guard retries the attempt).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_BOM = b"\xef\xbb\xbf"
_EOL = re.compile(rb"[\r\n]")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event.

    ``event`` is the ``event:`` name (``"message"`` when absent); ``data`` the joined data lines;
    ``offset`` the byte offset of the event's first field line in the body (BOM included);
    ``frame`` the 0-based number of the event among the dispatched ones; ``raw`` the text of its
    field lines joined with ``\\n`` (for findings); ``no_space`` True when a ``data`` line had no
    space after the colon (C38); ``comments`` the comment texts seen since the previous event
    (C40); ``error`` the value of a non-standard ``error:`` field (C43); ``has_data`` whether any
    ``data`` line was seen; ``terminated`` False when ``flush()`` dispatched it at EOF without a
    blank line; ``id`` / ``retry`` the last-event-id and reconnection time in force.
    """

    data: str
    offset: int
    frame: int
    event: str = "message"
    raw: str = ""
    no_space: bool = False
    comments: tuple[str, ...] = ()
    error: str | None = None
    has_data: bool = True
    terminated: bool = True
    id: str | None = None
    retry: int | None = None
    invalid_utf8: bool = False  # a field line held bytes that are not UTF-8 (decoded as U+FFFD)


@dataclass(slots=True)
class _Pending:
    """Field lines of the event being built."""

    data: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    event: str = ""
    error: str | None = None
    no_space: bool = False
    offset: int = -1
    invalid_utf8: bool = False

    def empty(self) -> bool:
        return not self.lines


class SSEDecoder:
    """Push-style decoder: ``feed(bytes) -> list[SSEEvent]``, then ``flush()`` once at EOF.

    ``max_line``: the longest line kept (bytes, terminator excluded); past it the line is dropped and
    ``overflow`` turns True (None: unbounded).
    """

    def __init__(self, *, max_line: int | None = None) -> None:
        self.max_line = max_line
        self.overflow = False
        #: field lines dropped because their name is corrupted (invalid UTF-8, or one edit from ``data``):
        #: the frame under such a line is lost, which the guard must not take for a shorter stream.
        self.corrupt_fields = 0
        self._partial = bytearray()  # bytes of the current line (no CR/LF inside)
        self._partial_offset = 0  # body offset of the current line's first byte
        self._consumed = 0  # body bytes seen so far
        self._skip_lf = False  # the previous chunk ended with CR: a leading LF belongs to it
        self._bom_checked = False
        self._pending = _Pending()
        self._comments: list[str] = []
        self._frames = 0
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Decode ``data`` (any split of the body) and return the events it completes."""
        out: list[SSEEvent] = []
        if not data:
            return out
        start = self._consumed
        self._consumed += len(data)
        pos = 0
        if not self._bom_checked:
            head = self._strip_bom(data)
            if head is None:
                return out
            data, pos = head
            start = 0  # ``data`` now holds the body from its first byte
        if self._skip_lf:
            self._skip_lf = False
            if data[pos : pos + 1] == b"\n":
                pos += 1
                self._partial_offset = start + pos
        self._split_lines(data, pos, start, out)
        return out

    def _split_lines(self, data: bytes, pos: int, start: int, out: list[SSEEvent]) -> None:
        """Cut ``data[pos:]`` (body offset ``start`` at index 0) into lines; keep the unfinished tail."""
        for m in _EOL.finditer(data, pos):
            end = m.start()
            if end < pos:
                continue  # the LF of a CRLF already consumed
            if self._partial:  # the line began in an earlier chunk
                self._partial += data[pos:end]
                line = bytes(self._partial)
                self._partial.clear()
            else:  # the usual case: the whole line is in this chunk, one slice
                line = data[pos:end]
            self._line(line, out)
            pos = end + 1
            if data[end : end + 1] == b"\r":
                if end + 1 < len(data):
                    pos += data[end + 1 : end + 2] == b"\n"
                else:
                    self._skip_lf = True  # CRLF may be split across feeds
            self._partial_offset = start + pos
        self._partial += data[pos:]
        if self.max_line is not None and len(self._partial) > self.max_line:
            self.overflow = True
            self._partial.clear()

    def flush(self) -> list[SSEEvent]:
        """At EOF: dispatch a final event that lacked its blank line (marked ``terminated=False``)."""
        out: list[SSEEvent] = []
        if not self._bom_checked and self._partial:
            self._bom_checked = True  # fewer than 3 bytes in the whole body: not a BOM
        if self._partial:
            self._line(bytes(self._partial), out)
            self._partial.clear()
        if not self._pending.empty():
            self._dispatch(out, terminated=False)
        return out

    def _strip_bom(self, data: bytes) -> tuple[bytes, int] | None:
        """Hold bytes until the first three are known; drop a leading UTF-8 BOM (PROTOCOLS.md 5.1).

        Returns the body so far and where its first line starts, or None while still undecided.
        """
        head = bytes(self._partial) + data
        if len(head) < len(_BOM) and _BOM.startswith(head):
            self._partial = bytearray(head)
            return None
        self._bom_checked = True
        self._partial.clear()
        skip = len(_BOM) if head.startswith(_BOM) else 0
        self._partial_offset = skip
        return head, skip

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        """Process one complete line (without its terminator)."""
        if not raw:
            if not self._pending.empty():
                self._dispatch(out, terminated=True)
            return
        if self.max_line is not None and len(raw) > self.max_line:
            self.overflow = True
            return
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            line = raw.decode("utf-8", errors="replace")
            if line[0] != ":":
                self._pending.invalid_utf8 = True
        if line[0] == ":":
            self._comments.append(line[1:].removeprefix(" "))
            return
        self._field(line)

    def _field(self, line: str) -> None:
        """Apply one ``name:value`` line to the pending event."""
        p = self._pending
        if p.offset < 0:
            p.offset = self._partial_offset
        p.lines.append(line)
        name, colon, value = line.partition(":")
        spaced = value.startswith(" ")
        if spaced:
            value = value[1:]
        if name == "data":
            p.data.append(value)
            p.no_space = p.no_space or (bool(colon) and not spaced and value != "")
        elif name == "event":
            p.event = value
        elif name == "error":
            p.error = value if p.error is None else p.error + "\n" + value
        elif name == "id":
            if "\x00" not in value:
                self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        elif "\ufffd" in name or _near_data(name) or value.lstrip()[:1] in ("{", "["):
            self.corrupt_fields += 1  # a chunk under a field name no upstream sends: a corrupted data line

    def _dispatch(self, out: list[SSEEvent], *, terminated: bool) -> None:
        """Emit the pending event if it carries data or an ``error:`` field, then reset."""
        p = self._pending
        self._pending = _Pending()
        if not p.data and p.error is None:
            return  # spec: empty data buffer => nothing dispatched (e.g. ``event: ping``)
        out.append(
            SSEEvent(
                data="\n".join(p.data),
                offset=max(p.offset, 0),
                frame=self._frames,
                event=p.event or "message",
                raw="\n".join(p.lines),
                no_space=p.no_space,
                comments=tuple(self._comments),
                error=p.error,
                has_data=bool(p.data),
                terminated=terminated,
                id=self._last_id,
                retry=self._retry,
                invalid_utf8=p.invalid_utf8,
            )
        )
        self._comments = []
        self._frames += 1


def _near_data(name: str) -> bool:
    """True when a field name is one edit from ``data`` (``dta``, ``daat``, ``dataa``): a corrupted data line."""
    if name == "data" or not 3 <= len(name) <= 5:
        return False
    if len(name) == 4:
        diff = [i for i in range(4) if name[i] != "data"[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and name[diff[0]] == "data"[diff[1]] and name[diff[1]] == "data"[diff[0]])
    short, long = (name, "data") if len(name) == 3 else ("data", name)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def _dumps(obj: Any) -> str:
    """Compact ASCII JSON (PROTOCOLS.md 0.7: one document per data line, ``ensure_ascii``)."""
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"))


def encode_data(obj: Any) -> bytes:
    """``data: <json>\\n\\n`` for one JSON value (OpenAI Chat / Responses frames)."""
    return b"data: " + _dumps(obj).encode("ascii") + b"\n\n"


def encode_done() -> bytes:
    """The OpenAI Chat terminator ``data: [DONE]\\n\\n`` (PROTOCOLS.md 1.5)."""
    return b"data: [DONE]\n\n"


def encode_comment(text: str) -> bytes:
    """An SSE comment ``: <text>\\n\\n`` (keep-alive, PROTOCOLS.md 0.6); line breaks become spaces."""
    clean = text.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
    return b": " + clean.encode("utf-8") + b"\n\n"


def encode_event(name: str, obj: Any) -> bytes:
    """``event: <name>\\ndata: <json>\\n\\n`` (Anthropic Messages frames, PROTOCOLS.md 0.2)."""
    clean = name.replace("\r", "").replace("\n", "")
    return b"event: " + clean.encode("utf-8") + b"\n" + encode_data(obj)
