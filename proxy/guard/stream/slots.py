"""Tool-call slots: the argument fragments of one call with their incremental views, and slot names.

A *slot* is one tool call being assembled from deltas (``proxy.guard.stream.slot_table`` decides which slot
a delta belongs to). ``Args`` keeps the raw fragment list and two incremental views of it, plain
concatenation and a cumulative-snapshot chain (C14), so the end can decide what the fragments mean.
Sans-IO; nothing here raises on any input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from proxy.guard.checks.repair import parse_arguments, resolve_name
from proxy.guard.policy import GuardPolicy, Repair
from proxy.guard.stream.jsonprefix import DEAD, OPAQUE, JsonPrefix
from proxy.guard.stream.residue import only_markup

_ABSENT = ("", "null")


def ident(value: Any) -> str | None:
    """An identity field's value, or None when absent (``None``, ``""``, ``"null"``, non-strings)."""
    if isinstance(value, str) and value not in _ABSENT:
        return value
    return None


@dataclass(frozen=True, slots=True)
class SlotClosed:
    """Slot ``slot`` of ``choice`` has complete arguments and a later slot opened (or the choice finished)."""

    choice: int
    slot: int
    by_finish: bool = False  # closed by the choice's finish_reason rather than by a later slot


class Args:
    """The argument fragments of one slot, with incremental views: concatenation and snapshot chain."""

    __slots__ = ("frags", "concat", "snap", "last", "chain", "nonblank", "had_object", "had_string", "_checked")

    def __init__(self) -> None:
        self.frags: list[str] = []
        self.concat = JsonPrefix()
        self.snap: JsonPrefix | None = JsonPrefix()  # None once a fragment is not a prefix extension
        self.last = ""  # the latest non-empty fragment (snapshot mode's current value)
        self.chain = 0  # non-empty fragments in the snapshot chain
        self.nonblank = 0
        self.had_object = False
        self.had_string = False
        self._checked: tuple[int, bool] = (-1, True)  # (fragments seen, whether the concatenation parsed)

    def add(self, frag: str) -> None:
        """Append one fragment, advancing both views."""
        self.frags.append(frag)
        if not frag:
            return
        values = self.concat.values
        self.concat.feed(frag)
        if self.concat.values != values and len(split_values(self.text)[0]) < self.concat.values - 1:
            self.concat.state = DEAD  # a second value began after one that is not JSON after all
        if frag.strip():
            self.nonblank += 1
        self._advance_snapshot(frag)

    def _advance_snapshot(self, frag: str) -> None:
        if self.snap is None:
            return
        if not self.last or frag.startswith(self.last):
            self.snap.feed(frag[len(self.last):])
            self.last = frag
            self.chain += 1
        else:
            self.snap = None

    @property
    def text(self) -> str:
        """The plain concatenation."""
        return "".join(self.frags)

    @property
    def snapshot_mode(self) -> bool:
        """True when >= 2 non-empty fragments each extended the previous one (C14)."""
        return self.snap is not None and self.chain >= 2

    def _concat_complete(self) -> bool:
        """The concatenation's structural completeness, trusted in snapshot mode only when it parses.

        ``JsonPrefix`` tracks strings and nesting, not grammar: snapshots ``{"`` then ``{"city": " }``
        concatenate to ``{"{"city": " }``, balanced but not JSON. While every fragment extends the
        previous one the snapshot chain is the likelier reading, so a balanced concatenation that does
        not parse must not close the slot (the next snapshot would open a call of its own). Parsed
        once per fragment count."""
        if not self.concat.complete:
            return False
        if not self.snapshot_mode:
            return True
        seen, ok = self._checked
        if seen != len(self.frags):
            ok = parses(self.text)
            self._checked = (len(self.frags), ok)
        return ok

    @property
    def complete(self) -> bool:
        """True when some interpretation already forms a complete JSON object/array."""
        return self._concat_complete() or (self.snapshot_mode and self.snap is not None and self.snap.complete)

    @property
    def dead(self) -> bool:
        """True when no interpretation (concatenation, snapshots) can become valid JSON any more."""
        return self.concat.dead and (self.snap is None or self.snap.dead)

    @property
    def blank(self) -> bool:
        """True when no non-whitespace fragment arrived."""
        return self.nonblank == 0

    def current(self) -> str:
        """The text the arguments amount to now (C14: last snapshot when concatenation fails)."""
        if not self.snapshot_mode or self._concat_complete():
            return self.text
        if self.concat.state == OPAQUE and parses(self.text):
            return self.text
        return self.last if self.snap is not None and self.snap.complete else self.text

    def finished(self, policy: GuardPolicy) -> bool:
        """True when the arguments amount to JSON now (directly or after an allowed repair)."""
        return self.blank or self.complete or parse_arguments(self.current(), policy).ok \
            or (policy.allows(Repair.MISSING_BRACE) and parse_arguments(braced(self.text), policy).ok)

    def parsed(self) -> Any:
        """The current text parsed leniently, or a sentinel ``NOT_JSON``."""
        return loads_lenient(self.current())


class _NotJson:
    pass


NOT_JSON: Any = _NotJson()


_DECODER = json.JSONDecoder(strict=False)  # one instance: json.loads(strict=False) builds one per call


def loads_lenient(text: str) -> Any:
    """``text`` (stripped) parsed as JSON with raw control characters allowed, else ``NOT_JSON``."""
    try:
        return _DECODER.decode(text.strip())
    except (ValueError, RecursionError):
        return NOT_JSON


def braced(text: str) -> str:
    """``text`` with the opening brace it lacks (``'"city": "Paris"}'`` -> ``'{"city": "Paris"}'``), else
    ``text`` unchanged: the *missing opening brace* argument reading (``proxy.guard.stream.assemble``)."""
    body = text.lstrip()
    return "{" + body if body.startswith('"') and body.rstrip().endswith("}") else text


def split_values(text: str) -> tuple[list[str], str]:
    """``text`` as a sequence of complete JSON values (whitespace between them): their texts, and the
    rest that is not (yet) one. ``'{"a":1} {"a":1}'`` -> ``(['{"a":1}', '{"a":1}'], '')``."""
    out: list[str] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n":
            pos += 1
        if pos >= n:
            return out, ""
        try:
            _, end = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return out, text[pos:]
        out.append(text[pos:end])
        pos = end


def parses(text: str) -> bool:
    """True when ``text`` parses leniently (``loads_lenient``)."""
    return loads_lenient(text) is not NOT_JSON


@dataclass(slots=True)
class Slot:
    """One tool call being assembled."""

    position: int
    id: str | None = None
    names: list[str] = field(default_factory=list)
    args: Args = field(default_factory=Args)
    extra: dict[str, Any] = field(default_factory=dict)
    opened_nameless: bool = False
    closed: bool = False
    minted: bool = False
    pending: tuple[str | None, str] | None = None  # (id, name) of a header re-sent after complete args
    # A later complete value at this slot's index opened a new slot with no header of its own: the two
    # are one assembly group (``proxy.guard.stream.assemble``: a repeat, a placeholder then the real value, or
    # separate calls), decided at the end; ``follows`` is the group head's position.
    followed: bool = False
    follows: int | None = None

    def add_name(self, name: str) -> bool:
        """Record a name fragment; True when it repeats the accumulated name."""
        repeat = bool(self.names) and name == "".join(_dedup_names(self.names))
        self.names.append(name)
        return repeat


def _dedup_names(frags: list[str]) -> list[str]:
    """Continue's rule (C06): append a fragment unless it equals the name accumulated so far."""
    out: list[str] = []
    acc = ""
    for f in frags:
        if f != acc:
            out.append(f)
            acc += f
    return out


def resolve_slot_name(frags: list[str], names: frozenset[str], policy: GuardPolicy) -> str:
    """The name a slot's fragments amount to (C03 repeats, C06 splits, snapshots, set-once).

    Candidates in order, the first that is (or resolves to) a declared tool wins: the
    repeat-collapsed concatenation, the last of a prefix-extension chain, the first fragment.
    With no declared match the collapsed concatenation is returned (validation rejects it).
    """
    if not frags:
        return ""
    joined = "".join(_dedup_names(frags))
    chain = all(b.startswith(a) for a, b in zip(frags, frags[1:], strict=False))
    for cand in (joined, frags[-1] if chain else None, frags[0]):
        if cand and resolve_name(cand, names, policy) is not None:
            return cand
    return joined



def valid_index(index: Any) -> bool:
    """True for a usable tool-call index: a non-negative int, or the legacy ``function_call`` slot key."""
    return (isinstance(index, int) and not isinstance(index, bool) and index >= 0) or index == "function_call"


def argument_fragment(value: Any) -> tuple[str | None, bool]:
    """An arguments value as text: strings as is; objects/arrays/scalars serialised (C13)."""
    if value is None:
        return None, False
    if isinstance(value, str):
        return value, False
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")), True
    except (TypeError, ValueError, RecursionError):
        return None, False


def trailing_residue(frag: str) -> bool:
    """Whitespace, a closing code fence (C23) or only dialect markup (``residue.only_markup``) after
    complete arguments, not a new value."""
    return not frag.strip(" \t\r\n`") or only_markup(frag)
