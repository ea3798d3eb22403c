"""Issue 24 item 3, over real sockets: one tenant's many slow streams do not stall another tenant.

The review: one httpx pool of 1,000 connections for every tenant and upstream, no default tenant
concurrency; 1,000 slow streams of tenant A and tenant B's requests took ~50 s each. Here, scaled down:
a server with a pool of 12 connections and a tenant share of 4, tenant A opens 16 long paced streams
(20 s each); at most 4 are relayed at once, the rest get a 429 ``concurrency`` after a short wait, and
tenant B is served while A's streams run (today B waits for a free connection past its client's
10 s timeout). Refused requests count against the key's rate limit too.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import ProxyServer, TenantFixture, running_proxy

SLOW = "slow:200:frame=100"  # a paced text stream of ~20 s
FAST = "gen:text=1:calls=0:frames=2:corrupt=0"


@pytest.fixture(scope="module")
def small_pool(e2e_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    log: Path = tmp_path_factory.mktemp("shares") / "serve.log"
    with running_proxy(e2e_database_url, log, UPSTREAM_MAX_CONNECTIONS="12", UPSTREAM_TENANT_CONNECTIONS="4",
                       LIMITS_CONCURRENCY_WAIT_SECONDS="0.5") as server:
        yield server


class SlowStreams:
    """``count`` streams of ``tenant`` read in threads until ``stop()``; ``statuses`` as they answer."""

    def __init__(self, base_url: str, key: str, count: int) -> None:
        self.url, self.key = f"{base_url}/chat/completions", key
        self.statuses: list[int] = []
        self.codes: list[str] = []
        self.answered = threading.Semaphore(0)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def _run(self) -> None:
        body = {"model": SLOW, "stream": True, "messages": [{"role": "user", "content": uuid.uuid4().hex}]}
        with httpx.Client(timeout=60) as client, client.stream(
                "POST", self.url, json=body, headers={"authorization": f"Bearer {self.key}"}) as response:
            self.statuses.append(response.status_code)
            if response.status_code != 200:
                response.read()
                self.codes.append(str(response.json()["error"]["code"]))
            self.answered.release()
            for _ in response.iter_bytes():
                if self._stop.is_set():
                    return

    def __enter__(self) -> SlowStreams:
        for thread in self._threads:
            thread.start()
        return self

    def wait_answered(self, count: int) -> None:
        for _ in range(count):
            assert self.answered.acquire(timeout=60), f"only {len(self.statuses)} of the streams answered"

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def test_tenant_as_slow_streams_do_not_stall_tenant_b(small_pool: ProxyServer,
                                                      make_tenant: Callable[..., TenantFixture]) -> None:
    a, b = make_tenant(), make_tenant()
    with SlowStreams(small_pool.v1, a.api_key, 16) as streams:
        streams.wait_answered(16)  # over A's share: 429 after 0.5 s; within it: streaming
        assert sorted(streams.statuses) == [200] * 4 + [429] * 12
        assert set(streams.codes) == {"concurrency"}
        with openai.OpenAI(base_url=small_pool.v1, api_key=b.api_key, max_retries=0, timeout=10) as client:
            for _ in range(3):
                done = client.chat.completions.create(model=FAST, messages=[{"role": "user", "content": "hi"}])
                assert done.choices[0].message.content


def test_refused_requests_count_against_the_keys_rpm(proxy_server: ProxyServer, django_db_blocker: Any,
                                                     make_tenant: Callable[..., TenantFixture]) -> None:
    from tenants.models import ApiKey
    from tenants.services import limits_set

    tenant = make_tenant()
    with django_db_blocker.unblock():
        limits_set(tenant=tenant.tenant, key=ApiKey.objects.filter(tenant=tenant.tenant).first(), values={"rpm": 3})
    with httpx.Client(timeout=30) as client:
        auth = {"authorization": f"Bearer {tenant.api_key}"}
        for _ in range(3):
            bad = client.post(f"{tenant.base_url}/chat/completions", headers=auth,
                              json={"model": FAST, "messages": [{"role": "user", "content": "hi"}],
                                    "tools": [{"type": "function", "function": {"name": "n" * 65}}]})
            assert bad.status_code == 400
        good = client.post(f"{tenant.base_url}/chat/completions", headers=auth,
                           json={"model": FAST, "messages": [{"role": "user", "content": "hi"}]})
    assert good.status_code == 429 and good.json()["error"]["code"] == "rpm"
