"""Background tasks detached from the request task (audit writes, auth cache refreshes).

A request task is cancelled when its client leaves; work scheduled here is not, and stays referenced
until done (asyncio keeps only weak references to tasks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

_BACKGROUND: set[asyncio.Future[Any]] = set()


def schedule(coro: Awaitable[Any]) -> None:
    """Run ``coro`` in the background, detached from the calling task (not cancelled with it)."""
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def drain_background() -> None:
    """Wait until every scheduled task is done (tests, shutdown)."""
    while _BACKGROUND:
        await asyncio.gather(*list(_BACKGROUND), return_exceptions=True)
