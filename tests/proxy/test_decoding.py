"""``proxy.upstreams.decoding.BoundedBody``: upstream bodies decoded in bounded pieces, with a bound on
the whole body (issue 24 item 4). Over real sockets: tests/e2e/test_gzip_bomb.py."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.upstreams.decoding import PIECE, BodyTooLarge, BodyUndecodable, BoundedBody


def _decoded(encoding: str, raw: bytes, cuts: list[int], limit: int = 10**9) -> tuple[bytes, int]:
    body = BoundedBody(encoding, limit)
    out, biggest, at = [], 0, 0
    for cut in sorted({c % (len(raw) + 1) for c in cuts}) + [len(raw)]:
        for piece in body.feed(raw[at:cut]):
            out.append(piece)
            biggest = max(biggest, len(piece))
        at = cut
    for piece in body.flush():
        out.append(piece)
        biggest = max(biggest, len(piece))
    return b"".join(out), biggest


def _deflate(data: bytes, wbits: int) -> bytes:
    packer = zlib.compressobj(wbits=wbits)
    return packer.compress(data) + packer.flush()


@given(st.binary(max_size=5000), st.lists(st.integers(min_value=0, max_value=10_000), max_size=6),
       st.sampled_from(["gzip", "x-gzip", "deflate-zlib", "deflate-raw", "identity"]))
def test_any_chunking_decodes_to_the_whole_body(data: bytes, cuts: list[int], how: str) -> None:
    raw = {"gzip": gzip.compress(data), "x-gzip": gzip.compress(data), "identity": data,
           "deflate-zlib": _deflate(data, zlib.MAX_WBITS), "deflate-raw": _deflate(data, -zlib.MAX_WBITS)}[how]
    encoding = how.split("-")[0] if how.startswith("deflate") else how
    assert _decoded(encoding.upper(), raw, cuts)[0] == data


def test_a_bomb_is_decoded_in_bounded_pieces_and_stopped_at_the_bound() -> None:
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024))  # 64 MiB from ~64 KB
    body = BoundedBody("gzip", 8 * 1024 * 1024)
    seen = 0
    with pytest.raises(BodyTooLarge, match="passed 8388608 bytes decoded from gzip"):
        for piece in body.feed(bomb):
            assert len(piece) <= PIECE
            seen += len(piece)
    assert seen <= 8 * 1024 * 1024


def test_an_identity_body_is_bounded_too() -> None:
    body = BoundedBody("", 10)
    assert list(body.feed(b"12345")) == [b"12345"]
    with pytest.raises(BodyTooLarge, match="passed 10 bytes received"):
        list(body.feed(b"123456"))


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, br", "compress"])
def test_an_encoding_it_cannot_decode_is_refused_before_any_byte(encoding: str) -> None:
    with pytest.raises(BodyUndecodable, match="does not decode"):
        BoundedBody(encoding, 100)


def test_bytes_that_do_not_decode_are_refused() -> None:
    with pytest.raises(BodyUndecodable):
        list(BoundedBody("gzip", 100).feed(b"not gzip at all"))


def test_a_deflate_bomb_in_one_chunk_is_stopped_in_bounded_pieces() -> None:
    for wbits in (zlib.MAX_WBITS, -zlib.MAX_WBITS):
        bomb = _deflate(b"\0" * (32 * 1024 * 1024), wbits)
        body = BoundedBody("deflate", 4 * 1024 * 1024)
        with pytest.raises(BodyTooLarge):
            for piece in body.feed(bomb):
                assert len(piece) <= PIECE
