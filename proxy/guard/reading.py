"""The one reading rule (issue 20, item 1), written down once for every layer of the guard.

An upstream stream can mean more than one thing when it breaks the protocol. At every layer --
*framing* (what an SSE data value holds), *envelope* (ids and choice indexes), *names* (what a called
name is), *arguments* (what a slot's text is) and *text* (what is left of a turn's content) -- the
guard reads it the same way:

1. the **plain reading** (what the protocol says the bytes mean) is tried first; when it is valid it
   wins and nothing else is tried, so a clean stream pays one check;
2. otherwise the layer enumerates its few **candidate readings** (each a named, deterministic
   transformation: strip a special-token suffix, split concatenated JSON values, add the missing
   opening brace, ...), lazily and in a fixed order;
3. a candidate **survives** when it is valid against what the client declared (a declared tool name,
   an argument object the tool's schema accepts, a chunk of the protocol, a stream consistent with one
   generation of an ``n``-choice request); survivors are compared by value (two readings giving the
   same value count once);
4. exactly **one** survivor: it is taken, and the layer records a typed finding naming the reading and
   the readings it rejected (``Read.rejected``); **none or several**: the attempt is retried, never a
   guess. Readings that change a tool call are gated by the tenant's allowed repairs
   (``proxy.guard.policy.GuardPolicy.allows``) as every repair is.

The layers (and their census, docs/dialects.md "Readings"): ``proxy.guard.stream.assemble`` (argument
assemblies, the first user of the rule), ``proxy.guard.checks.repair.read_name`` (names),
``proxy.guard.stream.accumulate`` (framing: ``split_frame``; envelope: the completion id and the choice
index), ``proxy.guard.checks.repair.argument_readings`` (a missing structural character) and
``proxy.guard.stream.markup.strip_residue`` (text). Sans-IO; nothing here raises.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

#: The name of the plain reading (what the protocol says), always tried first.
PLAIN = "plain"


@dataclass(frozen=True, slots=True)
class Reading(Generic[T]):
    """One candidate reading: ``how`` (a short name, used in findings) and the ``value`` it yields."""

    how: str
    value: T


@dataclass(slots=True)
class Read(Generic[T]):
    """What ``read`` decided: ``chosen`` (None: no or several survivors), the ``survivors`` (distinct
    by value) and every reading tried, in order, with whether it was valid (``tried``)."""

    chosen: Reading[T] | None
    survivors: list[Reading[T]] = field(default_factory=list)
    tried: list[tuple[Reading[T], bool]] = field(default_factory=list)

    @property
    def plain(self) -> bool:
        """True when the plain reading won (nothing to report)."""
        return self.chosen is not None and self.chosen.how == PLAIN

    @property
    def ambiguous(self) -> bool:
        """True when several different readings survived: retry, never a guess."""
        return self.chosen is None and len(self.survivors) > 1

    def rejected(self) -> str:
        """The readings not taken, for a finding's detail (``how: why``; '' when none)."""
        out = []
        for r, ok in self.tried:
            if r is not self.chosen:
                out.append(f"{r.how}: {'also valid' if ok else 'not valid'}")
        return "; ".join(out)

    def detail(self, what: str) -> str:
        """A finding sentence: ``what`` read as the chosen reading, and what it rejected."""
        if self.chosen is None:
            names = ", ".join(r.how for r in self.survivors) or "none"
            return f"{what}: no unique reading (valid: {names})"
        rejected = self.rejected()
        return f"{what} read as {self.chosen.how}" + (f" (rejected: {rejected})" if rejected else "")


def read(candidates: Iterable[Reading[T]], valid: Callable[[T], bool],
         key: Callable[[T], Hashable] | None = None) -> Read[T]:
    """Apply the rule (module docstring) to ``candidates`` (the plain reading first, if any).

    ``valid`` says whether a value is valid against what the client declared (an exception counts as
    not valid); ``key`` gives the value's identity for comparing survivors (default: the value itself).
    A first candidate named ``PLAIN`` that is valid wins at once. Returns the ``Read``.
    """
    out: Read[T] = Read(None)
    seen: set[Hashable] = set()
    for i, r in enumerate(candidates):
        try:
            ok = bool(valid(r.value))
        except Exception:  # noqa: BLE001 -- a check that fails accepts nothing
            ok = False
        out.tried.append((r, ok))
        if not ok:
            continue
        if i == 0 and r.how == PLAIN:
            out.chosen = r
            out.survivors.append(r)
            return out
        k = key(r.value) if key is not None else r.value
        try:
            fresh = k not in seen
            seen.add(k)
        except TypeError:  # an unhashable value: compare by its text
            fresh = repr(k) not in seen
            seen.add(repr(k))
        if fresh:
            out.survivors.append(r)
    if len(out.survivors) == 1:
        out.chosen = out.survivors[0]
    return out
