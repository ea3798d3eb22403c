"""Hostile upstreams through the running proxy, read by openai-python (issue: fault tolerance, items 3, 5, 6).

The simulator's ``hostile:KIND`` answers (docs/simulator.md): a gzip stream, a 200 with a JSON error or
a whole JSON turn in place of the stream, a stream that ends without a finish reason or breaks inside
a frame, a drip and an endless stream. Each must end as something the client can act on: the right
answer, or an error it raises, never a silent success, never a stream that does not end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import ProxyServer, running_proxy

TOOL = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
DEADLINE = 2.0


def _messages() -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Say something [{uuid.uuid4().hex}]"}]


def _client(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)


def _read(client: openai.OpenAI, model: str, **kwargs: Any) -> tuple[str, str]:
    """The streamed text and the x-request-id of one pass-through (or guarded) request."""
    text = ""
    stream = client.chat.completions.create(model=model, messages=_messages(), stream=True, **kwargs)  # type: ignore[call-overload]
    request_id = stream.response.headers["x-request-id"]
    for part in stream:
        if part.choices and part.choices[0].delta.content:
            text += part.choices[0].delta.content
    return text, request_id


@pytest.fixture(scope="module")
def short(e2e_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    """A server with a 2 s request deadline and a 2 s retry budget."""
    log = tmp_path_factory.mktemp("hostile") / "serve.log"
    with running_proxy(e2e_database_url, log, REQUEST_DEADLINE_SECONDS=str(DEADLINE),
                       RETRY_BUDGET_SECONDS=str(DEADLINE)) as server:
        yield server


def test_a_gzip_upstream_reaches_a_pass_through_client_readable(make_tenant: Any, audit_rows: Any) -> None:
    """An upstream that gzips its stream anyway: the client reads plain SSE, the text intact."""
    tenant = make_tenant()
    with _client(tenant.base_url, tenant.api_key) as client:
        text, request_id = _read(client, "gen:calls=0:frames=5:hostile:gzip")
    assert text and text.isprintable() and text.endswith(".")
    assert audit_rows(request_id).outcome == "clean"


def test_a_gzip_upstream_gives_a_guarded_call_on_the_first_attempt(make_tenant: Any, audit_rows: Any) -> None:
    tenant = make_tenant()
    with _client(tenant.base_url, tenant.api_key) as client, client.chat.completions.stream(
            model="gen:calls=1:hostile:gzip", messages=_messages(), tools=TOOL) as stream:
        final = stream.get_final_completion()
        request_id = stream._response.headers["x-request-id"]
    assert final.choices[0].message.tool_calls
    assert audit_rows(request_id).attempts == 1


def test_a_200_with_an_error_body_is_an_error_not_an_empty_success(make_tenant: Any, audit_rows: Any,
                                                                    django_db_blocker: Any) -> None:
    """A JSON error in place of the stream: retried (it is retryable), then recovered; never an empty 200."""
    from audit.models import Finding

    tenant = make_tenant()
    with _client(tenant.base_url, tenant.api_key) as client:
        text, request_id = _read(client, "gen:calls=0:frames=3:hostile:json-error:broken=1")
    assert text
    assert audit_rows(request_id).outcome == "recovered-by-retry"
    with django_db_blocker.unblock():
        assert Finding.objects.filter(request_id=request_id, kind="upstream-not-sse").exists()
    with _client(tenant.base_url, tenant.api_key) as client, pytest.raises(openai.APIStatusError) as caught:
        _read(client, "gen:calls=0:frames=3:hostile:json-error")
    assert caught.value.status_code == 502 and caught.value.response.headers["x-should-retry"] == "true"


def test_a_whole_json_turn_in_place_of_the_stream_is_sent_as_a_stream(make_tenant: Any, audit_rows: Any) -> None:
    tenant = make_tenant()
    with _client(tenant.base_url, tenant.api_key) as client:
        text, request_id = _read(client, "gen:calls=0:frames=4:hostile:json-turn")
    assert text
    row = audit_rows(request_id)
    assert row.outcome == "normalized" and row.prompt_tokens == 5


@pytest.mark.parametrize("kind", ["unfinished", "cut-frame"])
def test_a_stream_broken_off_is_an_error_the_client_raises(kind: str, make_tenant: Any, audit_rows: Any) -> None:
    """No finish reason and no [DONE], or a frame cut in half: openai-python raises ``APIError`` (not a
    ``JSONDecodeError`` on a half frame glued to the error, not a silent success)."""
    tenant = make_tenant()
    with _client(tenant.base_url, tenant.api_key) as client, pytest.raises(openai.APIError) as caught:
        _read(client, f"gen:calls=0:frames=4:hostile:{kind}")
    assert not isinstance(caught.value, openai.APIStatusError)
    request_id = str(caught.value).rsplit("request id: ", 1)[1].rstrip(")")
    assert audit_rows(request_id).outcome == "upstream-error"


@pytest.mark.parametrize("kind", ["drip:ms=200", "endless:ms=20"])
def test_a_drip_or_an_endless_stream_ends_at_the_deadline(kind: str, short: ProxyServer, make_tenant: Any) -> None:
    """The request deadline ends a stream that never would: the client gets an error it raises, in time."""
    tenant = make_tenant()
    started = time.monotonic()
    with _client(short.v1, tenant.api_key) as client, pytest.raises(openai.APIError):
        _read(client, f"gen:calls=0:frames=3:hostile:{kind}")
    assert time.monotonic() - started < DEADLINE + 3


def test_a_stalling_upstream_holds_a_guarded_client_for_the_retry_budget_only(short: ProxyServer, make_tenant: Any,
                                                                             django_db_blocker: Any) -> None:
    """First-byte stalls: retries stop at the retry budget and the client gets a retryable 504, not N x the
    upstream's first-byte timeout and not a made-up answer."""
    tenant = make_tenant()
    with django_db_blocker.unblock():
        tenant.upstream.first_byte_timeout = 1.0
        tenant.upstream.save()
    time.sleep(1.2)  # the proxy's auth cache
    started = time.monotonic()
    response = httpx.post(f"{short.v1}/chat/completions", timeout=30,
                          headers={"authorization": f"Bearer {tenant.api_key}"},
                          json={"model": "gen:calls=1:stall-first-byte=5000", "messages": _messages(),
                                "stream": True, "tools": TOOL})
    elapsed = time.monotonic() - started
    assert response.status_code == 504 and response.headers["x-should-retry"] == "true"
    assert elapsed < DEADLINE + 1.5, elapsed


def test_a_huge_line_costs_no_memory_on_the_pass_through(short: ProxyServer, make_tenant: Any) -> None:
    """A 20 MB SSE line is forwarded as it comes (past the line bound), never held whole."""
    tenant = make_tenant()
    pid = short.process.pid
    before = _rss_mb(pid)
    body = {"model": "gen:calls=0:frames=2:hostile:huge-line:bytes=20000000", "messages": _messages(),
            "stream": True}
    received = 0
    with httpx.stream("POST", f"{short.v1}/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {tenant.api_key}"}) as response:
        for chunk in response.iter_bytes():
            received += len(chunk)
    assert received > 20_000_000
    assert _rss_mb(pid) - before < 40


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")
