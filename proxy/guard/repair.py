"""Deterministic, policy-gated repairs of tool-call names and argument texts.

Every repair here is exact: it either recovers the value the model meant, unambiguously, or does
nothing. There is no heuristic JSON completion (a truncated call must never become an executable
one, C24). Callers report each applied repair as a finding (``proxy.guard.validate``).
"""

from __future__ import annotations

import re

from proxy.guard.policy import GuardPolicy, Repair

#: Chat-template namespaces models prepend to function names (C46: ``functions.run_shell``;
#: Gemini's ``default_api.``; ``tools.`` / ``tool.`` from Hermes-style templates).
NAME_PREFIXES = ("functions.", "default_api.", "tools.", "tool.")
#: Kimi K2's tool-call id shape leaking into the name: ``functions.get_weather:0``.
_KIMI_SUFFIX = re.compile(r":\d+\Z")


def resolve_name(name: str, names: frozenset[str], policy: GuardPolicy) -> str | None:
    """Map a called ``name`` onto a declared tool name, or None when it is not one.

    Exact match first. Else, when ``Repair.NAME_PREFIX`` is allowed, strip surrounding whitespace,
    a Kimi ``:<n>`` suffix and one well-known template prefix (``NAME_PREFIXES``); the result is
    used only if exactly one candidate is declared (C46: ``functions.run_shell`` -> ``run_shell``,
    ``toolbox.web.answer`` -> None).
    """
    if name in names:
        return name
    if not policy.allows(Repair.NAME_PREFIX):
        return None
    matches = {c for c in _name_candidates(name) if c in names}
    return matches.pop() if len(matches) == 1 else None


def _name_candidates(name: str) -> set[str]:
    """Every spelling ``name`` may reduce to after the allowed strips (itself excluded)."""
    bare = _KIMI_SUFFIX.sub("", name.strip())
    found = {name.strip(), bare}
    for prefix in NAME_PREFIXES:
        if bare.startswith(prefix):
            found.add(bare[len(prefix):])
    found.discard(name)
    return found
