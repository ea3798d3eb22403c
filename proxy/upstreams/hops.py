"""Proxy hops: how many toolrelay proxies a request has already passed through.

Every upstream call carries ``x-toolrelay-hops: N+1``, N being the count the client's request came
with (0 from an agent). A request that arrives with ``MAX_PROXY_HOPS`` or more is refused with a 400
``proxy_loop_detected`` before anything else is done. Without it, a tenant admin who points an upstream
at toolrelay itself (its public host passes the outbound address policy) and gives it a toolrelay key
makes one client request an endless chain of requests (found in review: 1,085 audit rows in 4 s, every
level retrying). With the default of 1, the chain stops at its first inner request, and the outer one
passes the non-retryable 400 on to the client. Chaining toolrelays on purpose needs ``MAX_PROXY_HOPS=2``.

The count travels in a context variable set by the consumer for the request's task (and the tasks it
starts); ``proxy.upstreams.client.request_headers`` reads it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable

HEADER = "x-toolrelay-hops"
_incoming: contextvars.ContextVar[int] = contextvars.ContextVar("toolrelay_incoming_hops", default=0)


def arrived(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The hop count of an ASGI request's headers (0 when absent; a malformed value counts as 1: it came
    from something that sets the header)."""
    name = HEADER.encode()
    for key, value in headers:
        if key.lower() == name:
            try:
                return max(0, int(value.decode("latin-1").strip()))
            except ValueError:
                return 1
    return 0


def enter(count: int) -> None:
    """Record ``count`` as the current request's incoming hops (its context)."""
    _incoming.set(count)


def outgoing() -> str:
    """The header value for an upstream call made on behalf of the current request."""
    return str(_incoming.get() + 1)
