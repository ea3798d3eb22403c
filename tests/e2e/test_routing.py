"""Credential pools and circuits over a real ``manage.py serve`` with Redis as the shared state, the
simulator as upstream and openai-python as the client, set up and read as an operator would
(``manage.py upstreams add`` / ``upstreams status --json``; docs/routing.md)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.conftest import ALLOW_LOOPBACK, ROOT, ProxyServer, running_proxy

REDIS = "redis://127.0.0.1:6379/6"
PREFIX = f"toolrelay-e2e-routing-{uuid.uuid4().hex[:8]}:"
SERVER = {
    "REDIS_URL": REDIS,
    "LIMITS_KEY_PREFIX": PREFIX,
    "ROUTING_CIRCUIT_FAILURES": "2",
    "ROUTING_CIRCUIT_COOLDOWN_SECONDS": "120",
    "LIMITS_REDIS_TIMEOUT_SECONDS": "2",  # a loaded test machine: the shared state must not fail open mid-test
}


@pytest.fixture(scope="module")
def server(e2e_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    log = tmp_path_factory.mktemp("routing") / "serve.log"
    with running_proxy(e2e_database_url, log, listening=None, **SERVER) as proxy:
        yield proxy


def manage(database_url: str, *args: str) -> str:
    env = {**os.environ, "DATABASE_URL": database_url, "UPSTREAM_ALLOW_NETWORKS": ALLOW_LOOPBACK, **SERVER}
    return subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "manage.py", args[0], "--skip-checks", *args[1:]],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def tenant(database_url: str) -> tuple[str, str]:
    """A fresh tenant (name, raw API key) without upstreams."""
    from tenants.services import api_key_create, tenant_ensure

    owner, _ = tenant_ensure(name=f"r-{uuid.uuid4().hex[:10]}")
    _, raw = api_key_create(tenant=owner, name="routing")
    return owner.name, raw


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def ask(server: ProxyServer, api_key: str, model: str, marker: str) -> None:
    with openai.OpenAI(base_url=server.v1, api_key=api_key, max_retries=0) as client:
        answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": marker}])
    assert answer.choices[0].message is not None


def settled(owner: Any, count: int) -> list[Any]:
    """The tenant's ``count`` audit rows, oldest first, once all are written (the journal is asynchronous)."""
    from audit.models import ProxyRequest

    deadline = time.monotonic() + 15
    while True:
        rows = list(ProxyRequest.objects.filter(tenant=owner).exclude(outcome="pending").order_by("created"))
        attempts = sum(r.attempt_rows.count() for r in rows)
        if len(rows) >= count and attempts >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def calls(simulator: Any, marker: str) -> list[dict[str, Any]]:
    return [r for r in simulator.stats()["requests"] if marker in json.dumps(r.get("body", {}))]


def test_a_key_answering_429_sends_the_next_requests_to_the_pools_other_key(
    server: ProxyServer, simulator: Any, e2e_database_url: str
) -> None:
    name, api_key = tenant(e2e_database_url)
    out = manage(
        e2e_database_url,
        "upstreams",
        "add",
        "--tenant",
        name,
        "--name",
        "sim",
        "--url",
        simulator.url,
        "--key",
        "sk-pool-a",
        "--key",
        "sk-pool-b",
    )
    assert "2 key(s) added" in out
    again = manage(
        e2e_database_url,
        "upstreams",
        "add",
        "--tenant",
        name,
        "--name",
        "sim",
        "--url",
        simulator.url,
        "--key",
        "sk-pool-b",
    )
    assert "0 key(s) added, 1 already in the pool" in again
    from tenants.models import Tenant
    from tenants.selectors import upstreams_for_tenant
    from tenants.services import route_upsert

    owner = Tenant.objects.get(name=name)
    route_upsert(
        tenant=owner,
        public_name="m",
        upstream=upstreams_for_tenant(owner).get(name="sim"),
        upstream_model="http:429:retry-after=600:broken=1",
    )
    marker = uuid.uuid4().hex
    ask(server, api_key, "m", marker)  # 429 on its first key, answered at once on the other
    first, second = calls(simulator, marker)
    assert first["status"] == 429 and second["status"] == 200
    assert {first["authorization_sha256"], second["authorization_sha256"]} == {sha("sk-pool-a"), sha("sk-pool-b")}
    for _ in range(6):
        ask(server, api_key, "m", marker)  # the same conversation: past its one 429
    later = calls(simulator, marker)[2:]
    assert len(later) == 6
    assert {c["authorization_sha256"] for c in later} == {second["authorization_sha256"]}
    status = json.loads(manage(e2e_database_url, "upstreams", "status", "--tenant", name, "--json"))
    (upstream,) = status["upstreams"]
    assert upstream["name"] == "sim" and upstream["circuit"] == "closed" and upstream["broken_rate"] == {}
    states = {k["state"] for k in upstream["keys"]}
    assert states == {"ok", "cooling"}
    cooling = next(k for k in upstream["keys"] if k["state"] == "cooling")
    assert cooling["until"] is not None
    settled(owner, 7)


def test_a_dead_upstream_opens_its_circuit_and_later_requests_go_to_the_fallback_at_once(
    server: ProxyServer, simulator: Any, e2e_database_url: str
) -> None:
    from tenants.models import RouteFallback, Tenant
    from tenants.services import route_upsert, upstream_upsert

    dead = socket.socket()  # accepts connections (the backlog) and never answers: every call times out
    dead.bind(("127.0.0.1", 0))
    dead.listen(64)
    try:
        name, api_key = tenant(e2e_database_url)
        owner = Tenant.objects.get(name=name)
        primary = upstream_upsert(tenant=owner, name="dead", base_url=f"http://127.0.0.1:{dead.getsockname()[1]}/v1")
        primary.first_byte_timeout = 0.5
        primary.save()
        spare = upstream_upsert(tenant=owner, name="spare", base_url=simulator.url, credential="sk-spare")
        route = route_upsert(tenant=owner, public_name="m", upstream=primary, upstream_model="gen")
        RouteFallback.objects.create(route=route, position=1, upstream=spare, model="gen")
        for _ in range(2):  # each pays the dead upstream's timeout, then the fallback answers
            ask(server, api_key, "m", uuid.uuid4().hex)
        status = json.loads(manage(e2e_database_url, "upstreams", "status", "--tenant", name, "--json"))
        circuits = {u["name"]: u["circuit"] for u in status["upstreams"]}
        assert circuits == {"dead": "open", "spare": "closed"}
        markers = [uuid.uuid4().hex for _ in range(5)]
        for marker in markers:
            ask(server, api_key, "m", marker)
        rows = settled(owner, 7)
        for row in rows[2:]:  # after the circuit opened: one attempt, on the fallback
            assert [a.upstream_id for a in row.attempt_rows.all()] == [spare.pk], row.id
    finally:
        dead.close()

