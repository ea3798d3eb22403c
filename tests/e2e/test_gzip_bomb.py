"""Issue 24 item 4, over real sockets: a gzip bomb from an upstream is cut at the body bound.

The review: an upstream that compressed although asked for identity had no decoded-size bound; 1 MB
of gzip became 1 GiB relayed and +1.19 GB RSS. Here a fake upstream (a real HTTP server on loopback)
answers every call with ~64 KB of gzip that decodes to 64 MiB of valid SSE frames; the server under
test bounds bodies at 4 MiB (``UPSTREAM_MAX_BODY_BYTES``). The pass-through client gets at most that,
then a clean end (an error it can act on), and the audit a finding naming the bound; a guarded request
gets an error after its attempts, never the bomb.
"""

from __future__ import annotations

import gzip
import http.server
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import ProxyServer, TenantFixture, running_proxy

BOUND = 4 * 1024 * 1024
FRAME = ("data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                                "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]})
         + "\n\n").encode()
BOMB = gzip.compress(FRAME * (64 * 1024 * 1024 // len(FRAME)), compresslevel=9)


class _Bomb(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-encoding", "gzip")
        self.send_header("content-length", str(len(BOMB)))
        self.end_headers()
        try:
            self.wfile.write(BOMB)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def bomb_upstream() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Bomb)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def bounded(e2e_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    log: Path = tmp_path_factory.mktemp("bomb") / "serve.log"
    with running_proxy(e2e_database_url, log, UPSTREAM_MAX_BODY_BYTES=str(BOUND)) as server:
        yield server


def _bombed(make_tenant: Callable[..., TenantFixture], url: str, django_db_blocker: Any) -> TenantFixture:
    from tenants.services import upstream_upsert

    tenant = make_tenant()
    with django_db_blocker.unblock():
        upstream_upsert(tenant=tenant.tenant, name="default", base_url=url, credential="sk-bomb-0000")
    return tenant


def test_a_pass_through_client_gets_at_most_the_bound_then_a_clean_end(
        bounded: ProxyServer, bomb_upstream: str, make_tenant: Callable[..., TenantFixture],
        django_db_blocker: Any, audit_rows: Any) -> None:
    from audit.models import Finding

    tenant = _bombed(make_tenant, bomb_upstream, django_db_blocker)
    received = 0
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": uuid.uuid4().hex}]}
    with httpx.Client(timeout=60) as client, client.stream(
            "POST", f"{bounded.v1}/chat/completions", json=body,
            headers={"authorization": f"Bearer {tenant.api_key}"}) as response:
        request_id = response.headers["x-request-id"]
        tail = b""
        for chunk in response.iter_raw():
            received += len(chunk)
            tail = (tail + chunk)[-4096:]
    assert received <= BOUND + 64 * 1024, f"{received} bytes relayed"
    assert b"error" in tail
    row = audit_rows(request_id)
    assert row.outcome != "clean"
    with django_db_blocker.unblock():
        details = list(Finding.objects.filter(request=row).values_list("detail", flat=True))
    assert any(f"passed {BOUND} bytes decoded from gzip" in d for d in details), details


def test_a_guarded_client_gets_an_error_not_the_bomb(bounded: ProxyServer, bomb_upstream: str,
                                                     make_tenant: Callable[..., TenantFixture],
                                                     django_db_blocker: Any) -> None:
    tenant = _bombed(make_tenant, bomb_upstream, django_db_blocker)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    with openai.OpenAI(base_url=bounded.v1, api_key=tenant.api_key, max_retries=0, timeout=60) as client, \
            pytest.raises(openai.APIError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                       tools=tools)  # type: ignore[arg-type]
