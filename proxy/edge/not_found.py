"""The 404 of a path toolrelay does not serve: in the caller's protocol, naming the nearest right path.

A client pointed at the wrong base URL calls ``/chat/completions`` (no ``/v1``), ``/v1/v1/messages``
(``/v1`` twice) or ``/v1/chat/completion`` (a typo). Instead of a bare "not found" it gets a JSON error
in its own protocol (Anthropic's shape when the request carries ``anthropic-version``, or
``x-api-key`` without a bearer token on a messages-like path; OpenAI's otherwise) that names the
path it meant (``difflib`` against the paths served) and what the base URL should be. Pure
functions over the ASGI scope.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

#: The paths toolrelay serves (``proxy.edge.routing``), with the method each takes.
SERVED = {"/v1/chat/completions": "POST", "/v1/messages": "POST", "/v1/messages/count_tokens": "POST",
          "/v1/responses": "POST", "/v1/models": "GET"}
ANTHROPIC_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
#: Paths outside ``/v1`` that clients hit when their base URL lacks it (routed here by ``proxy.edge.routing``).
BARE_PATHS = ("chat/completions", "completions", "messages", "messages/count_tokens", "responses", "models")
_CUTOFF = 0.6


def _header(scope: Mapping[str, Any], name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return ""


def _candidates(path: str) -> list[str]:
    """``path`` and what it would be with the common base-URL mistakes undone."""
    clean = "/" + "/".join(part for part in path.split("/") if part)
    out = [clean]
    while clean.startswith("/v1/v1/") or clean == "/v1/v1":
        clean = clean[3:]
        out.append(clean)
    if not clean.startswith("/v1/"):
        out.append("/v1" + clean)
    return out


def nearest(path: str) -> str | None:
    """The served path ``path`` most likely meant, or None when nothing is close."""
    best: tuple[float, str] | None = None
    for candidate in _candidates(path):
        for match in difflib.get_close_matches(candidate.lower(), SERVED, n=1, cutoff=_CUTOFF):
            score = difflib.SequenceMatcher(None, candidate.lower(), match).ratio()
            if best is None or score > best[0]:
                best = (score, match)
    return best[1] if best else None


def speaks_anthropic(scope: Mapping[str, Any], meant: str | None) -> bool:
    """True when the caller looks like an Anthropic client: ``anthropic-version``, or ``x-api-key``
    without a bearer token on a path that means a messages endpoint."""
    if _header(scope, b"anthropic-version"):
        return True
    bearer = _header(scope, b"authorization").lower().startswith("bearer ")
    return bool(_header(scope, b"x-api-key")) and not bearer and meant in ANTHROPIC_PATHS


def message(method: str, path: str, meant: str | None) -> str:
    """The error sentence: what was asked, the path meant and, for a base-URL mistake, the fix."""
    said = f"toolrelay serves no {method} {path[:200]}"
    if meant is None:
        return f"{said}; it serves {', '.join(f'{m} {p}' for p, m in SERVED.items())}"
    hint = ""
    clean = _candidates(path)[0]
    if not clean.startswith("/v1/"):
        hint = (" (OpenAI clients take a base URL ending in /v1, e.g. https://relay.example.com/v1; "
                "Anthropic clients one without it)")
    elif clean.startswith("/v1/v1"):
        hint = " (the base URL ends in /v1 and the client adds /v1 again: drop one)"
    return f"{said}; did you mean {SERVED[meant]} {meant}?{hint}"
