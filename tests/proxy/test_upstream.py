"""``UpstreamResponse.chunks``: the idle deadline between body chunks (one timer per body)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from proxy.upstreams.client import UpstreamResponse, UpstreamTimeout


def _response(pauses: list[float], idle: float) -> UpstreamResponse:
    """A response whose body sends one chunk after each pause (seconds)."""

    async def body() -> AsyncIterator[bytes]:
        for number, pause in enumerate(pauses):
            await asyncio.sleep(pause)
            yield f"chunk {number}\n".encode()

    raw = httpx.Response(200, content=body())
    return UpstreamResponse(200, raw.headers, raw, idle)


async def _read(response: UpstreamResponse, hold: float = 0.0) -> list[bytes]:
    chunks = []
    async for chunk in response.chunks():
        chunks.append(chunk)
        await asyncio.sleep(hold)
    return chunks


async def test_it_passes_chunks_that_keep_coming() -> None:
    """Many chunks, each well within the idle deadline: all arrive, no timeout."""
    assert len(await _read(_response([0.01] * 30, idle=0.5))) == 30


async def test_it_times_out_a_body_that_goes_quiet() -> None:
    """A pause longer than the idle deadline raises UpstreamTimeout after the chunks before it."""
    seen: list[bytes] = []
    with pytest.raises(UpstreamTimeout, match="no data"):
        async for chunk in _response([0.0, 0.0, 0.5], idle=0.05).chunks():
            seen.append(chunk)
    assert len(seen) == 2


async def test_it_does_not_count_time_the_relay_holds_a_chunk() -> None:
    """The relay's own work between reads (longer than the deadline) never times the upstream out."""
    assert len(await _read(_response([0.0, 0.0, 0.0], idle=0.05), hold=0.12)) == 3


async def test_it_lets_a_client_cancellation_through() -> None:
    """Cancelling the reading task (client disconnect) is a CancelledError, not an upstream timeout."""
    task = asyncio.ensure_future(_read(_response([0.0, 1.0], idle=0.5)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
