"""/metrics under a real Daphne: a model string a client sends never becomes a label value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.e2e.conftest import ProxyServer, TenantFixture


def test_a_client_model_string_never_reaches_the_metrics(make_tenant: Callable[..., TenantFixture],
                                                         proxy_server: ProxyServer) -> None:
    """Requests for a made-up model are counted (by tenant), and the name appears in no series."""
    tenant = make_tenant()
    model = "client-invented-model-5d1e"
    body: dict[str, Any] = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=30) as http:
        for _ in range(2):
            answer = http.post(f"{tenant.base_url}/chat/completions", json=body,
                               headers={"Authorization": f"Bearer {tenant.api_key}"})
            assert answer.status_code == 200
        text = http.get(f"{proxy_server.url}/metrics").text
    # By its slug, or as "other" once the shared server has seen LABEL_VALUES_MAX tenants (the label's bound;
    # earlier tests of the run make tenants of their own on the same server).
    assert f'tenant="{tenant.tenant.slug}"' in text or 'tenant="other"' in text
    assert model not in text
