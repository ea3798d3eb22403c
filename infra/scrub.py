"""The one redaction path: secrets out of every string that leaves toolrelay or is stored.

``redact(text, secrets)`` replaces each secret (an upstream credential, an extra header value) by
``[redacted]`` in every spelling an upstream, a library or a log line may give it back in:

- raw, and stripped of surrounding whitespace (an old row may hold ``"sk-…\\n"``; httpx's
  ``Illegal header value b'sk-…\\n'`` shows the stripped form);
- JSON-escaped, character by character in any mixture: ``\\/`` for ``/`` (PHP and some Go
  encoders, RFC 8259 section 7), ``\\uXXXX`` for any character, ``\\"``, ``\\\\``, ``\\n``…;
- URL-encoded (``%XX`` in either case, ``+`` for a space; RFC 3986 section 2.1);
- base64 (standard and URL-safe, with or without padding) of the secret, and of the ``user:pass``
  inside a ``Basic`` header value (RFC 7617);

and any ``Bearer <token>`` / ``Basic <token>`` whatever the token (RFC 6750 section 2.1). Secrets
shorter than ``MIN_SECRET`` characters are not redacted (they would eat ordinary text).

Pure: no Django, no I/O. The compiled form of a secret set is cached, so calling ``redact`` per
text delta costs a few substring tests when nothing matches.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from urllib.parse import quote

REDACTED = "[redacted]"
MIN_SECRET = 4

#: ``Bearer <token>`` (also JSON-escaped ``\\/`` or URL-encoded ``%2F``): redacted when the token
#: looks like one (a digit in 8+ characters, or 20+), so prose such as "bearer tokens" survives.
_BEARER = re.compile(r"(?i)\b(bearer(?:\s|%20|\+)+)([A-Za-z0-9._~+/=\\%-]{8,})")
#: ``Basic <base64>``: redacted when the token decodes to ``user:pass`` (RFC 7617), not "basic idea".
_BASIC = re.compile(r"\b(Basic(?:\s|%20|\+)+)([A-Za-z0-9+/]{6,}={0,2})")
_JSON_SHORT = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
               "\t": "\\t"}


def _hex_ci(text: str) -> str:
    """``text`` as a regex whose hex digits match in either case."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in text)


def _char_pattern(char: str) -> str:
    """Every escaped spelling of one character: itself, JSON escapes, ``%XX``, ``+`` for space."""
    options = [re.escape(char)]
    if char in _JSON_SHORT:
        options.append(re.escape(_JSON_SHORT[char]))
    if ord(char) < 0x10000:
        options.append(re.escape("\\u") + _hex_ci(f"{ord(char):04x}"))
    options.append(_hex_ci(quote(char, safe="")) if quote(char, safe="") != char else _hex_ci(f"%{ord(char):02x}"))
    if char == " ":
        options.append(re.escape("+"))
    return "(?:" + "|".join(options) + ")"


def _base64_forms(value: str) -> set[str]:
    raw = value.encode("utf-8")
    forms = {base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()}
    return forms | {f.rstrip("=") for f in forms}


def _derived(secret: str) -> set[str]:
    """Secrets implied by one: its stripped form, the token of a ``Bearer``/``Basic`` header value,
    a ``Basic`` value's decoded ``user:pass`` and password."""
    found = {secret, secret.strip()}
    scheme, _, token = secret.strip().partition(" ")
    if token and scheme.lower() in ("bearer", "basic"):
        found.add(token.strip())
    if token and scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            decoded = ""
        found |= {decoded, decoded.partition(":")[2]}
    return {s for s in found if len(s) >= MIN_SECRET}


class Scrubber:
    """A compiled secret set; ``redact`` as the module function. Build with ``scrubber(secrets)``."""

    __slots__ = ("_plain", "_escaped", "_always")

    def __init__(self, secrets: frozenset[str]) -> None:
        plain: set[str] = set()
        for secret in secrets:
            for value in _derived(secret):
                plain.add(value)
                plain |= _base64_forms(value)
        # Longest first: a secret that contains another is replaced whole.
        self._plain = tuple(sorted((p for p in plain if len(p) >= MIN_SECRET), key=len, reverse=True))
        escaped = ["".join(_char_pattern(c) for c in value) for value in self._plain]
        self._escaped = re.compile("|".join(escaped)) if escaped else None
        # Secrets whose escaped spellings the cheap unescaping below does not reproduce exactly: spaces
        # (``+``), non-ASCII, and characters of the escape syntax itself (a raw ``\`` before ``\u0030``
        # reads as an escaped backslash to the unescaper, while the pattern still matches it).
        self._always = any(" " in value or not value.isascii() or "\\" in value or "%" in value
                           for value in self._plain)

    def redact(self, text: str) -> str:
        """``text`` with every spelling of every secret, and any auth token, as ``[redacted]``."""
        for value in self._plain:
            if value in text:
                text = text.replace(value, REDACTED)
        if self._escaped is not None and ("\\" in text or "%" in text or (self._always and "+" in text)):
            unescaped = "" if self._always else _unescaped(text)
            if self._always or any(value in unescaped for value in self._plain):
                text = self._escaped.sub(REDACTED, text)
        if "earer" in text or "EARER" in text:
            text = _BEARER.sub(_bearer_token, text)
        if "Basic" in text:
            text = _BASIC.sub(_basic_token, text)
        return text


#: JSON escapes and ASCII percent-escapes, undone in one pass to see cheaply whether a secret hides
#: behind them (the exact, position-keeping replacement is the compiled pattern's job).
_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\([\"\\/bfnrt])|%([0-7][0-9a-fA-F])")
_SHORT = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _unescape(match: re.Match[str]) -> str:
    code, short, percent = match.groups()
    if code is not None:
        return chr(int(code, 16))
    if short is not None:
        return _SHORT.get(short, short)
    return chr(int(percent, 16))


def _unescaped(text: str) -> str:
    return _ESCAPE.sub(_unescape, text)


def _bearer_token(match: re.Match[str]) -> str:
    token = match.group(2)
    looks_like_token = len(token) >= 20 or any(c.isdigit() for c in token)
    return match.group(1) + REDACTED if looks_like_token else match.group(0)


def _basic_token(match: re.Match[str]) -> str:
    try:
        decoded = base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError):
        return match.group(0)
    return match.group(1) + REDACTED if b":" in decoded else match.group(0)


@functools.lru_cache(maxsize=1024)
def scrubber(secrets: frozenset[str]) -> Scrubber:
    """The (cached) compiled form of ``secrets``."""
    return Scrubber(secrets)


def redact(text: str, secrets: frozenset[str]) -> str:
    """``text`` with every secret of ``secrets`` in any encoding, and any ``Bearer``/``Basic`` token,
    replaced by ``[redacted]``. Drop-in for ``proxy.upstreams.client.redact`` (same signature)."""
    return scrubber(secrets).redact(text)


def redact_bytes(data: bytes, secrets: frozenset[str]) -> bytes:
    """``redact`` for a body: decoded as UTF-8 (invalid bytes replaced), redacted, encoded."""
    return redact(data.decode("utf-8", "replace"), secrets).encode("utf-8")
