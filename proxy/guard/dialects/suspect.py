"""Call-like text that no dialect recognised: a declared tool name next to call syntax.

Released text is scanned once at the end of a channel for a declared tool's name used the way
tool-call syntaxes use it: ``name(arg=`` / ``name({``, ``"name": "tool"``, ``<tool>`` tags,
``name="tool"`` attributes, ``functions.tool``, ``tool{"`` / ``tool[ARGS]``, ``"tool": {``. Each
hit becomes an ``unrecognized-markup`` finding (non-fatal: the text was delivered as text), so a
family the library does not know yet shows up in the audit the first day a model emits it.
"""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=256)
def _pattern(names: tuple[str, ...]) -> re.Pattern[str] | None:
    if not names:
        return None
    n = "(?:" + "|".join(re.escape(x) for x in sorted(names, key=len, reverse=True)) + ")"
    forms = [
        rf"(?<![\w.]){n}\s*\(\s*(?:\)|[A-Za-z_]\w*\s*[=:]|[\"'{{\[\d])",
        rf"[\"'](?:name|tool_name|function|tool|function_name|recipient)[\"']\s*:\s*[\"'](?:functions\.)?{n}[\"']",
        rf"<\s*/?\s*{n}(?=[\s>/])",
        rf"\b(?:name|tool|tool_name|function|recipient)\s*=\s*[\"']?(?:functions\.)?{n}[\"'>\s]",
        rf"(?:functions\.|to=|call:){n}\b",
        rf"(?<![\w.]){n}(?:\[ARGS\]|\s*\{{\s*[\"\w])",
        rf"[\"']{n}[\"']\s*:\s*\{{",
    ]
    return re.compile("|".join(f"(?:{f})" for f in forms))


def suspicious(text: str, names: frozenset[str], limit: int = 5) -> list[tuple[int, int]]:
    """Up to ``limit`` (start, end) spans of ``text`` where a declared tool looks called.

    The regex runs only in windows around the places a declared name occurs (found with
    ``str.find``), so text that never names a tool costs one substring search per name.
    """
    pattern = _pattern(tuple(sorted(names)))
    if pattern is None or not text:
        return []
    spans: set[tuple[int, int]] = set()
    for name in names:
        at = text.find(name)
        while at >= 0 and len(spans) < limit:
            end = at + len(name)
            for m in pattern.finditer(text, max(0, at - _REACH), min(len(text), end + _REACH)):
                if m.start() < end and m.end() > at:  # the match is about this occurrence
                    spans.add((m.start(), m.end()))
            at = text.find(name, end)
    return sorted(spans)[:limit]


#: How far around a tool's name the call syntax is looked for (characters).
_REACH = 40
