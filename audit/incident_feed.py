"""The live incident feed's channel-layer side: groups, and publishing from the journal writer's thread.

Groups: ``incidents.tenant.<id>`` per tenant (members of the tenant listen there), ``incidents.all``
(superusers: every tenant's incidents) and ``incidents.system`` (every audit viewer: incidents about
the process, such as the journal not draining, which carry no tenant data). A tenant's incident goes
to its tenant group and to ``incidents.all``.

``publish(incidents)`` is called from the journal writer thread, never from the event loop that
serves requests, and never raises: each call is bounded by ``PUBLISH_TIMEOUT`` seconds and
``MAX_PER_CALL`` incidents (the rest are dropped, with a log line), and after a failure nothing is
tried for ``PAUSE_AFTER_FAILURE`` seconds. With the Redis
layer (channels-redis, ``REDIS_URL``) the send runs on an event loop private to the calling
thread, so every process's consumers get it. The in-memory layer (``make run`` without Redis)
lives on the loop of the process's WebSocket consumers and is not thread-safe: the send is handed
to that loop (``note_consumer_loop`` records it when a consumer connects); with no consumer
connected nobody can receive anything, and nothing is sent.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer

from audit.incidents import Incident

logger = logging.getLogger(__name__)

ALL = "incidents.all"
SYSTEM = "incidents.system"
MESSAGE_TYPE = "incident"  # the consumer's ``incident`` handler
PUBLISH_TIMEOUT = 1.0
MAX_PER_CALL = 100
#: After a failed send, nothing is tried for this long (seconds): a layer that is down costs the writer
#: one timeout per pause, not one per batch.
PAUSE_AFTER_FAILURE = 30.0

_consumer_loop: asyncio.AbstractEventLoop | None = None
_local = threading.local()
_last_warning = 0.0
_paused_until = 0.0


def tenant_group(tenant_id: int) -> str:
    """The group of tenant ``tenant_id``'s incidents."""
    return f"incidents.tenant.{int(tenant_id)}"


def groups_of(item: Incident) -> tuple[str, ...]:
    """Where ``item`` is sent: its tenant's group and ``ALL``, or ``SYSTEM`` for a process-wide incident."""
    tenant = item.get("tenant_id")
    return (tenant_group(tenant), ALL) if isinstance(tenant, int) else (SYSTEM,)


def note_consumer_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Record the event loop WebSocket consumers of this process run on (the in-memory layer's)."""
    global _consumer_loop
    _consumer_loop = loop


async def _send_all(layer: Any, items: list[Incident]) -> None:
    for item in items:
        message = {"type": MESSAGE_TYPE, "incident": item}
        for group in groups_of(item):
            await layer.group_send(group, message)


def _private_loop() -> asyncio.AbstractEventLoop:
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = _local.loop = asyncio.new_event_loop()
    return loop


def publish(incidents: Iterable[Incident]) -> int:
    """Send ``incidents`` to their groups (bounded; never raises); returns how many were handed over."""
    global _paused_until
    items = list(incidents)
    if not items or time.monotonic() < _paused_until:
        return 0
    if len(items) > MAX_PER_CALL:
        _warn(f"live incident feed: {len(items) - MAX_PER_CALL} incident(s) dropped in one burst")
        items = items[:MAX_PER_CALL]
    try:
        layer = get_channel_layer()
        if layer is None:
            return 0
        if isinstance(layer, InMemoryChannelLayer):
            loop = _consumer_loop
            if loop is None or loop.is_closed():
                return 0
            if _running_loop() is loop:  # called on the consumers' own loop: waiting would block it
                loop.create_task(_send_all(layer, items))
                return len(items)
            future = asyncio.run_coroutine_threadsafe(_send_all(layer, items), loop)
            try:
                future.result(PUBLISH_TIMEOUT)
            finally:
                future.cancel()  # a no-op once done; stops a send the loop did not get to in time
        else:
            _private_loop().run_until_complete(asyncio.wait_for(_send_all(layer, items), PUBLISH_TIMEOUT))
    except Exception as exc:  # noqa: BLE001 - the feed is a convenience; the journal must go on
        _paused_until = time.monotonic() + PAUSE_AFTER_FAILURE
        _warn(f"live incident feed: not published ({type(exc).__name__}: {exc}); paused {PAUSE_AFTER_FAILURE:g} s")
        return 0
    return len(items)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _warn(message: str) -> None:
    """Log at most one warning a minute (a layer that is down must not flood the log)."""
    global _last_warning
    now = time.monotonic()
    if now - _last_warning >= 60:
        _last_warning = now
        logger.warning(message)
