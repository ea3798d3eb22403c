"""Header names an upstream's stored extra headers may never set (issue 24 item 1).

toolrelay's own headers (``x-toolrelay-*``: the proxy hop count that stops a self-loop), the
hop-by-hop and framing headers (RFC 9110 section 7.6.1 and RFC 9112 section 6: ``Connection``,
``Keep-Alive``, ``Transfer-Encoding``, ``Content-Length``, ``TE``, ``Trailer``, ``Upgrade``, every
``Proxy-*``), ``Host`` and the credential headers (``Authorization``, ``x-api-key``: the upstream's
credential has its own field) belong to toolrelay and the HTTP client. A tenant that could set them
could switch the loop guard off, smuggle a request onto a connection shared with another tenant, or
retarget a virtual host. They are refused when saved (``tenants.models.validate_extra_headers``) and
dropped when sent (``proxy.upstreams.client.request_headers``) from rows saved before the rule.
"""

from __future__ import annotations

#: Exact names (lowercase) reserved to toolrelay and the HTTP client.
RESERVED = frozenset({
    "connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade",
    "host", "authorization", "x-api-key",
})
#: Reserved name prefixes (lowercase).
RESERVED_PREFIXES = ("x-toolrelay-", "proxy-")


def reserved(name: str) -> bool:
    """Whether the header ``name`` (any case, surrounding whitespace ignored) is reserved."""
    lowered = name.strip().lower()
    return lowered in RESERVED or lowered.startswith(RESERVED_PREFIXES)
