"""Just enough HTTP/1.1 over asyncio streams: requests with keep-alive, fixed and chunked responses.

RFC 9112 subset: request line + headers (CRLF, 64 KiB cap), bodies by ``Content-Length`` or
``Transfer-Encoding: chunked``, persistent connections unless ``Connection: close`` (or HTTP/1.0
without keep-alive). Responses are written by the server with :func:`head` and :func:`chunk`.

While a response is being written the connection watches its reader (:meth:`Connection.watch`):
EOF or a reset from the client is seen between frames, and during pauses, without blocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024
_READ = 64 * 1024


class BadRequest(Exception):
    """The bytes on the connection are not an HTTP/1.1 request we can read."""


@dataclass
class Request:
    """A parsed request: ``path`` without the query string, header names lower-cased."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


def head(status: int, headers: list[tuple[str, str]]) -> bytes:
    """Status line and header block (``headers`` written as given, then a blank line)."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers), "", ""]
    return "\r\n".join(lines).encode("latin-1")


def chunk(data: bytes) -> bytes:
    """One chunk of a ``Transfer-Encoding: chunked`` body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


class Connection:
    """One client connection: buffered request reading and client-gone detection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        self.reader, self.writer, self.number = reader, writer, number
        self._buf = bytearray()
        self._watch: asyncio.Task[bytes] | None = None
        self.closed_at: float | None = None  # time.monotonic() when the client was seen gone
        self._dropped = False  # we closed it on purpose (drop-after): not the client's doing

    async def read_request(self) -> Request | None:
        """The next request, or None at a clean EOF between requests."""
        raw = await self._read_until(b"\r\n\r\n")
        if raw is None:
            return None
        lines = raw.decode("latin-1").lstrip("\r\n").split("\r\n")
        try:
            method, target, version = lines[0].split(" ")
        except ValueError:
            raise BadRequest(f"bad request line {lines[0]!r}") from None
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadRequest(f"bad header line {line!r}")
            headers[name.strip().lower()] = value.strip()
        if headers.get("expect", "").lower() == "100-continue":
            # curl sends this for bodies over 1 KiB and otherwise waits a second before sending.
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await self._read_body(headers)
        connection = headers.get("connection", "").lower()
        keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
        return Request(method, target.split("?", 1)[0], headers, body, keep_alive)

    async def _read_body(self, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return await self._read_chunked()
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise BadRequest("bad content-length") from None
        if not 0 <= length <= MAX_BODY:
            raise BadRequest("body too large")
        return await self._read_exact(length)

    async def _read_chunked(self) -> bytes:
        body = bytearray()
        while True:
            size_line = await self._read_until(b"\r\n")
            if size_line is None:
                raise BadRequest("EOF in chunked body")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise BadRequest("bad chunk size") from None
            if size == 0:
                while await self._read_until(b"\r\n") not in (b"", None):
                    pass  # trailers, ignored
                return bytes(body)
            body += await self._read_exact(size + 2)
            del body[-2:]
            if len(body) > MAX_BODY:
                raise BadRequest("body too large")

    async def _read_until(self, separator: bytes) -> bytes | None:
        """Bytes before ``separator`` (consumed), None on EOF before any byte."""
        while (end := self._buf.find(separator)) < 0:
            if len(self._buf) > MAX_HEAD:
                raise BadRequest("header block too large")
            data = await self.reader.read(_READ)
            if not data:
                if self._buf.strip():
                    raise BadRequest("EOF inside a request")
                return None
            self._buf += data
        out = bytes(self._buf[:end])
        del self._buf[: end + len(separator)]
        return out

    async def _read_exact(self, count: int) -> bytes:
        while len(self._buf) < count:
            data = await self.reader.read(_READ)
            if not data:
                raise BadRequest("EOF inside a request body")
            self._buf += data
        out = bytes(self._buf[:count])
        del self._buf[:count]
        return out

    # --- client-gone detection while a response is written -----------------------------------

    def watch(self) -> None:
        """Start watching the reader (call before writing a response)."""
        self._watch = asyncio.ensure_future(self.reader.read(_READ))

    def gone(self) -> bool:
        """Whether the client closed or reset the connection (never blocks)."""
        if self._dropped:
            return True
        if self.closed_at is None and self._client_left():
            self.closed_at = time.monotonic()
        return self.closed_at is not None

    def _client_left(self) -> bool:
        if self.writer.transport.is_closing():
            return True
        watch = self._watch
        if watch is None or not watch.done():
            return False
        if watch.cancelled() or watch.exception() is not None or not watch.result():
            return True
        # Pipelined bytes of the next request: keep them and go on watching.
        self._buf += watch.result()
        self.watch()
        return False

    async def pause_until(self, deadline: float) -> bool:
        """Sleep until ``deadline`` (monotonic); False as soon as the client is gone."""
        while not self.gone():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            if self._watch is None:
                await asyncio.sleep(remaining)
            else:
                await asyncio.wait({self._watch}, timeout=remaining)
        return False

    async def unwatch(self) -> None:
        """Stop watching; bytes the watch read early stay buffered for the next request."""
        watch, self._watch = self._watch, None
        if watch is None:
            return
        if not watch.done():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        elif not watch.cancelled() and watch.exception() is None:
            self._buf += watch.result()

    async def send(self, data: bytes) -> bool:
        """Write and drain; False if nothing could be written (the client is gone)."""
        if self.gone():
            return False
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError):
            self.closed_at = self.closed_at or time.monotonic()
            return False
        return True

    def drop(self) -> None:
        """Close the TCP connection mid-response: what was written is flushed, then FIN, and no
        chunked terminator follows, so the client sees an incomplete message. (``abort()`` would
        discard frames still in the write buffer; an RST could purge them on the client side.)"""
        self._dropped = True
        self.writer.transport.close()

    async def close(self) -> None:
        """Close the connection and wait until the transport is gone."""
        await self.unwatch()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
