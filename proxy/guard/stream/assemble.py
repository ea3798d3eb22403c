"""Argument assembly by the schema (issue 12, item 2): what a tool-call slot's raw fragments mean.

The rule. A slot keeps its raw argument fragments (``proxy.guard.stream.slots.Args.frags``; object-valued
fragments serialised, C13). At the end of the call the few assemblies a real stream can mean are
tried, in this order:

1. **plain concatenation** -- the protocol's meaning (PROTOCOLS.md 1.3: ``arguments`` deltas are
   appended). When it parses to a JSON object the declared schema accepts, it wins and nothing else
   is tried, so a clean stream costs one parse and one validation;
2. **cumulative snapshots** -- every non-empty fragment extends the previous one (C14): the last;
3. **several complete values** in the slot (one fragment ``{...}{...}``, or a bare new value at the
   slot's index that opened a headerless slot, ``proxy.guard.stream.slot_table``), read as
   - *a complete value repeated* (all equal, C15): one call -- unless the upstream sent as many ids
     as values and the request allows parallel calls, then *separate calls*;
   - *a placeholder then the real value*: every value but the last is ``{}`` or not accepted by the
     schema, the last is: the last;
   - *separate calls*: distinct values, each accepted, as many ids as values, parallel calls allowed.

Beyond these, the readings of a slot's text by the reading rule (``proxy.guard.reading``, issue 20):

4. **a missing opening brace** (``'"city": "Paris"}'``): the text with ``{`` added, when
   ``Repair.MISSING_BRACE`` is allowed. A missing *closing* character is not a reading: it cannot be
   told from a truncated call (C24), which must never become an executable one;
5. **fused calls** (``{...}{...}`` or ``{...}read_file{...}`` in one slot, one id): one call per value,
   the first the slot's tool, each later one the tool named between the values or, when no name is
   there, the one declared tool whose schema accepts the value; only with parallel calls allowed and
   distinct values (equal values are *a complete value repeated*).

An assembly survives when every call it yields parses to an object the schema accepts (after the
policy's repairs, ``proxy.guard.checks.repair.parse_arguments``). Survivors are compared by value
(identical objects count once). One survivor: taken, with a finding naming it and the rejected
alternatives. None, or several different ones: the caller retries (``AMBIGUOUS_ARGUMENTS`` for
several; for none the plain concatenation goes to validation, which names what is wrong). Never a
guess. Object-valued arguments are read the same way (each object fragment is one complete value);
string and object fragments mixed in one slot stay fatal (``proxy.guard.stream.choice``). The same call in
two channels (a slot and leaked markup, or ``function_call`` and ``tool_calls``) is counted once by
the resolver (``proxy.guard.stream.resolve``).

Early abort follows the same rule: a slot is provably broken only when no assembly can still
become valid (``Args.dead``: the concatenation, read as a sequence of values, and the snapshot
chain are both dead). Sans-IO; nothing here raises on any input.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.guard.checks.repair import parse_arguments
from proxy.guard.policy import GuardPolicy, Repair
from proxy.guard.stream.slots import _DECODER, braced, split_values

#: Is this parsed argument object valid for the call's declared tool? (``validate.arguments_accepted``)
Accepts = Callable[[dict[str, Any]], bool]

CONCATENATION = "plain concatenation"
SNAPSHOTS = "cumulative snapshots"
REPEATED = "a complete value repeated"
PLACEHOLDER = "a placeholder then the real value"
SEPARATE = "separate calls"
BRACE = "missing opening brace"
FUSED = "fused calls"


@dataclass(frozen=True, slots=True)
class Assembly:
    """One reading of a slot's fragments: ``how`` (one of the names above), the argument text of each
    call it yields (``texts``) and their parsed objects (``values``; empty when the reading failed)."""

    how: str
    texts: tuple[str, ...]
    values: tuple[dict[str, Any], ...] = ()
    names: tuple[str, ...] = ()  # FUSED: the declared tool of each call after the first

    @property
    def valid(self) -> bool:
        """True when every call of this reading parsed to an accepted object."""
        return len(self.values) == len(self.texts)


@dataclass(slots=True)
class Outcome:
    """What ``assemble`` decided: ``chosen`` (None: none or several survived), the ``survivors``
    (distinct by value) and every reading tried (``tried``, in order)."""

    chosen: Assembly | None
    survivors: list[Assembly] = field(default_factory=list)
    tried: list[Assembly] = field(default_factory=list)

    @property
    def ambiguous(self) -> bool:
        """True when several different readings survived: retry, never a guess."""
        return self.chosen is None and len(self.survivors) > 1

    def rejected(self) -> str:
        """The readings not taken, for the finding's detail (``how: why``)."""
        out = []
        for a in self.tried:
            if a is not self.chosen:
                out.append(f"{a.how}: {'also valid' if a.valid else 'not valid for the schema'}")
        return "; ".join(out)


def assemble(frags: Sequence[str], accepts: Accepts, policy: GuardPolicy, *, ids: int = 1,
             parallel: bool = True, tools: Callable[[str | None, dict[str, Any]], tuple[str, ...]] | None = None
             ) -> Outcome:
    """Decide what one slot's argument ``frags`` mean (module docstring).

    ``accepts`` says whether a parsed object is valid for the declared tool; ``ids`` is the number
    of distinct tool-call ids the upstream sent for it; ``parallel`` whether the request allows
    parallel calls; ``tools(name, value)``: the declared tools ``name`` (None: any) can mean whose
    schema accepts ``value`` (for *fused calls*; None: that reading is not tried). Returns the
    ``Outcome``; ``chosen.texts`` are the argument texts to validate (``chosen.names`` for FUSED).
    """
    text = "".join(frags)
    plain = _reading(CONCATENATION, (text,), accepts, policy)
    if plain.valid:
        return Outcome(plain, [plain], [plain])
    tried = [plain]
    nonempty = [f for f in frags if f]
    if len(nonempty) >= 2 and all(b.startswith(a) for a, b in zip(nonempty, nonempty[1:], strict=False)):
        tried.append(_reading(SNAPSHOTS, (nonempty[-1],), accepts, policy))
    values, rest = split_values(text)
    if len(values) >= 2 and not rest.strip(" \t\r\n`"):
        tried += sequence_readings(values, accepts, policy, ids=ids, parallel=parallel)
    if policy.allows(Repair.MISSING_BRACE) and (b := braced(text)) != text:
        tried.append(_reading(BRACE, (b,), accepts, policy))
    if tools is not None and parallel and ids <= 1:
        tried += fused_reading(text, accepts, tools, policy)
    return decide(tried)


#: The most calls one slot is read as (fused calls).
MAX_FUSED = 16
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def split_fused(text: str) -> list[tuple[str | None, str]] | None:
    """``text`` as fused calls: (the name written before the value or None, the value's text) per value;
    None unless it is 2 to ``MAX_FUSED`` JSON objects with at most a bare name between two of them."""
    out: list[tuple[str | None, str]] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n":
            pos += 1
        if pos >= n:
            return out if 2 <= len(out) <= MAX_FUSED else None
        name = None
        if out and (m := _NAME.match(text, pos)) is not None:
            name, pos = m.group(), m.end()
            while pos < n and text[pos] in " \t\r\n":
                pos += 1
        if pos >= n or text[pos] != "{" or len(out) >= MAX_FUSED:
            return None
        try:
            _, end = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return None
        out.append((name, text[pos:end]))
        pos = end


def fused_reading(text: str, accepts: Accepts, tools: Callable[[str | None, dict[str, Any]], tuple[str, ...]],
                  policy: GuardPolicy) -> list[Assembly]:
    """The *fused calls* readings of ``text`` (module docstring): one per way of naming the later calls
    (a later value several declared tools accept gives several readings, so the attempt is retried);
    none when the text is not fused calls; one invalid reading (no ``values``) when a value is not
    accepted or has no tool, or the values are all equal and unnamed (that is *a complete value repeated*)."""
    pieces = split_fused(text)
    if pieces is None:
        return []
    texts = tuple(t for _, t in pieces)
    first = _accepted(texts[0], accepts, policy)
    if first is None:
        return [Assembly(FUSED, texts)]
    values, options = [first], []
    for name, t in pieces[1:]:
        parsed = parse_arguments(t, policy)
        found = tools(name, parsed.value) if parsed.ok and isinstance(parsed.value, dict) else ()
        if not found:
            return [Assembly(FUSED, texts)]
        values.append(parsed.value)
        options.append(found)
    if len({_key(v) for v in values}) == 1 and not any(name for name, _ in pieces):
        return [Assembly(FUSED, texts)]
    return [Assembly(FUSED, texts, tuple(values), names)
            for names in itertools.islice(itertools.product(*options), MAX_FUSED)]


def sequence_readings(values: Sequence[str], accepts: Accepts, policy: GuardPolicy, *, ids: int,
                      parallel: bool) -> list[Assembly]:
    """The readings of several complete values (texts) in one slot or assembly group."""
    parsed = [_accepted(v, accepts, policy) for v in values]
    keys = [_key(p) if p is not None else None for p in parsed]
    separate_allowed = parallel and ids >= len(values)
    out: list[Assembly] = []
    if keys[0] is not None and all(k == keys[0] for k in keys):
        if separate_allowed:
            return [_reading(SEPARATE, tuple(values), accepts, policy)]
        return [_reading(REPEATED, (values[0],), accepts, policy)]
    if all(p is None or p == {} for p in parsed[:-1]):
        out.append(_reading(PLACEHOLDER, (values[-1],), accepts, policy))
    if separate_allowed and all(p for p in parsed):
        out.append(_reading(SEPARATE, tuple(values), accepts, policy))
    return out


def decide(tried: list[Assembly]) -> Outcome:
    """The unique survivor by value among ``tried`` (Outcome.chosen None: none or several)."""
    survivors: list[Assembly] = []
    seen: set[tuple[str, ...]] = set()
    for a in tried:
        if not a.valid:
            continue
        key = (*(_key(v) for v in a.values), *a.names)
        if key not in seen:
            seen.add(key)
            survivors.append(a)
    return Outcome(survivors[0] if len(survivors) == 1 else None, survivors, tried)


def _reading(how: str, texts: tuple[str, ...], accepts: Accepts, policy: GuardPolicy) -> Assembly:
    values = []
    for t in texts:
        v = _accepted(t, accepts, policy)
        if v is None:
            return Assembly(how, texts)
        values.append(v)
    return Assembly(how, texts, tuple(values))


def _accepted(text: str, accepts: Accepts, policy: GuardPolicy) -> dict[str, Any] | None:
    """``text`` parsed (with the policy's repairs) to an object the schema accepts, else None."""
    parsed = parse_arguments(text, policy)
    if not parsed.ok or not isinstance(parsed.value, dict):
        return None
    try:
        return parsed.value if accepts(parsed.value) else None
    except Exception:  # noqa: BLE001 -- a schema that fails at validation time accepts nothing here
        return None


def _key(value: Any) -> str:
    """A canonical text of a parsed value, to compare survivors by value."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)
