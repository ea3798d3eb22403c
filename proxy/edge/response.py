"""``ClientResponse``: the only writer to the client, in one phase at a time.

Phases: ``NOT_STARTED`` -> ``COMMITTED`` (status and headers sent) -> ``ENDED`` (the last body part
sent). Every write checks the phase and refuses an out-of-order one with ``ResponseStateError``, as
uvicorn's ``RequestResponseCycle.send`` refuses a second ``http.response.start`` or a body after
the end: a bug then fails loudly instead of writing a corrupt HTTP response.

The response also owns what depends on its phase: the error path (an HTTP error body in the
client's protocol before the commit, the emitter's in-stream error after it), the commit deadline
and keep-alives while the relay holds a guarded stream (``hold``), the status and the time to first
byte. ``send`` is an ASGI send callable (Channels' ``AsyncConsumer.send``, or a test's recorder).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from proxy.guard.protocols.emit import Emitter
from proxy.guard.turn import UpstreamError

Send = Callable[[dict[str, Any]], Awaitable[None]]

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class ErrorBody(Protocol):
    """A protocol's HTTP error body (``proxy.edge.protocols.ClientProtocol.error_body``)."""

    def __call__(self, status: int, message: str, *, type: str, param: str | None = None,
                 code: str | None = None) -> dict[str, Any]: ...


class Phase(enum.Enum):
    """Where the response stands."""

    NOT_STARTED = "not-started"
    COMMITTED = "committed"
    ENDED = "ended"


class ResponseStateError(RuntimeError):
    """A write that the response's phase does not allow (a bug in the caller)."""


class ClientResponse:
    """One HTTP response to the client.

    ``request_id`` goes out as ``x-request-id`` and at the end of every error message;
    ``error_body`` renders HTTP errors in the client's protocol; ``emitter`` (set once the request is
    understood) renders stream openings, keep-alives and in-stream errors. ``started`` is the
    monotonic time the request arrived; ``ttft`` the seconds to the first non-empty body byte.
    ``writable`` (optional) returns once the client's connection can take more bytes: the server's
    ``toolrelay.backpressure`` extension's ``wait_writable`` (``proxy.edge.server.backpressure``), which
    producers await through ``ready`` before reading more from the upstream.
    """

    def __init__(self, send: Send, *, error_body: ErrorBody, request_id: uuid.UUID | None = None,
                 started: float | None = None, writable: Callable[[], Awaitable[None]] | None = None) -> None:
        self._send = send
        self._writable = writable
        self.error_body = error_body
        self.request_id = request_id or uuid.uuid4()
        self.started = time.monotonic() if started is None else started
        self.emitter: Emitter | None = None
        self.phase = Phase.NOT_STARTED
        self.status: int | None = None
        self.ttft: float | None = None
        self._lock = asyncio.Lock()  # uncontended but for the ticker: one acquire per phase change
        self._ticker: asyncio.Task[None] | None = None
        self._last_send = 0.0
        #: Headers every response of this request carries (the limits' ``x-ratelimit-*``), set before the commit.
        self.extra_headers: list[tuple[bytes, bytes]] = []

    @property
    def committed(self) -> bool:
        """True once status and headers went out."""
        return self.phase is not Phase.NOT_STARTED

    @property
    def ended(self) -> bool:
        """True once the last body part went out."""
        return self.phase is Phase.ENDED

    async def ready(self) -> None:
        """Return once the client can take more bytes: at once without a ``writable`` hook (plain
        Daphne), else when the hook says so (a slow reader holds the caller here, and so its upstream)."""
        if self._writable is not None:
            await self._writable()

    # ----- writes -----

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Send the status line and ``headers`` (``x-request-id`` added)."""
        if self.phase is not Phase.NOT_STARTED:
            raise ResponseStateError(f"response already started (phase {self.phase.value})")
        self.phase, self.status = Phase.COMMITTED, status
        await self._send({"type": "http.response.start", "status": status,
                          "headers": [*headers, *self.extra_headers,
                                      (b"x-request-id", str(self.request_id).encode())]})

    async def commit_stream(self) -> None:
        """Commit a 200 event stream (SSE headers, then the emitter's opening bytes) unless committed."""
        async with self._lock:
            if self.phase is not Phase.NOT_STARTED:
                return
            await self.start(200, SSE_HEADERS)
            assert self.emitter is not None, "an event stream needs its emitter"
            opening = self.emitter.open()
            if opening:
                await self.send(opening)

    async def send(self, data: bytes) -> None:
        """Send body bytes of a committed response."""
        if self.phase is not Phase.COMMITTED:
            raise ResponseStateError(f"body sent in phase {self.phase.value}")
        if self.ttft is None and data:
            self.ttft = time.monotonic() - self.started
        if self._ticker is not None:
            self._last_send = time.monotonic()
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def stream(self, data: bytes) -> None:
        """Send event-stream bytes, committing the stream first if needed."""
        if self.phase is Phase.NOT_STARTED:
            await self.commit_stream()
        await self.send(data)

    async def end(self, data: bytes = b"") -> None:
        """Send the last body part (committing an event stream first if needed)."""
        if self.phase is Phase.NOT_STARTED:
            await self.commit_stream()
        if self.phase is not Phase.COMMITTED:
            raise ResponseStateError(f"response ended twice (phase {self.phase.value})")
        self.release()
        if self.ttft is None and data:
            self.ttft = time.monotonic() - self.started
        self.phase = Phase.ENDED
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    async def send_json(self, status: int, obj: Any, *, should_retry: bool | None = None,
                        headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """A whole JSON response: status, ``content-type: application/json``, ``x-should-retry`` when
        given, ``headers``, then the body."""
        extra = [(b"content-type", b"application/json"), *(headers or [])]
        if should_retry is not None:
            extra.append((b"x-should-retry", b"true" if should_retry else b"false"))
        await self.start(status, extra)
        await self.end(json.dumps(obj).encode())

    # ----- the error path -----

    async def error(self, status: int, message: str, *, type: str, code: str | None = None,
                    param: str | None = None, should_retry: bool | None = False,
                    retry_after: float | None = None, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """An error in the client's protocol; the message always carries the request id.

        Before the commit: HTTP ``status`` with the protocol's error body (and ``Retry-After`` in whole
        seconds when given, then ``headers``). After it (the commit deadline committed the stream meanwhile): the
        emitter's in-stream error, ending the stream.
        """
        text = f"{message} (request id: {self.request_id})"
        async with self._lock:
            if self.phase is Phase.NOT_STARTED:
                body = self.error_body(status, text, type=type, param=param, code=code)
                extra = [(b"retry-after", str(max(1, math.ceil(retry_after))).encode())] if retry_after else []
                await self.send_json(status, body, should_retry=should_retry, headers=[*extra, *(headers or [])])
                return
        await self.end_with_error(UpstreamError(status, text, type, code=code))

    async def end_with_error(self, error: UpstreamError) -> None:
        """End a committed stream with the emitter's in-stream ``error`` (as given)."""
        if self.phase is not Phase.COMMITTED:
            raise ResponseStateError(f"in-stream error in phase {self.phase.value}")
        await self.end(self.emitter.close_error(error) if self.emitter is not None else b"")

    async def fail_internal(self) -> None:
        """The one answer to a bug on the request path: a 500 before the commit, an in-stream error
        after it, nothing once ended."""
        if self.phase is Phase.NOT_STARTED:
            await self.error(500, "toolrelay failed to serve this request", type="server_error")
        elif self.phase is Phase.COMMITTED:
            await self.end_with_error(UpstreamError(500, "toolrelay internal error", "server_error"))

    async def finish(self) -> None:
        """End a committed response that was left open (the request task is done); never raises."""
        self.release()
        if self.phase is Phase.COMMITTED:
            with contextlib.suppress(Exception):
                await self.end()

    # ----- the commit deadline and keep-alives -----

    def hold(self, commit_deadline: float, keepalive_interval: float) -> None:
        """Start the ticker: commit with a keep-alive at ``commit_deadline`` seconds if nothing was sent,
        then a keep-alive whenever ``keepalive_interval`` seconds pass without a send."""
        self._last_send = time.monotonic()
        self._ticker = asyncio.ensure_future(self._tick(commit_deadline, keepalive_interval))

    def release(self) -> None:
        """Stop the ticker (idempotent)."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    async def _tick(self, commit_deadline: float, interval: float) -> None:
        await asyncio.sleep(commit_deadline)
        if self.phase is Phase.NOT_STARTED:
            await self.commit_stream()
            await self._keepalive()
        while True:
            await asyncio.sleep(max(0.05, self._last_send + interval - time.monotonic()))
            if time.monotonic() - self._last_send >= interval:
                await self._keepalive()

    async def _keepalive(self) -> None:
        if self.phase is Phase.COMMITTED and self.emitter is not None:
            self._last_send = time.monotonic()
            await self._send({"type": "http.response.body", "body": self.emitter.keepalive(), "more_body": True})
