"""Limits through the running proxy (issue 14 items 1 and 4, issue 15 item 6), over real sockets.

openai-python (Chat and Responses) and anthropic-python with ``max_retries=0`` see a 429 as their
``RateLimitError`` with the retry delay; spent budgets are ``insufficient_quota`` with
``x-should-retry: false``; a disabled tenant's key gets the unknown key's 401; wrong keys are throttled
per address while a valid key from the same address is served. Two Daphne processes on one private
Redis share one rpm limit and refuse a revoked key within 1 s, and stopping that Redis mid-test changes
nothing for the client.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import ROOT, TenantFixture, running_proxy

MODEL = "gen:text=1:calls=0:frames=3:frame=10:corrupt=0"
MESSAGES = [{"role": "user", "content": "hello"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _limits(django_db_blocker: Any, tenant: TenantFixture, *, key: bool = False, **values: int | None) -> None:
    from tenants.models import ApiKey
    from tenants.services import limits_set

    with django_db_blocker.unblock():
        row = ApiKey.objects.filter(tenant=tenant.tenant).first() if key else None
        limits_set(tenant=tenant.tenant, key=row, values=values)


_CLIENTS: list[Any] = []


@pytest.fixture(autouse=True)
def _clients_closed() -> Iterator[None]:
    """SDK clients made by a test are closed after it: a client left to the garbage collector closes its
    sockets during some later test, whose unraisable ResourceWarning then fails it."""
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def _openai(tenant: TenantFixture, base_url: str | None = None) -> openai.OpenAI:
    client = openai.OpenAI(base_url=base_url or tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30)
    _CLIENTS.append(client)
    return client


def _chat(tenant: TenantFixture, base_url: str | None = None) -> Any:
    return _openai(tenant, base_url).chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES)


def test_openai_chat_gets_rate_limit_error_with_retry_after(make_tenant: Callable[..., TenantFixture],
                                                            django_db_blocker: Any) -> None:
    tenant = make_tenant()
    _limits(django_db_blocker, tenant, key=True, rpm=2)
    with _openai(tenant).chat.completions.with_streaming_response.create(  # the guarded path commits its stream
            model="gen:calls=1:corrupt=0", messages=MESSAGES, stream=True, tools=TOOLS) as guarded:
        assert guarded.headers["x-ratelimit-remaining-requests"] == "1"
        assert "get_weather" in "".join(guarded.iter_lines())
    served = _chat(tenant)
    assert served.headers["x-ratelimit-limit-requests"] == "2"
    assert served.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as refused:
        _chat(tenant)
    exc = refused.value
    assert exc.status_code == 429 and exc.code == "rpm" and exc.type == "rate_limit_exceeded"
    assert 1 <= int(exc.response.headers["retry-after"]) <= 60
    assert exc.response.headers["x-should-retry"] == "true"
    assert exc.response.headers["x-ratelimit-remaining-requests"] == "0"


def test_a_refused_request_is_audited_as_a_limit_hit(make_tenant: Callable[..., TenantFixture],
                                                     django_db_blocker: Any, audit_rows: Any) -> None:
    """A 429 of a limit is a request row (outcome rejected, status 429, no attempt, the limit in its
    error), so the usage page counts the limits hit; the upstream was never asked."""
    tenant = make_tenant()
    _limits(django_db_blocker, tenant, rpm=1)
    _chat(tenant)
    with pytest.raises(openai.RateLimitError) as refused:
        _chat(tenant)
    row = audit_rows(refused.value.response.headers["x-request-id"])
    assert (row.outcome, row.status, row.attempts) == ("rejected", 429, 0)
    assert "rpm" in row.error or "requests per minute" in row.error
    with django_db_blocker.unblock():
        assert not row.attempt_rows.exists()


def test_openai_streams_carry_the_headers_and_a_spent_budget_is_not_retryable(
        make_tenant: Callable[..., TenantFixture], django_db_blocker: Any) -> None:
    tenant = make_tenant()
    _limits(django_db_blocker, tenant, rpm=10, daily_tokens=1)
    with _openai(tenant).chat.completions.with_streaming_response.create(
            model=MODEL, messages=MESSAGES, stream=True) as response:
        assert response.headers["x-ratelimit-remaining-requests"] == "9"
        assert "".join(response.iter_lines())
    for _ in range(50):  # the budget is settled from the answer's tokens just after it ends
        try:
            _chat(tenant)
        except openai.RateLimitError as exc:
            assert exc.code == "daily_tokens" and exc.type == "insufficient_quota"
            assert exc.response.headers["x-should-retry"] == "false"
            assert "retry-after" not in exc.response.headers
            return
        time.sleep(0.05)
    raise AssertionError("the daily token budget was never spent")


def test_anthropic_gets_rate_limit_error_with_its_headers(proxy_server: Any, make_tenant: Callable[..., TenantFixture],
                                                          django_db_blocker: Any) -> None:
    tenant = make_tenant()
    _limits(django_db_blocker, tenant, rpm=1, tpm=100_000)
    client = anthropic.Anthropic(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0, timeout=30)
    _CLIENTS.append(client)
    served = client.messages.with_raw_response.create(model=MODEL, max_tokens=50, messages=MESSAGES)
    assert served.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert served.headers["anthropic-ratelimit-tokens-limit"] == "100000"
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(model=MODEL, max_tokens=50, messages=MESSAGES)
    exc = refused.value
    assert exc.status_code == 429 and exc.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert 1 <= int(exc.response.headers["retry-after"]) <= 60
    assert exc.response.headers["anthropic-ratelimit-requests-limit"] == "1"
    assert exc.response.headers["anthropic-ratelimit-requests-reset"].endswith("Z")


def test_responses_gets_rate_limit_error(make_tenant: Callable[..., TenantFixture], django_db_blocker: Any) -> None:
    tenant = make_tenant()
    _limits(django_db_blocker, tenant, key=True, rpm=0)
    with pytest.raises(openai.RateLimitError) as refused:
        _openai(tenant).responses.create(model=MODEL, input="hello", stream=True)
    assert refused.value.code == "rpm" and "retry-after" in refused.value.response.headers


def test_concurrency_over_the_cap_waits_then_is_served(make_tenant: Callable[..., TenantFixture],
                                                       django_db_blocker: Any) -> None:
    """Three streams at once on a key capped at one: each waits its turn in the key's queue (2 s bound)."""
    import concurrent.futures

    tenant = make_tenant()
    _limits(django_db_blocker, tenant, key=True, concurrency=1)
    slow = "gen:text=1:calls=0:frames=3:frame=10:corrupt=0:ttft=300"  # 300 ms to the first byte
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: _openai(tenant).chat.completions.create(
            model=slow, messages=MESSAGES).choices[0].finish_reason, range(3)))
    assert results == ["stop"] * 3
    assert time.monotonic() - started >= 0.6  # one at a time: at least three first-byte delays, not one


def test_a_disabled_tenants_key_gets_the_unknown_keys_401(make_tenant: Callable[..., TenantFixture],
                                                          django_db_blocker: Any) -> None:
    tenant = make_tenant()
    with django_db_blocker.unblock():
        tenant.tenant.active = False
        tenant.tenant.save()
    answers = []
    for key in (tenant.api_key, "tr-unknownprefx-" + "x" * 43):
        response = httpx.post(f"{tenant.base_url}/chat/completions", json={"model": MODEL, "messages": MESSAGES},
                              headers={"authorization": f"Bearer {key}"}, timeout=10)
        error = response.json()["error"]
        answers.append((response.status_code, error["type"], error["code"], error["message"].split(" (request id")[0]))
    assert answers[0] == answers[1] == (401, "authentication_error", "invalid_api_key", "invalid API key")


# ----- wrong keys, two processes and Redis: servers of their own -----

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def private_redis() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of this test's own (the test stops it; never the shared one)."""
    port = _free_port()
    process = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],  # noqa: S603, S607
                               stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0", process
    process.kill()
    process.wait()


def test_wrong_keys_are_throttled_per_address_and_valid_keys_never(
        e2e_database_url: str, tmp_path: Path, make_tenant: Callable[..., TenantFixture]) -> None:
    tenant = make_tenant()
    with running_proxy(e2e_database_url, tmp_path / "serve.log", WRONG_KEY_LIMIT_PER_MINUTE="3",
                       TRUSTED_PROXY_COUNT="1") as server:
        def send(key: str, address: str) -> httpx.Response:
            return httpx.post(f"{server.v1}/chat/completions", json={"model": MODEL, "messages": MESSAGES},
                              headers={"authorization": f"Bearer {key}", "x-forwarded-for": f"6.6.6.6, {address}"},
                              timeout=10)

        wrong = [send(f"tr-{uuid.uuid4().hex[:12]}-{'y' * 43}", "203.0.113.7").status_code for _ in range(5)]
        assert wrong == [401, 401, 401, 429, 429]
        throttled = send("not-even-a-key", "203.0.113.7")
        assert throttled.json()["error"]["code"] == "wrong_key_throttled" and int(throttled.headers["retry-after"]) >= 1
        assert send(tenant.api_key, "203.0.113.7").status_code == 200  # the same NAT, a valid key: served
        assert send("bad", "198.51.100.9").status_code == 401  # another address: not throttled


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**os.environ, **env},  # noqa: S603
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_two_processes_share_limits_and_revocations_through_redis(
        e2e_database_url: str, tmp_path: Path, make_tenant: Callable[..., TenantFixture],
        private_redis: tuple[str, subprocess.Popen[bytes]], django_db_blocker: Any) -> None:
    url, redis_process = private_redis
    env = {"REDIS_URL": url, "LIMITS_KEY_PREFIX": f"e2e:{uuid.uuid4().hex}:", "AUTH_CACHE_SECONDS": "60",
           "LIMITS_REDIS_TIMEOUT_SECONDS": "0.5"}  # generous on a loaded test box; 50 ms is the default
    limited, free = make_tenant(), make_tenant()
    _limits(django_db_blocker, limited, key=True, rpm=3)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with running_proxy(e2e_database_url, tmp_path / "a" / "serve.log", **env) as one, \
            running_proxy(e2e_database_url, tmp_path / "b" / "serve.log", **env) as two:
        served = [_chat(limited, one.v1), _chat(limited, two.v1), _chat(limited, one.v1)]
        assert [r.headers["x-ratelimit-remaining-requests"] for r in served] == ["2", "1", "0"]
        with pytest.raises(openai.RateLimitError):
            _chat(limited, two.v1)  # the other process knows the three requests of the first

        for server in (one, two):  # both know (and cache, for 60 s) the free key
            assert _chat(free, server.v1).http_response.status_code == 200
        prefix = free.api_key.split("-")[1]
        _manage({"DATABASE_URL": e2e_database_url, **env}, "apikey", "--skip-checks", "revoke",
                "--tenant", free.tenant.name, prefix)
        revoked_at = time.monotonic()
        refused = set()
        while len(refused) < 2 and time.monotonic() - revoked_at < 1.0:
            for server in (one, two):
                if server.port not in refused:
                    try:
                        _chat(free, server.v1)
                    except openai.AuthenticationError:
                        refused.add(server.port)
            time.sleep(0.02)
        assert len(refused) == 2, f"refused by {len(refused)} of 2 processes within 1 s"

        other = make_tenant()
        _limits(django_db_blocker, other, key=True, rpm=1000, concurrency=5)
        assert _chat(other, one.v1).http_response.status_code == 200
        redis_process.kill()  # Redis gone mid-test: the limits fail open, the clients notice nothing
        redis_process.wait()
        for server in (one, two, one, two):
            started = time.monotonic()
            response = _chat(other, server.v1)
            assert response.http_response.status_code == 200
            assert time.monotonic() - started < 5  # generous: no wait on a dead Redis
        metrics = httpx.get(f"{one.url}/metrics", timeout=5).text
        assert any(line.startswith("toolrelay_limits_fail_open_total") and not line.endswith(" 0.0")
                   for line in metrics.splitlines())


def test_two_processes_behind_one_port_hold_one_limit(
        e2e_database_url: str, tmp_path: Path, make_tenant: Callable[..., TenantFixture],
        private_redis: tuple[str, subprocess.Popen[bytes]], django_db_blocker: Any) -> None:
    """Two ``manage.py serve --fd`` processes accepting on one listening socket (what a supervisor or
    compose's replicas behind the reverse proxy look like to a client): every request on a fresh
    connection, whichever process accepts it, counts against the key's one rpm limit in Redis."""
    url, _ = private_redis
    env = {"REDIS_URL": url, "LIMITS_KEY_PREFIX": f"e2e:{uuid.uuid4().hex}:", "LIMITS_REDIS_TIMEOUT_SECONDS": "0.5"}
    limited = make_tenant()
    _limits(django_db_blocker, limited, key=True, rpm=4)
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    listening.listen(64)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    try:
        with running_proxy(e2e_database_url, tmp_path / "a" / "serve.log", listening=listening, **env) as one, \
                running_proxy(e2e_database_url, tmp_path / "b" / "serve.log", listening=listening, **env):
            statuses = []
            for _ in range(10):
                with httpx.Client(timeout=30) as fresh:  # a new connection each time: either process may take it
                    statuses.append(fresh.post(f"{one.v1}/chat/completions", json={"model": MODEL,
                                               "messages": MESSAGES}, headers={"authorization":
                                               f"Bearer {limited.api_key}"}).status_code)
            assert statuses == [200] * 4 + [429] * 6, statuses
    finally:
        listening.close()
