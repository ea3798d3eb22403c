"""``proxy.upstreams.listing``: the default upstream's own model ids, cached per upstream, degraded to
nothing when the upstream cannot say, one fetch shared by concurrent askers (MockTransport at the
HTTP seam; the real policy transport is the default and is tested in test_outbound.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from proxy.upstreams.listing import MAX_ID, UpstreamModels, model_ids
from tenants import crypto
from tenants.principal import UpstreamTarget

TARGET = UpstreamTarget(upstream_id=1, name="u", base_url="http://upstream.test/v1", model="",
                        credential_encrypted="", extra_headers_encrypted="", connect_timeout=1,
                        first_byte_timeout=1, idle_timeout=1)
LISTING = {"object": "list", "data": [{"id": "deepseek-chat", "object": "model"},
                                      {"id": "deepseek-reasoner", "object": "model"}]}


def factory(handler: Callable[[httpx.Request], Any], calls: list[str]) -> Callable[..., httpx.AsyncClient]:
    async def wrapped(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        answer = handler(request)
        return await answer if asyncio.iscoroutine(answer) else answer

    return lambda **kwargs: httpx.AsyncClient(transport=httpx.MockTransport(wrapped), **kwargs)


async def test_it_lists_and_caches(settings: Any) -> None:
    calls: list[str] = []
    models = UpstreamModels(factory(lambda r: httpx.Response(200, json=LISTING), calls))
    assert await models.names(TARGET) == ["deepseek-chat", "deepseek-reasoner"]
    assert await models.names(TARGET) == ["deepseek-chat", "deepseek-reasoner"]
    assert calls == ["http://upstream.test/v1/models"]


async def test_a_failing_upstream_gives_no_names_and_is_asked_again_sooner(settings: Any) -> None:
    settings.UPSTREAM_MODELS_CACHE_SECONDS = 0.5
    calls: list[str] = []
    answers = iter([httpx.Response(503, json={"error": "down"}), httpx.Response(200, json=LISTING)])
    models = UpstreamModels(factory(lambda r: next(answers), calls))
    assert await models.names(TARGET) == []
    assert await models.names(TARGET) == [] and len(calls) == 1, "the failure is cached"
    await asyncio.sleep(0.06)
    assert await models.names(TARGET) == ["deepseek-chat", "deepseek-reasoner"]


async def test_a_slow_upstream_is_cut_at_the_timeout(settings: Any) -> None:
    settings.UPSTREAM_MODELS_TIMEOUT_SECONDS = 0.1

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, json=LISTING)

    started = asyncio.get_running_loop().time()
    assert await UpstreamModels(factory(slow, [])).names(TARGET) == []
    assert asyncio.get_running_loop().time() - started < 1


async def test_concurrent_askers_share_one_fetch() -> None:
    calls: list[str] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        return httpx.Response(200, json=LISTING)

    models = UpstreamModels(factory(answer, calls))
    results = await asyncio.gather(*(models.names(TARGET) for _ in range(5)))
    assert all(r == ["deepseek-chat", "deepseek-reasoner"] for r in results) and len(calls) == 1


async def test_it_sends_the_upstreams_credential() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization", ""))
        return httpx.Response(200, json=LISTING)

    target = dataclasses.replace(TARGET, credential_encrypted=crypto.encrypt("sk-upstream-listing"))
    await UpstreamModels(factory(answer, [])).names(target)
    assert seen == ["Bearer sk-upstream-listing"]


@pytest.mark.parametrize("payload", [None, [], {"data": "x"}, {"data": [1, {"id": 2}, {"id": ""}]},
                                     {"models": [{"name": "llama3"}]}])
def test_anything_but_a_model_list_gives_nothing(payload: Any) -> None:
    assert model_ids(payload) == []


def test_ids_are_bounded() -> None:
    assert model_ids({"data": [{"id": "x" * (MAX_ID + 1)}, {"id": "ok"}]}) == ["ok"]
    assert len(model_ids({"data": [{"id": f"m{i}"} for i in range(5000)]})) == 1000


async def test_a_huge_listing_is_refused() -> None:
    body = json.dumps({"data": [{"id": "m" * 100} for _ in range(60000)]}).encode()
    assert await UpstreamModels(factory(lambda r: httpx.Response(200, content=body), [])).names(TARGET) == []
