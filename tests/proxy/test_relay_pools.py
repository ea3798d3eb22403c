"""The relay with a credential pool (httpx.MockTransport at the HTTP seam): a key refused within a request is
replaced at once by the pool's other key, without the refused key's wait; the audit and the client never
see a pool key."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from infra.shared_state import MemoryState, reset_state
from proxy.guard.checks.request import prepare
from proxy.guard.protocols.emit_openai import OpenAIChatEmitter
from proxy.relay.loop import RelayCall
from proxy.routing.router import Router
from proxy.upstreams.client import UpstreamClient
from tenants.auth import principal_for_key
from tenants.services import provision, upstream_key_add
from tests.proxy.test_relay import CALL, DONE, FINISH_CALLS, TOOLS, run

pytestmark = pytest.mark.django_db(transaction=True)

FIRST, SECOND = "sk-pool-relay-first-0001", "sk-pool-relay-second-0002"


@pytest.fixture(autouse=True)
async def _fresh_state() -> AsyncIterator[None]:
    reset_state(MemoryState())
    yield
    reset_state(None)
    await sync_to_async(connections.close_all)()


def _call() -> RelayCall:
    done = provision(tenant_name="relay-pools", upstream_url="http://upstream.test/v1", upstream_key=FIRST)
    upstream_key_add(upstream=done.upstream, raw=SECOND)
    principal = principal_for_key(done.raw_key or "")
    assert principal is not None
    plan = principal.resolve("m")
    assert plan is not None
    body: dict[str, Any] = {"model": "m", "stream": True, "tools": TOOLS,
                            "messages": [{"role": "user", "content": "hi"}]}
    return RelayCall(principal=principal, plan=plan, request=prepare(body),
                     emitter=OpenAIChatEmitter(model="m", include_usage=False))


@pytest.mark.parametrize("status", [401, 429])
async def test_a_refused_key_is_replaced_by_the_pools_other_key_at_once(status: int) -> None:
    seen: list[str] = []
    refused: set[str] = set()

    async def handler(request: httpx.Request) -> httpx.Response:
        key = request.headers["authorization"].removeprefix("Bearer ")
        seen.append(key)
        if not refused or key in refused:
            refused.add(key)
            error = {"error": {"message": f"refused {key}", "type": "x"}}
            return httpx.Response(status, headers={"retry-after": "600", "content-type": "application/json"},
                                  stream=httpx.ByteStream(json.dumps(error).encode()))
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=httpx.ByteStream(CALL + FINISH_CALLS + DONE))

    call = await sync_to_async(_call)()
    call.router = await Router.read(call.plan, tenant_id=call.principal.tenant_id)
    recorder, _ = await run(call, UpstreamClient(transport=httpx.MockTransport(handler)))
    assert recorder.status == 200 and recorder.tool_names() == ["get_weather"]
    assert len(seen) == 2 and set(seen) == {FIRST, SECOND}  # no wait of 600 s either: the test would hang
    assert FIRST not in recorder.body.decode() and SECOND not in recorder.body.decode()
    later = await Router.read(call.plan, tenant_id=call.principal.tenant_id)
    target = call.plan.targets[0]
    good = next(k[0] for k in target.keys if (k[0] == "0") != (seen[0] == FIRST))  # "0" is FIRST, its own
    assert {later.pick(target).key_id for _ in range(20)} == {good}, "the next requests use the other key"
