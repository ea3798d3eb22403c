"""Flow control from the client's socket to the ASGI app: the ``toolrelay.backpressure`` extension.

Daphne's ``send`` returns as soon as Twisted holds the bytes in the connection's userspace write
buffer, and that buffer grows without bound when the client reads slower than the upstream writes
(issue 11: a client that did not read a 300 MB pass-through stream grew one process 98 -> 472 MB).
Twisted knows when the buffer is full: a transport calls its streaming producer's ``pauseProducing``
once its buffer holds more than ``bufferSize`` bytes and ``resumeProducing`` once the buffer has been
written out to the kernel (``twisted.internet.abstract.FileDescriptor._maybePauseProducer`` and
``doWrite``); ``twisted.web.http.HTTPChannel`` passes both on to the producer registered on the
request (``Request.registerProducer``). ``Backpressure`` is that producer, made awaitable for the app.

Everything here runs on the event loop's thread: Daphne runs Twisted's asyncio reactor, so Twisted's
callbacks and the app's coroutines share one loop.
"""

from __future__ import annotations

import asyncio

#: The ASGI scope key: ``scope["extensions"][EXTENSION]`` is the request's ``Backpressure``.
EXTENSION = "toolrelay.backpressure"
#: Bytes the connection's userspace write buffer may hold before ``wait_writable`` waits
#: (the transport's ``bufferSize``; Twisted's default is 64 KiB).
HIGH_WATER_BYTES = 1024 * 1024


class Backpressure:
    """The ``toolrelay.backpressure`` ASGI scope extension of one HTTP request (a Twisted push producer).

    Contract for the app: ``await wait_writable()`` before producing more body bytes (for the relay:
    before each upstream read). It returns at once while the connection's userspace write buffer holds
    at most the high-water mark (``HIGH_WATER_BYTES``, 1 MiB); once a send pushed it above, it waits
    until the buffer has drained below the low-water mark, which is Twisted's: the userspace buffer
    written out completely to the kernel's socket buffer. It also returns when the connection is lost
    (the app learns of that from ``http.disconnect``, as without the extension), so it never waits for
    a client that is gone. It raises nothing but ``CancelledError``; any number of tasks may wait.
    An app that follows the contract holds at most about the high-water mark plus one message per
    response in the server, and a slow reader slows the producer instead of growing the process.

    The server side is Twisted's ``IPushProducer``: ``pauseProducing`` (buffer above the mark; may be
    called again while paused), ``resumeProducing`` (drained), ``stopProducing`` (connection lost).
    ``pauses`` counts the pauses (tests and diagnostics).
    """

    def __init__(self) -> None:
        self._writable = asyncio.Event()
        self._writable.set()
        self.pauses = 0

    @property
    def paused(self) -> bool:
        """True while the write buffer is above the high-water mark."""
        return not self._writable.is_set()

    async def wait_writable(self) -> None:
        """Return once the client's connection can take more bytes (see the class docstring)."""
        if self._writable.is_set():
            return
        await self._writable.wait()

    # ----- Twisted's IPushProducer (called by HTTPChannel on the reactor, i.e. the loop's thread) -----

    def pauseProducing(self) -> None:
        """The transport's buffer passed the high-water mark."""
        if self._writable.is_set():
            self.pauses += 1
            self._writable.clear()

    def resumeProducing(self) -> None:
        """The transport wrote its buffer out."""
        self._writable.set()

    def stopProducing(self) -> None:
        """The connection is gone: release every waiter for good."""
        self._writable.set()
