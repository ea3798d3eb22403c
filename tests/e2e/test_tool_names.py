"""Issue 24 item 2, over real sockets: long tool names are refused at once in the client's protocol.

The review: 40 declared names of 10,000 characters made the markup context build every prefix of
every name (quadratic) on the event loop, per choice and attempt: +1.2 GB and ``/healthz`` blocked
10.4 s for every tenant. Now a chat request's declared names may have at most 64 characters (as the
providers' own), Anthropic and Responses client names at most 256 (shortened to 64 and mapped back),
and the context's prefix check is linear in the names (``proxy.guard.dialects.base.Ctx``).
"""

from __future__ import annotations

import uuid
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e.conftest import ProxyServer
from tests.e2e.test_schema_bounds import PROBE_BOUND, Probe

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
LONG = 10_000


def _names(count: int = 40, length: int = LONG) -> list[str]:
    return [f"t{i:02d}_" + "x" * (length - 4) for i in range(count)]


def _messages() -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Read it [{uuid.uuid4().hex}]"}]


def test_forty_ten_thousand_character_names_get_a_chat_400_and_the_probe_never_waits(
        proxy_server: ProxyServer, make_tenant: Any) -> None:
    tenant = make_tenant()
    tools = [{"type": "function", "function": {"name": n, "parameters": SCHEMA}} for n in _names()]
    with Probe(proxy_server.url) as probe, openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key,
                                                         max_retries=0, timeout=60) as client:
        for _ in range(3):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model="gen:calls=1", messages=_messages(),  # type: ignore[call-overload]
                                               tools=tools, stream=True)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "tools[0].function.name"
    assert "10000 characters long" in error["message"] and "at most 64" in error["message"]
    assert probe.count > 0 and probe.worst < PROBE_BOUND


def test_a_64_character_chat_name_still_goes_through(make_tenant: Any) -> None:
    tenant = make_tenant()
    name = "n" * 64
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=60) as client:
        done = client.chat.completions.create(model="gen:calls=1", messages=_messages(),  # type: ignore[call-overload]
                                              tools=[{"type": "function",
                                                      "function": {"name": name, "parameters": SCHEMA}}])
    (call,) = done.choices[0].message.tool_calls or []
    assert call.function.name == name


def test_anthropic_clients_get_a_400_in_anthropics_shape(make_tenant: Any) -> None:
    tenant = make_tenant()
    with anthropic.Anthropic(base_url=tenant.base_url.removesuffix("/v1"), api_key=tenant.api_key,
                             max_retries=0, timeout=60) as client, \
            pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="gen:calls=1", max_tokens=100, messages=_messages(),  # type: ignore[arg-type]
                               tools=[{"name": n, "input_schema": SCHEMA} for n in _names()])  # type: ignore[misc]
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "10000 characters long" in body["error"]["message"]


def test_an_anthropic_name_over_64_is_still_shortened_and_mapped_back(make_tenant: Any) -> None:
    tenant = make_tenant()
    name = "mcp__server__" + "y" * 100
    with anthropic.Anthropic(base_url=tenant.base_url.removesuffix("/v1"), api_key=tenant.api_key,
                             max_retries=0, timeout=60) as client:
        done = client.messages.create(model="gen:calls=1", max_tokens=100, messages=_messages(),  # type: ignore[arg-type]
                                      tools=[{"name": name, "input_schema": SCHEMA}])  # type: ignore[list-item]
    assert [b.name for b in done.content if b.type == "tool_use"] == [name]


def test_responses_clients_get_a_400_in_openais_shape(make_tenant: Any) -> None:
    tenant = make_tenant()
    tools = [{"type": "function", "name": n, "parameters": SCHEMA} for n in _names()]
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=60) as client, \
            pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="gen:calls=1", input="read it", tools=tools)  # type: ignore[arg-type]
    error = caught.value.body
    assert isinstance(error, dict) and "10000 characters long" in error["message"]
