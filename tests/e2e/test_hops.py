"""An upstream pointed back at toolrelay itself ends at the first inner request (``proxy.upstreams.hops``).

Found in review: a tenant admin set the upstream's base URL to toolrelay's own and its credential to a
toolrelay key; one client request became 1,085 requests in 4 s. Now every upstream call carries
``x-toolrelay-hops`` and a request that arrives with one is refused with a 400 (``MAX_PROXY_HOPS`` = 1),
which the outer request passes on: the client gets a clear, non-retryable error at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import ProxyServer, TenantFixture

MESSAGES = [{"role": "user", "content": "hello"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _pointed_at_itself(tenant: TenantFixture, proxy_server: ProxyServer, django_db_blocker: Any,
                       extra_headers: dict[str, str] | None = None) -> None:
    from tenants.models import Upstream
    from tenants.services import upstream_upsert

    with django_db_blocker.unblock():
        upstream = upstream_upsert(tenant=tenant.tenant, name="default", base_url=proxy_server.v1,
                                   credential=tenant.api_key)
        if extra_headers:  # a row saved before reserved names were refused: written past the validation
            upstream.set_extra_headers(extra_headers)
            Upstream.objects.filter(pk=upstream.pk).update(extra_headers_encrypted=upstream.extra_headers_encrypted)


@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("extra_headers", [None, {"x-toolrelay-hops": "0"},
                                           {"X-Toolrelay-Hops": "0", "Connection": "close"}])
def test_a_tenant_upstream_pointing_at_toolrelay_ends_at_once(make_tenant: Callable[..., TenantFixture],
                                                              proxy_server: ProxyServer, django_db_blocker: Any,
                                                              tools: list[dict[str, Any]] | None,
                                                              extra_headers: dict[str, str] | None) -> None:
    """Review (issue 24 item 1): a stored extra header ``x-toolrelay-hops: 0`` switched the loop guard off
    (1,533 requests in 5 s); toolrelay's own headers now go last and reserved stored names are dropped."""
    tenant = make_tenant()
    _pointed_at_itself(tenant, proxy_server, django_db_blocker, extra_headers)
    started = time.monotonic()
    extra = {"tools": tools} if tools else {}
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30) as client, \
            pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="deepseek-chat", messages=MESSAGES, stream=True, **extra)  # type: ignore[call-overload]
    assert "proxy_loop_detected" in str(refused.value) or "points back at toolrelay" in str(refused.value)
    assert time.monotonic() - started < 5
    from audit.models import ProxyRequest

    time.sleep(0.5)
    with django_db_blocker.unblock():
        assert ProxyRequest.objects.filter(tenant=tenant.tenant).count() <= 2  # the client's and nothing deeper


def test_a_request_from_another_toolrelay_is_refused_and_an_agents_is_not(proxy_server: ProxyServer,
                                                                         make_tenant: Callable[..., TenantFixture]
                                                                         ) -> None:
    tenant = make_tenant()
    body = {"model": "gen:text=1:calls=0:frames=2:corrupt=0", "messages": MESSAGES}
    auth = {"authorization": f"Bearer {tenant.api_key}"}
    with httpx.Client(timeout=30) as client:
        assert client.post(f"{tenant.base_url}/chat/completions", json=body, headers=auth).status_code == 200
        hop = client.post(f"{tenant.base_url}/chat/completions", json=body, headers={**auth, "x-toolrelay-hops": "1"})
        assert hop.status_code == 400 and hop.json()["error"]["code"] == "proxy_loop_detected"
        assert hop.headers["x-should-retry"] == "false"
