"""Upstream bodies decoded with a bound (issue 24 item 4).

toolrelay asks upstreams for ``identity``; one that compresses anyway is decoded so the client can read
it. httpx's own decoders inflate a whole network chunk at once with no bound: 1 MB of gzip became 1 GiB
relayed and +1.19 GB of memory. ``BoundedBody`` decodes ``gzip`` / ``x-gzip`` / ``deflate`` (zlib or raw)
incrementally, at most ``PIECE`` bytes of output per step (``zlib``'s ``max_length``), and counts every
decoded byte of the body, compressed or not: past ``limit`` it raises ``BodyTooLarge``. An encoding it
cannot decode (``br`` or ``zstd`` without their packages, stacked encodings, anything unknown) raises
``BodyUndecodable`` before any byte is read, instead of relaying bytes the client cannot read.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

#: The most decoded bytes one step yields (and holds in memory).
PIECE = 64 * 1024


class BodyTooLarge(ValueError):
    """The body decoded past its bound: ``limit`` bytes."""

    def __init__(self, limit: int, encoding: str) -> None:
        how = "decoded from " + encoding if encoding != "identity" else "received"
        super().__init__(f"the upstream's body passed {limit} bytes {how}; the rest was not read")
        self.limit = limit


class BodyUndecodable(ValueError):
    """The body's ``Content-Encoding`` is not one toolrelay decodes, or its bytes do not decode."""


def _decompressor(encoding: str) -> zlib._Decompress | None:
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(zlib.MAX_WBITS | 16)
    if encoding == "deflate":
        return None  # zlib-wrapped or raw: decided on the first bytes
    raise BodyUndecodable(f"the upstream's body is encoded as {encoding!r}, which toolrelay does not decode "
                          "(it asks for identity)")


class BoundedBody:
    """One body's decoder: ``feed(raw)`` yields its decoded pieces (each at most ``PIECE`` bytes),
    ``flush()`` the rest at the end. ``encoding`` is the ``Content-Encoding`` header's value (any case,
    ``identity`` or empty for none); ``limit`` bounds the decoded bytes of the whole body. Raises
    ``BodyTooLarge`` past ``limit``, ``BodyUndecodable`` for an encoding or bytes it cannot decode."""

    def __init__(self, encoding: str, limit: int) -> None:
        self.encoding = encoding.strip().lower() or "identity"
        self.limit = limit
        self.size = 0
        self._identity = self.encoding == "identity"
        self._inflate = None if self._identity else _decompressor(self.encoding)
        self._head = b""  # deflate's first byte while its header is undecided

    def feed(self, raw: bytes) -> Iterator[bytes]:
        if self._identity:
            yield self._counted(raw)
            return
        if self._inflate is not None:
            yield from self._inflated(raw)
            return
        # deflate: RFC 9110 says zlib-wrapped; some servers send it raw. Decided on its first two bytes
        # (a zlib header: CM 8 and a check value); a wrapped reading that fails at once is read raw.
        data, self._head = self._head + raw, b""
        if len(data) < 2:
            self._head = data
            return
        wrapped = data[0] & 0x0F == 8 and (data[0] * 256 + data[1]) % 31 == 0
        self._inflate = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        if wrapped:
            try:
                piece = self._inflate.decompress(data, PIECE)
            except zlib.error:
                self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            else:
                if piece:
                    yield self._counted(piece)
                if not self._inflate.eof:
                    yield from self._inflated(self._inflate.unconsumed_tail)
                return
        yield from self._inflated(data)

    def _inflated(self, data: bytes) -> Iterator[bytes]:
        """``data`` through the decompressor, ``PIECE`` bytes at a time (also output still pending from
        earlier input, when ``data`` is empty)."""
        assert self._inflate is not None
        while True:
            try:
                piece = self._inflate.decompress(data, PIECE)
            except zlib.error as exc:
                raise BodyUndecodable(f"the upstream's {self.encoding} body does not decode: {exc}") from None
            data = self._inflate.unconsumed_tail
            if piece:
                yield self._counted(piece)
            if self._inflate.eof or (not data and len(piece) < PIECE):
                return  # bytes after the end of the stream are ignored, as httpx does

    def flush(self) -> Iterator[bytes]:
        if self._inflate is None and self._head:
            head, self._head = self._head, b""
            self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            yield from self._inflated(head)
        if self._identity or self._inflate is None:
            return
        try:
            rest = self._inflate.flush(PIECE)
        except zlib.error as exc:
            raise BodyUndecodable(f"the upstream's {self.encoding} body does not decode: {exc}") from None
        if rest:
            yield self._counted(rest)

    def _counted(self, piece: bytes) -> bytes:
        self.size += len(piece)
        if self.size > self.limit:
            raise BodyTooLarge(self.limit, self.encoding)
        return piece
