"""The launcher's listening endpoints (Twisted endpoint strings) with the listen backlog.

The backlog is the kernel's queue of connections that completed the handshake but were not yet
accepted. Twisted's default is 50 (``twisted.internet.endpoints._parseTCP``): a burst of connects
beyond it has SYNs dropped and the clients retry after 1 s (issue 11). Linux caps the value at
``net.core.somaxconn`` (4096 since kernel 5.4).
"""

from __future__ import annotations

import os
import socket

from daphne.endpoints import build_endpoint_description_strings


def endpoint_strings(*, host: str | None, port: int | None, fd: int | None, backlog: int) -> list[str]:
    """Twisted endpoint strings for a TCP ``host``/``port`` and/or an inherited listening socket ``fd``.

    TCP gets ``backlog`` in its endpoint string; an inherited socket is already listening, so its
    backlog is set with ``set_backlog`` (``OSError`` if ``fd`` is not a socket).
    """
    strings: list[str] = []
    if port is not None:
        strings += [f"{s}:backlog={backlog}" for s in build_endpoint_description_strings(host=host, port=port)]
    if fd is not None:
        set_backlog(fd, backlog)
        strings += build_endpoint_description_strings(file_descriptor=fd)
    return strings


def set_backlog(fd: int, backlog: int) -> None:
    """``listen(backlog)`` on the listening socket ``fd`` (Linux applies a new backlog to a socket that
    is already listening); ``fd`` itself stays open."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        sock.listen(backlog)
