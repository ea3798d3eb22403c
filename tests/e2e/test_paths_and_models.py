"""Base URLs and model pickers, through the running proxy with the official SDKs.

A client whose base URL lacks ``/v1``, repeats it or misspells a path gets a JSON 404 in its own
protocol that names the path it meant, whatever the method; ``/v1/models`` lists the tenant's routes
and then its default upstream's own models (the simulator serves ``/v1/models``), and only the routes
when that upstream cannot be asked.
"""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

SIMULATOR_MODELS = ["gen", "gen:reasoning=1", "text:30", "slow:50"]


def _routes(tenant: Any, django_db_blocker: Any, *names: str) -> None:
    from tenants.services import route_upsert

    with django_db_blocker.unblock():
        for name in names:
            route_upsert(tenant=tenant.tenant, public_name=name, upstream=tenant.upstream, upstream_model="m")


def test_openai_python_lists_the_routes_then_the_upstreams_models(make_tenant: Any, django_db_blocker: Any) -> None:
    tenant = make_tenant()
    _routes(tenant, django_db_blocker, "coder", "claude-*", "gen")
    client = openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30)
    ids = [m.id for m in client.models.list()]
    assert ids[:2] == ["coder", "gen"], "exact routes first (a glob is no model id)"
    assert ids[2:5] == SIMULATOR_MODELS[1:4] and ids.count("gen") == 1, "then the upstream's own, once each"
    assert any(i.startswith("case:") for i in ids)


def test_anthropic_python_lists_them_in_anthropics_format(make_tenant: Any, proxy_server: Any,
                                                          django_db_blocker: Any) -> None:
    tenant = make_tenant()
    _routes(tenant, django_db_blocker, "claude-sonnet-4-5")
    client = anthropic.Anthropic(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0, timeout=30)
    page = client.models.list()
    ids = [m.id for m in page.data]
    assert ids[:1 + len(SIMULATOR_MODELS)] == ["claude-sonnet-4-5", *SIMULATOR_MODELS]
    assert page.data[0].type == "model" and page.data[0].display_name == "claude-sonnet-4-5"
    assert page.has_more is False and page.first_id == "claude-sonnet-4-5" and page.last_id == ids[-1]


def test_an_upstream_that_cannot_list_leaves_the_routes(make_tenant: Any, django_db_blocker: Any) -> None:
    tenant = make_tenant()
    _routes(tenant, django_db_blocker, "coder")
    with django_db_blocker.unblock():
        tenant.upstream.base_url = "http://127.0.0.1:9/v1"  # the discard port: connection refused
        tenant.upstream.save()
    client = openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30)
    started = time.monotonic()
    assert [m.id for m in client.models.list()] == ["coder"]
    assert time.monotonic() - started < 5


def test_openai_python_without_v1_in_its_base_url_is_told_the_path(make_tenant: Any, proxy_server: Any) -> None:
    tenant = make_tenant()
    client = openai.OpenAI(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0, timeout=30)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gen", messages=[{"role": "user", "content": "hi"}])
    assert "did you mean POST /v1/chat/completions?" in caught.value.message
    assert "base URL ending in /v1" in caught.value.message
    assert caught.value.code == "unknown_url"


def test_anthropic_python_with_v1_twice_is_told_the_path(make_tenant: Any, proxy_server: Any) -> None:
    tenant = make_tenant()
    client = anthropic.Anthropic(base_url=f"{proxy_server.url}/v1", api_key=tenant.api_key, max_retries=0,
                                 timeout=30)
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="gen", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert "did you mean POST /v1/messages?" in body["error"]["message"] and "drop one" in body["error"]["message"]


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize(("path", "meant"), [("/v1/chat/completion", "/v1/chat/completions"),
                                             ("/messages", "/v1/messages"), ("/responses", "/v1/responses"),
                                             ("/v1/v1/messages", "/v1/messages")])
def test_any_method_on_an_unknown_path_gets_the_json_404(proxy_server: Any, method: str, path: str,
                                                         meant: str) -> None:
    response = httpx.request(method, f"{proxy_server.url}{path}", json={})
    assert response.status_code == 404 and response.headers["content-type"].startswith("application/json")
    assert f"did you mean POST {meant}?" in response.json()["error"]["message"]


def test_the_404_speaks_anthropic_to_an_anthropic_caller(proxy_server: Any) -> None:
    for headers in ({"anthropic-version": "2023-06-01"}, {"x-api-key": "tr-whatever"}):
        response = httpx.post(f"{proxy_server.url}/v1/message", headers=headers, json={})
        assert response.status_code == 404
        assert response.json()["type"] == "error" and response.json()["error"]["type"] == "not_found_error"
    openai_shape = httpx.post(f"{proxy_server.url}/v1/message", headers={"authorization": "Bearer tr-x"}, json={})
    assert set(openai_shape.json()["error"]) == {"message", "type", "param", "code"}


def test_a_known_path_with_the_wrong_method_is_still_405(proxy_server: Any) -> None:
    assert httpx.get(f"{proxy_server.url}/v1/chat/completions").status_code == 405
