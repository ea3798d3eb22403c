"""The floor of the stack: the smallest Channels relay, served by the same Daphne as toolrelay.

``BARE_UPSTREAM=http://127.0.0.1:P/v1 python -m daphne -p PORT bench.bare_relay:application``.
No auth, no routing, no audit, no guard, no disconnect handling: the request body goes up as is and
``aiter_raw()`` chunks come back with ``send_body(more_body=True)`` (perf-anchors.md 3.4). The one
setting: a pool of 1,000 connections (httpx's default of 100 would queue the open-stream test).
Whatever toolrelay adds above this relay is its own cost.
"""

from __future__ import annotations

import os
from typing import Any

import django
import httpx
from channels.generic.http import AsyncHttpConsumer
from django.conf import settings

if not settings.configured:
    settings.configure(DEBUG=False, INSTALLED_APPS=["channels"])
    django.setup()

UPSTREAM = os.environ.get("BARE_UPSTREAM", "http://127.0.0.1:8001/v1") + "/chat/completions"
_client: dict[str, httpx.AsyncClient] = {}


class BareRelay(AsyncHttpConsumer):
    """POST anything -> the upstream's chat completions, bytes forwarded unchanged."""

    async def handle(self, body: bytes) -> None:
        client = _client.get("c") or _client.setdefault("c", httpx.AsyncClient(
            timeout=None, trust_env=False, limits=httpx.Limits(max_connections=1000)))  # noqa: S113 - streams are long
        async with client.stream("POST", UPSTREAM, content=body, headers={"content-type": "application/json"}) as up:
            await self.send_headers(status=up.status_code, headers=[(b"content-type", b"text/event-stream")])
            async for chunk in up.aiter_raw():
                await self.send_body(chunk, more_body=True)
        await self.send_body(b"")


application: Any = BareRelay.as_asgi()
