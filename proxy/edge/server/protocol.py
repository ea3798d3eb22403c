"""Daphne's HTTP request and factory, and Twisted's ``HTTPChannel``, with the launcher's early limits.

Where each limit sits in Twisted's parsing of a request (``twisted.web.http.HTTPChannel``):

- ``lineReceived`` collects the request line and headers; ``allHeadersReceived`` runs once they are
  complete. The **header deadline** runs from a request's first byte (from the accept, for a
  connection's first request) to ``allHeadersReceived``; past it the connection is closed. Between
  requests no deadline runs: an idle keep-alive connection is closed only by Twisted's idle timeout
  (``HTTPFactory.timeOut``, 60 s without a byte, which Daphne keeps), as under plain Daphne. A
  request being answered (a long stream) has no deadline here at all.
- ``allHeadersReceived`` knows the ``Content-Length`` (``self.length``; None for chunked bodies):
  over ``MAX_REQUEST_BYTES`` the 413 goes out at once, before ``Request.gotLength`` opens a body
  buffer and before an ``Expect: 100-continue`` is answered, so the client need not send the body.
- ``Request.handleContentChunk`` receives the decoded body as it arrives: a chunked body is counted
  there and refused the moment it passes the limit.
- After a 413 the rest of the body is read and dropped (``_Refusal``), never buffered: most clients
  (httpx, so both SDKs) send their whole body before reading, and a connection closed on unread data
  resets, which they would see as a network error (and retry) instead of the 413.
- ``connectionMade`` sets the transport's ``bufferSize`` to the write high-water mark, the point at
  which Twisted pauses the request's ``Backpressure`` producer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.web import http

from infra import metrics
from proxy.edge.server.backpressure import HIGH_WATER_BYTES, Backpressure
from proxy.guard.protocols.emit_anthropic import error_body as anthropic_error_body
from proxy.guard.protocols.emit_openai import error_body as openai_error_body

logger = logging.getLogger(__name__)

# Twisted's channel, transports and delayed calls are zope interfaces, which mypy cannot check
# without the mypy-zope plugin: this module handles them as Any.
_HTTPChannel: Any = http.HTTPChannel

#: After a 413: the rest of the body is dropped for at most this long in all (seconds) ...
REFUSAL_LINGER_SECONDS = 30.0
#: ... and at most this long without a byte from the client (seconds).
REFUSAL_IDLE_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class Limits:
    """The launcher's limits for every connection.

    ``max_request_bytes``: the largest request body (``MAX_REQUEST_BYTES``); ``header_timeout``: the
    seconds a request's line and headers may take (``HEADER_TIMEOUT_SECONDS``; 0 turns it off);
    ``high_water``: the write buffer's high-water mark in bytes (``backpressure.HIGH_WATER_BYTES``).
    """

    max_request_bytes: int
    header_timeout: float
    high_water: int = HIGH_WATER_BYTES


def reason_phrase(status: int) -> bytes:
    """The status line's reason phrase for ``status``: ``http.HTTPStatus``'s (RFC 9110 and the RFCs that
    added codes, e.g. ``429 Too Many Requests``, which Twisted's table lacks and would write as
    ``Unknown Status``), else ``Unknown Status`` for a code no RFC names."""
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b"Unknown Status"


def too_large_response(path: bytes, limit: int) -> bytes:
    """The complete HTTP/1.1 413 response (``Connection: close``) to a body over ``limit`` bytes.

    The body is the client's protocol's error: Anthropic's shape under ``/v1/messages`` (PROTOCOLS.md
    2.4, error type ``request_too_large``), else OpenAI's (1.6: ``invalid_request_error``, code
    ``request_too_large``). ``x-should-retry: false``: both SDKs honour it, and the same body can only
    be refused again.
    """
    message = f"request body larger than {limit} bytes"
    if path.startswith(b"/v1/messages"):
        body = anthropic_error_body(413, message)
    else:
        body = openai_error_body(413, message, type="invalid_request_error", code="request_too_large")
    data = json.dumps(body).encode()
    head = (b"HTTP/1.1 413 " + reason_phrase(413) + b"\r\ncontent-type: application/json\r\n"
            b"x-should-retry: false\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(data))
    return head + data


class _Refusal:
    """The rest of a refused body, read and dropped: the connection closes when the body has ended
    (``remaining`` bytes of a ``Content-Length`` body counted here; a chunked body's end is seen by
    Twisted's decoder), when the client closes it, after ``REFUSAL_IDLE_SECONDS`` without a byte, or
    ``REFUSAL_LINGER_SECONDS`` after the refusal, whichever comes first."""

    def __init__(self, channel: LimitedChannel, remaining: int | None) -> None:
        self.channel = channel
        self.remaining = remaining
        channel.setTimeout(REFUSAL_IDLE_SECONDS)
        self._deadline: Any = channel.callLater(REFUSAL_LINGER_SECONDS, channel.abort)

    def drop(self, size: int) -> None:
        """``size`` more bytes of a ``Content-Length`` body arrived (and are dropped)."""
        assert self.remaining is not None
        self.remaining -= size
        if self.remaining <= 0:
            self.channel.loseConnection()

    def cancel(self) -> None:
        if self._deadline.active():
            self._deadline.cancel()


class LimitedChannel(_HTTPChannel):  # type: ignore[misc]  # Twisted's channel, as Any (above)
    """Twisted's HTTP/1.1 channel with the header deadline, the early body limit and the write
    high-water mark (module docstring). ``limits`` is set by ``LimitedHTTPFactory``."""

    limits: Limits
    _header_call: Any = None
    _in_request = False
    _refusal: _Refusal | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        if hasattr(self.transport, "bufferSize"):
            self.transport.bufferSize = self.limits.high_water
        self._start_header_clock()

    def dataReceived(self, data: bytes) -> None:
        if not self._in_request and self._header_call is None:
            self._start_header_clock()  # the first byte of the next request on a kept-alive connection
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        self._stop_header_clock()
        self._in_request = True
        if self.length is not None and self.length > self.limits.max_request_bytes:
            self.refuse_body(remaining=self.length)
            return  # no gotLength (no body buffer), no 100 Continue
        super().allHeadersReceived()

    def rawDataReceived(self, data: bytes) -> None:
        if self._refusal is not None and self._refusal.remaining is not None:
            self._refusal.drop(len(data))
            return
        super().rawDataReceived(data)

    def requestDone(self, request: Any) -> None:
        self._in_request = False
        super().requestDone(request)

    def connectionLost(self, reason: Any) -> None:
        self._stop_header_clock()
        if self._refusal is not None:
            self._refusal.cancel()
        super().connectionLost(reason)

    def refuse_body(self, *, remaining: int | None) -> None:
        """Answer the current request 413 now and drop the rest of its body (``remaining`` bytes of a
        ``Content-Length`` body, or None for a chunked one, whose end Twisted's decoder finds)."""
        if self._refusal is not None:
            return
        request = self.requests[-1]
        if isinstance(request, LimitedRequest):
            request.refuse()
        path = getattr(self, "_path", b"")  # the request line's target, parsed by lineReceived
        assert self.transport is not None
        self.transport.write(too_large_response(path if isinstance(path, bytes) else b"",
                                                self.limits.max_request_bytes))
        self._refusal = _Refusal(self, remaining)
        metrics.SERVER_REFUSED.labels(reason="body_too_large").inc()
        logger.debug("413: request body over %d bytes from %s", self.limits.max_request_bytes,
                     self.transport.getPeer())

    def abort(self) -> None:
        """Close at once, dropping whatever is unsent."""
        if self.transport is not None:
            self.transport.abortConnection()

    # ----- the header deadline -----

    def _start_header_clock(self) -> None:
        if self.limits.header_timeout > 0:
            self._header_call = self.callLater(self.limits.header_timeout, self._headers_too_slow)

    def _stop_header_clock(self) -> None:
        call, self._header_call = self._header_call, None
        if call is not None and call.active():
            call.cancel()

    def _headers_too_slow(self) -> None:
        self._header_call = None
        metrics.SERVER_REFUSED.labels(reason="header_timeout").inc()
        if self.transport is not None:
            logger.debug("closing %s: no complete request headers within %.1f s", self.transport.getPeer(),
                         self.limits.header_timeout)
        self.loseConnection()


class LimitedRequest(WebRequest):  # type: ignore[misc]  # Daphne is untyped
    """Daphne's request with the chunked body limit and the ``Backpressure`` producer.

    The producer is registered on the request (hence on the channel, which the transport pauses and
    resumes) when the whole request has arrived, and unregistered before the request finishes
    (Twisted logs an error for a producer left registered). ``LimitedServer.create_application``
    puts it in the ASGI scope.
    """

    content: Any  # Twisted's body buffer (a BytesIO or temporary file), None once refused

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Twisted parses the Content-Type of every POST (with the email package) to decode HTML form
        # bodies into ``request.args``; Daphne never reads ``args`` (ASGI gets the raw body), so that is
        # only CPU spent per request (twisted/web/http.py ``Request.requestReceived``).
        self._parsePOSTFormSubmission = False
        self.backpressure = Backpressure()
        self.refused = False
        self._body_bytes = 0

    def refuse(self) -> None:
        """The body is refused: drop what was buffered and whatever still comes."""
        self.refused = True
        if self.content is not None:
            self.content.close()
            self.content = None

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return
        self._body_bytes += len(data)
        if self._body_bytes > self.channel.limits.max_request_bytes:
            self.channel.refuse_body(remaining=None)
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self.refused:
            self.channel.loseConnection()  # the refused body has ended; the 413 is on its way
            return
        self.registerProducer(self.backpressure, True)
        super().requestReceived(command, path, version)

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:  # noqa: N802  # Twisted's name
        """Twisted's, with :func:`reason_phrase` when no phrase is given (Daphne never gives one)."""
        super().setResponseCode(code, reason_phrase(code) if message is None else message)

    def finish(self) -> None:
        if self.producer is not None and self.channel is not None:
            self.unregisterProducer()
        super().finish()

    def connectionLost(self, reason: Any) -> None:
        self.backpressure.stopProducing()
        super().connectionLost(reason)


class LimitedHTTPFactory(HTTPFactory):  # type: ignore[misc]  # Daphne is untyped
    """Daphne's HTTP factory building ``LimitedChannel`` (Twisted's channel class itself, not the
    HTTP/2-negotiating wrapper: Daphne's TCP and fd endpoints speak HTTP/1.1 only) with
    ``LimitedRequest`` requests."""

    protocol = LimitedChannel

    def __init__(self, server: Any, limits: Limits) -> None:
        super().__init__(server)
        self.limits = limits

    def buildProtocol(self, addr: Any) -> LimitedChannel:
        channel: LimitedChannel = super().buildProtocol(addr)
        channel.requestFactory = LimitedRequest
        channel.limits = self.limits
        return channel
