"""The default upstream's own models for ``GET /v1/models`` (so model pickers are not empty).

``UpstreamModels.names(target)`` is ``GET {base_url}/models`` of the tenant's default upstream (its
credential and extra headers, as for chat calls), through the outbound address policy
(``infra.outbound_http.outbound_client``), with a short timeout (``UPSTREAM_MODELS_TIMEOUT_SECONDS``).
Answers are cached per upstream for ``UPSTREAM_MODELS_CACHE_SECONDS`` (10 minutes); a failure (down,
slow, refused by the policy, not a model list) is cached for a tenth of that and gives no names, so
the listing degrades to the tenant's routes and never waits on a sick upstream more than once in a
while. Concurrent askers of one upstream share one fetch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
from django.conf import settings

from infra.outbound_http import outbound_client
from proxy.upstreams.client import request_headers
from proxy.upstreams.decoding import BoundedBody
from tenants.principal import UpstreamTarget

logger = logging.getLogger(__name__)

#: Model ids kept per upstream, characters per id, bytes of the listing read (a hostile upstream cannot
#: fill the listing or the memory).
MAX_MODELS = 1000
MAX_ID = 200
MAX_BYTES = 4 * 1024 * 1024


def model_ids(payload: Any) -> list[str]:
    """The model ids of an OpenAI-style list (``{"data": [{"id": ...}]}``); ``[]`` for anything else."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return []
    ids = [item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)]
    return [i for i in ids if 0 < len(i) <= MAX_ID][:MAX_MODELS]


class UpstreamModels:
    """Cached model ids per upstream. ``client`` builds the HTTP client (tests inject a MockTransport)."""

    def __init__(self, client: Callable[..., httpx.AsyncClient] = outbound_client) -> None:
        self._client = client
        self._cache: dict[int, tuple[float, list[str]]] = {}
        self._fetching: dict[int, asyncio.Future[list[str]]] = {}

    async def names(self, target: UpstreamTarget) -> list[str]:
        """The upstream's model ids (cached; ``[]`` when it cannot say)."""
        hit = self._cache.get(target.upstream_id)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        pending = self._fetching.get(target.upstream_id)
        if pending is None:
            pending = self._fetching[target.upstream_id] = asyncio.ensure_future(self._fetch(target))
            pending.add_done_callback(lambda _: self._fetching.pop(target.upstream_id, None))
        return await asyncio.shield(pending)

    async def _fetch(self, target: UpstreamTarget) -> list[str]:
        ttl = settings.UPSTREAM_MODELS_CACHE_SECONDS
        try:
            names = await self._get(target)
        except Exception as exc:  # noqa: BLE001 - any failure degrades the listing to the routes
            logger.warning("models of upstream %s (id %s) not listed: %s", target.name, target.upstream_id,
                           type(exc).__name__)
            names, ttl = [], ttl / 10
        self._cache[target.upstream_id] = (time.monotonic() + ttl, names)
        return names

    async def _get(self, target: UpstreamTarget) -> list[str]:
        timeout = settings.UPSTREAM_MODELS_TIMEOUT_SECONDS
        headers = request_headers(target, stream=False)
        async with self._client(timeout=httpx.Timeout(timeout)) as client, asyncio.timeout(timeout):
            async with client.stream("GET", f"{target.base_url}/models", headers=headers) as response:
                response.raise_for_status()
                body = bytearray()
                decoded = BoundedBody(response.headers.get("content-encoding", "identity"), MAX_BYTES)
                if response.is_stream_consumed:  # a response built whole (an injected transport): its bytes
                    body += response.content[: MAX_BYTES + 1]
                else:
                    async for raw in response.aiter_raw():  # decoded in bounded pieces (proxy.upstreams.decoding)
                        for chunk in decoded.feed(raw):
                            body += chunk
                    for chunk in decoded.flush():
                        body += chunk
                if len(body) > MAX_BYTES:
                    raise ValueError(f"a model listing larger than {MAX_BYTES} bytes")
        return model_ids(json.loads(body))

    def clear(self) -> None:
        """Forget every cached listing (tests)."""
        self._cache.clear()


_models: UpstreamModels | None = None


def get_models() -> UpstreamModels:
    """The process's listing cache."""
    global _models
    if _models is None:
        _models = UpstreamModels()
    return _models


def set_models(models: UpstreamModels | None) -> None:
    """Replace the process's listing cache (tests)."""
    global _models
    _models = models
