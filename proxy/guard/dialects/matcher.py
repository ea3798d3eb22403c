"""One combined scan for every dialect's opener: a single compiled regex per process.

``find(text, pos)`` returns the leftmost opener (and its dialect) or the start of a *possible*
opener at the very end of the text (a proper prefix of one, to be held back). The regex is one
alternation of all openers (longest first) plus one alternation of their proper prefixes anchored
at the end, so the cost of a text delta does not grow with the number of families: ``re`` skips
to the openers' first characters and tries the alternatives only there. DeepSeek's ``｜`` / ``▁``
(and ``‖``) spellings are character classes of the same regex, not a separate pass.
"""

from __future__ import annotations

import re

from proxy.guard.dialects.base import Dialect
from proxy.guard.dialects.registry import DIALECTS
from proxy.guard.dialects.tokens import NORM

_FUZZY = {"|": "[|｜‖]", "_": "[_▁]"}
_FUZZY_CHARS = {"|": "｜‖", "_": "▁"}


def _atoms(opener: str, fuzzy: bool) -> list[str]:
    return [_FUZZY[c] if fuzzy and c in _FUZZY else re.escape(c) for c in opener]


def _prefixes(atoms: list[str]) -> str:
    """A regex for every proper prefix of an opener: ``a1(?:a2(?:…)?)?`` over its atoms."""
    pattern = ""
    for atom in reversed(atoms[:-1]):
        pattern = atom + (f"(?:{pattern})?" if pattern else "")
    return pattern


def _build() -> tuple[re.Pattern[str], dict[str, re.Pattern[str]], dict[str, Dialect], frozenset[str],
                      dict[str, tuple[tuple[str, Dialect], ...]], frozenset[str], frozenset[str]]:
    """The first-character filter, one opener regex per first two characters, the opener tables.

    Symbol openers (``<tool_call>``, ``[TOOL_CALLS]``) are found by their first two characters
    (``<b`` of HTML costs one dictionary look-up). A word opener (``functools``, ``to``, ``call``,
    ``Action``) is found by the character its body starts with (``Dialect.anchor``) preceded by
    the word at a word start: prose letters never cost a regex attempt.
    """
    openers: dict[str, Dialect] = {}
    by_pair: dict[str, tuple[list[str], list[str]]] = {}
    words: dict[str, list[tuple[str, Dialect]]] = {}
    for d in DIALECTS:
        for opener in d.openers:
            if d.word:
                if not opener.isalpha() or not d.anchor:
                    raise ValueError(f"word opener {opener!r} needs letters only and an anchor")
                words.setdefault(d.anchor, []).append((opener, d))
                continue
            if opener[0].isalnum() or len(opener) < 2:
                raise ValueError(f"opener {opener!r}: a symbol opener of two or more characters, or a word opener")
            openers.setdefault(opener, d)
            atoms = _atoms(opener, d.fuzzy)
            seconds = [opener[1]] + (list(_FUZZY_CHARS[opener[1]]) if d.fuzzy and opener[1] in _FUZZY_CHARS else [])
            for second in seconds:
                full, partial = by_pair.setdefault(opener[0] + second, ([], []))
                full.append("".join(atoms))
                partial.append(_prefixes(atoms))
    tables = {}
    for pair, (full, partial) in by_pair.items():
        ordered = sorted(set(full), key=len, reverse=True)
        tables[pair] = re.compile("(?P<o>" + "|".join(ordered) + ")|(?P<p>(?:" + "|".join(partial) + "))\\Z")
    firsts = {p[0] for p in by_pair}
    chars = "".join(re.escape(c) for c in sorted(firsts | set(words)))
    proper = frozenset(o[:i] for o in openers for i in range(1, len(o)))
    held = frozenset(w[:i] for ws in words.values() for w, _ in ws for i in range(1, len(w) + 1))
    return (re.compile(f"[{chars}]"), tables, openers, proper,
            {k: tuple(sorted(v, key=lambda x: -len(x[0]))) for k, v in words.items()}, held, frozenset(firsts))


_FIRST, _BY_PAIR, OPENERS, _PROPER, _WORDS, _WORD_PREFIXES, _SYMBOL_FIRSTS = _build()
_LETTERS = "".join(sorted({c for p in _WORD_PREFIXES for c in p}))


#: ``(start, end, dialect)``: an opener at ``start:end``, or (``dialect`` None) a possible opener
#: from ``start`` to the end of the text, to be held back. A plain tuple: this is the hot path.
Hit = tuple[int, int, "Dialect | None"]


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def find(text: str, before: str = "") -> Hit | None:
    """The leftmost opener or possible opener in ``text``; ``before`` is the character released
    just before it (word openers must start a word).

    One character-class search finds the next place an opener could start; only there is that
    character's opener regex (and the word openers anchored on it) tried.
    """
    pos = 0
    while True:
        c = _FIRST.search(text, pos)
        if c is None:
            return held_word(text, before)
        start = c.start()
        ch = text[start]
        for word, dialect in _WORDS.get(ch, ()):
            at = start - len(word)
            if at >= 0 and text.startswith(word, at) and not _word(text[at - 1] if at else before or " "):
                return (at, start, dialect)
        if ch in _SYMBOL_FIRSTS:
            if start + 1 == len(text):
                return (start, len(text), None)  # a lone first character at the end may open one
            table = _BY_PAIR.get(text[start : start + 2])
            m = table.match(text, start) if table is not None else None
            if m is not None:
                if m.lastgroup == "p":
                    return (start, len(text), None)
                key = m.group().translate(NORM)
                if m.end() == len(text) and key in _PROPER:
                    return (start, len(text), None)
                return (start, m.end(), OPENERS[key])
        pos = start + 1


def held_word(text: str, before: str = "") -> Hit | None:
    """A trailing word that may still become a word opener (``fun`` of ``functools``): held back."""
    if not text or text[-1] not in _LETTERS:
        return None
    tail = text[-16:]
    stem = tail.rstrip(_LETTERS)
    n = len(tail) - len(stem)
    if tail[len(stem) :] not in _WORD_PREFIXES:
        return None
    prev = stem[-1] if stem else (text[-n - 1] if len(text) > n else before)
    if prev and (prev.isalnum() or prev == "_"):
        return None
    return (len(text) - n, len(text), None)
