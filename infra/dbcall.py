"""Database calls with a client-side deadline, for threads that must not hang on a frozen database.

A stopped or frozen Postgres (SIGSTOP, a stuck disk) answers no statement timeout: its kernel keeps
the TCP connection open and acknowledges what is sent, so neither ``statement_timeout`` nor TCP
keepalives nor ``tcp_user_timeout`` ever fire. ``bounded`` runs a call in the calling thread and,
past ``timeout`` seconds, shuts the thread's database socket down from a timer, which makes the
blocked read return at once with ``OperationalError``; the connection is then closed so the next
call reconnects (bounded by ``connect_timeout``). Used by the journal writer's and the auth
lookups' own threads, never by Channels' database thread and never on the event loop.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connections
from django.db.utils import Error as DatabaseError

T = TypeVar("T")


class CallTimedOut(DatabaseError):
    """A bounded database call did not finish within its deadline (its socket was shut down)."""


def _sever(alias: str, fired: threading.Event, thread_connection: Any) -> None:
    fired.set()
    raw = getattr(thread_connection, "connection", None)
    pgconn = getattr(raw, "pgconn", None)
    fd = getattr(pgconn, "socket", -1) if pgconn is not None else -1
    if isinstance(fd, int) and fd >= 0:
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=os.dup(fd))
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def bounded(fn: Callable[[], T], *, timeout: float, alias: str = "default") -> T:
    """``fn()`` (which uses this thread's connection ``alias``), or ``CallTimedOut`` after ``timeout`` s.

    Any database error closes the thread's connection, so a broken one is never reused.
    """
    conn = connections[alias]
    fired = threading.Event()
    timer = threading.Timer(timeout, _sever, args=(alias, fired, conn))
    timer.daemon = True
    timer.start()
    try:
        return fn()
    except DatabaseError as exc:
        with contextlib.suppress(Exception):
            conn.close()
        if fired.is_set():
            raise CallTimedOut(f"database call exceeded {timeout:g} s") from exc
        raise
    finally:
        timer.cancel()
