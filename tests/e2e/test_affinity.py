"""Session affinity over a real ``manage.py serve`` (Redis as the shared state, the simulator as both
upstreams, openai-python as the client): a 20-turn agent session keeps one upstream and one key of a
3-key pool while they are healthy, named by the client's session header or by the conversation's chain
alone; when its key fails it moves, and the move is recorded (docs/routing.md, "Session affinity")."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.conftest import ProxyServer, running_proxy
from tests.e2e.test_routing import SERVER, calls, settled, tenant

TOOLS = [{"type": "function", "function": {"name": "run", "description": "Run a shell command.",
                                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                          "required": ["cmd"]}}}]
TURNS = 20


@pytest.fixture(scope="module")
def server(e2e_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    log = tmp_path_factory.mktemp("affinity") / "serve.log"
    with running_proxy(e2e_database_url, log, listening=None, **{**SERVER, "LOG_LEVEL": "INFO"}) as proxy:
        yield proxy


def pooled_route(database_url: str, simulator: Any, model: str) -> tuple[Any, str, dict[str, str]]:
    """A tenant whose route ``m`` has two targets (``one``, then the fallback ``two``), each upstream a
    3-key pool on the simulator; returns the tenant, its API key and each key's owner by its digest."""
    from tenants.models import RouteFallback, Tenant
    from tenants.selectors import upstreams_for_tenant
    from tenants.services import route_upsert, upstream_key_add, upstream_upsert
    from tests.e2e.test_routing import sha

    name, api_key = tenant(database_url)
    owner = Tenant.objects.get(name=name)
    keys: dict[str, str] = {}
    for upstream_name in ("one", "two"):
        upstream_upsert(tenant=owner, name=upstream_name, base_url=simulator.url)
        upstream = upstreams_for_tenant(owner).get(name=upstream_name)
        for i in range(3):
            raw = f"sk-{upstream_name}-{i}-{uuid.uuid4().hex[:6]}"
            upstream_key_add(upstream=upstream, raw=raw)
            keys[sha(raw)] = f"{upstream_name}/{i}"
    one, two = (upstreams_for_tenant(owner).get(name=n) for n in ("one", "two"))
    route = route_upsert(tenant=owner, public_name="m", upstream=one, upstream_model=model)
    RouteFallback.objects.create(route=route, position=1, upstream=two, model=model)
    return owner, api_key, keys


def session(server: ProxyServer, api_key: str, marker: str, turns: int, *, header: str | None) -> None:
    """An agent session of ``turns`` tool turns: each answer's calls get results and the history grows."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {marker}"}]
    extra = {"x-session-id": header} if header else {}
    with openai.OpenAI(base_url=server.v1, api_key=api_key, max_retries=0, default_headers=extra) as client:
        for turn in range(turns):
            answer = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
            message = answer.choices[0].message
            assert message.tool_calls, message
            messages.append(message.model_dump(exclude_none=True))
            # Results differ turn by turn: the generator may repeat a call, and a call repeated with the
            # same result three times is a loop that toolrelay stops (docs/loops.md).
            messages += [{"role": "tool", "tool_call_id": c.id, "content": f"ok {turn}"} for c in message.tool_calls]


def used(simulator: Any, marker: str, keys: dict[str, str]) -> list[str]:
    return [keys.get(c["authorization_sha256"], "?") for c in calls(simulator, marker)]


@pytest.mark.parametrize("by", ["header", "chain"])
def test_a_20_turn_session_keeps_one_upstream_and_one_key_while_healthy(
    server: ProxyServer, simulator: Any, e2e_database_url: str, by: str
) -> None:
    owner, api_key, keys = pooled_route(e2e_database_url, simulator, "gen:rounds=100:corrupt=0")
    marker = uuid.uuid4().hex
    session(server, api_key, marker, TURNS, header=f"s-{marker}" if by == "header" else None)
    seen = used(simulator, marker, keys)
    assert len(seen) == TURNS
    assert len(set(seen)) == 1, seen
    settled(owner, TURNS)  # the journal written before the test's tables are emptied


def test_a_session_whose_key_fails_moves_to_another_key_and_the_move_is_recorded(
    server: ProxyServer, simulator: Any, e2e_database_url: str
) -> None:
    from tenants.models import ModelRoute

    owner, api_key, keys = pooled_route(e2e_database_url, simulator, "gen:rounds=100:corrupt=0")
    marker = uuid.uuid4().hex
    header = f"s-{marker}"
    session(server, api_key, marker, 3, header=header)
    (before,) = set(used(simulator, marker, keys))
    ModelRoute.objects.filter(tenant=owner).update(upstream_model="http:429:retry-after=600:broken=1")
    time.sleep(1.5)  # the server's principal cache (AUTH_CACHE_SECONDS)
    session(server, api_key, f"{marker} again", 1, header=header)
    refused, moved = calls(simulator, f"{marker} again")[-2:]
    assert refused["status"] == 429 and keys[refused["authorization_sha256"]] == before
    after = keys[moved["authorization_sha256"]]
    assert moved["status"] == 200 and after != before
    deadline = time.monotonic() + 10
    while "session moved" not in server.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = [line for line in server.log.read_text().splitlines() if "session moved" in line]
    assert lines, "the move is logged"
    assert json.dumps(lines)  # the line names upstream ids and key ids, never a secret
    assert not any("sk-" in line for line in lines)
    settled(owner, 4)
    from audit.models import Finding

    (recorded,) = Finding.objects.filter(tenant_id_copy=owner.pk, kind="session-moved").select_related("request")
    assert recorded.request.attempts == 2 and recorded.attempt_id is None  # the request's, on its page
    source, _, to = recorded.detail.partition(": from ")[2].partition(" to ")
    assert source.startswith("one key ") and to.startswith(("one key ", "two key ")) and "sk-" not in recorded.detail
