"""Upstreams that configure themselves, through the running proxy with the official SDKs.

The simulator answers as a DeepSeek-class upstream does (``refuse=deepseek-max-tokens/8192``); Claude
Code and most agents ask for far more (32000). One 400 is absorbed (the client sees its answer), the
fact is remembered (an ``UpstreamLearnedLimit`` row, an ``upstream-parameter-refused`` finding on the
refused attempt) and the next request is sent right the first time: the simulator's stats show every
body that reached it. Across two server processes the fact travels through Redis (with ``REDIS_URL``)
or through the database and the principal (without).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e.conftest import running_proxy

WEATHER_OPENAI = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                    "parameters": {"type": "object", "required": ["city"],
                                                                   "properties": {"city": {"type": "string"}}}}}]
WEATHER_ANTHROPIC = [{"name": "get_weather", "description": "Weather for a city",
                      "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                       "required": ["city"]}}]
DEEPSEEK = "gen:calls=1:refuse=deepseek-max-tokens/8192"


def _sent(simulator: Any, marker: str) -> list[tuple[int, int | None]]:
    """(status, max_tokens) of every upstream call that carried ``marker``, in order."""
    return [(r["status"], r["body"].get("max_tokens")) for r in simulator.stats()["requests"]
            if marker in json.dumps(r.get("body", {}))]


def _wait_for(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _learned(django_db_blocker: Any, tenant: Any) -> list[tuple[str, str, int | None]]:
    from tenants.models import UpstreamLearnedLimit

    with django_db_blocker.unblock():
        return [(r.model, r.parameter, r.value) for r in UpstreamLearnedLimit.objects.filter(upstream=tenant.upstream)]


def _findings(django_db_blocker: Any, tenant: Any) -> list[tuple[int, str, str]]:
    from audit.models import Finding

    with django_db_blocker.unblock():
        return [(f.attempt.upstream_status, f.kind, f.detail) for f in Finding.objects.filter(
            tenant_id_copy=tenant.tenant.pk, kind="upstream-parameter-refused").select_related("attempt")]


def test_openai_python_streams_past_one_absorbed_400_and_the_next_request_goes_right(
        make_tenant: Any, simulator: Any, django_db_blocker: Any) -> None:
    tenant = make_tenant()
    client = openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30)
    markers = [uuid.uuid4().hex, uuid.uuid4().hex]
    for marker in markers:
        stream = client.chat.completions.create(
            model=DEEPSEEK, stream=True, max_tokens=32000, tools=WEATHER_OPENAI,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": f"Weather in Paris? [{marker}]"}])
        calls = [c.function.name for chunk in stream for c in (chunk.choices[0].delta.tool_calls or [])
                 if chunk.choices and c.function and c.function.name]
        assert calls == ["get_weather"], "the client sees its answer, not the 400"
    assert _sent(simulator, markers[0]) == [(400, 32000), (200, 8192)]
    assert _sent(simulator, markers[1]) == [(200, 8192)], "sent right the first time"
    assert _wait_for(lambda: _learned(django_db_blocker, tenant), "the learned row") == [
        (DEEPSEEK, "max_tokens", 8192)]
    findings = _wait_for(lambda: _findings(django_db_blocker, tenant), "the finding")
    assert [(status, kind) for status, kind, _ in findings] == [(400, "upstream-parameter-refused")]
    assert "valid range of max_tokens is [1, 8192]" in findings[0][2]


def test_a_pass_through_stream_absorbs_it_too(make_tenant: Any, simulator: Any) -> None:
    """Without tools the bytes are the upstream's own (pass-through): those of the re-ask."""
    tenant = make_tenant()
    client = openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30)
    marker = uuid.uuid4().hex
    text = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model="text:5:refuse=groq-max-tokens/16384", stream=True, max_tokens=32000,
        messages=[{"role": "user", "content": f"hi [{marker}]"}]) if chunk.choices)
    assert text
    assert _sent(simulator, marker) == [(400, 32000), (200, 16384)]


def test_anthropic_python_as_claude_code_asks_for_32000(make_tenant: Any, simulator: Any,
                                                         proxy_server: Any, django_db_blocker: Any) -> None:
    tenant = make_tenant()
    client = anthropic.Anthropic(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0, timeout=30)
    markers = [uuid.uuid4().hex, uuid.uuid4().hex]
    for marker in markers:
        with client.messages.stream(model=DEEPSEEK, max_tokens=32000, tools=WEATHER_ANTHROPIC,  # type: ignore[arg-type]
                                    messages=[{"role": "user", "content": f"Weather in Paris? [{marker}]"}]) as stream:
            message = stream.get_final_message()
        assert message.stop_reason == "tool_use"
        assert [b.name for b in message.content if b.type == "tool_use"] == ["get_weather"]
    assert _sent(simulator, markers[0]) == [(400, 32000), (200, 8192)]
    assert _sent(simulator, markers[1]) == [(200, 8192)]
    assert _wait_for(lambda: _learned(django_db_blocker, tenant), "the learned row") == [
        (DEEPSEEK, "max_tokens", 8192)]


def test_an_unknown_refusal_still_reaches_the_client(make_tenant: Any, simulator: Any) -> None:
    tenant = make_tenant()
    client = openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30)
    marker = uuid.uuid4().hex
    with pytest.raises(openai.BadRequestError, match="Bad request"):
        client.chat.completions.create(model="gen:refuse=opaque-max-tokens/8192", max_tokens=32000,
                                       messages=[{"role": "user", "content": f"hi [{marker}]"}])
    assert _sent(simulator, marker) == [(400, 32000)]


def _logs(tmp_path: Path) -> tuple[Path, Path]:
    """A log (and journal directory) for each of two servers."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    return tmp_path / "a" / "serve.log", tmp_path / "b" / "serve.log"


def _ask(server: Any, tenant: Any, marker: str) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key=tenant.api_key, max_retries=0, timeout=30)
    answer = client.chat.completions.create(model=DEEPSEEK, max_tokens=32000, tools=WEATHER_OPENAI,  # type: ignore[arg-type]
                                            messages=[{"role": "user", "content": f"Weather? [{marker}]"}])
    assert answer.choices[0].message.tool_calls


def test_a_sibling_process_learns_it_through_redis(make_tenant: Any, simulator: Any, e2e_database_url: str,
                                                   tmp_path: Path, django_db_blocker: Any) -> None:
    """Two servers sharing Redis; the journal writers batch slowly, so the database cannot carry the fact in
    time: the second server's first request goes right only because of Redis."""
    import redis

    from tenants.learned import redis_key

    shared = redis.Redis.from_url("redis://127.0.0.1:6379/13")
    shared.flushdb()
    env = {"REDIS_URL": "redis://127.0.0.1:6379/13", "UPSTREAM_LEARNED_SYNC_SECONDS": "0.1",
           "JOURNAL_BATCH_SECONDS": "60"}
    tenant = make_tenant()
    log_a, log_b = _logs(tmp_path)
    with running_proxy(e2e_database_url, log_a, **env) as a, running_proxy(e2e_database_url, log_b, **env) as b:
        first, second = uuid.uuid4().hex, uuid.uuid4().hex
        _ask(a, tenant, first)
        # a publishes in the background (bounded wait: a loaded box may take longer than a fixed sleep);
        # b pulls every 0.1 s and at its first request
        _wait_for(lambda: shared.hlen(redis_key()), "the fact published to Redis")
        assert _learned(django_db_blocker, tenant) == [], "not in the database yet: only Redis can carry it"
        _ask(b, tenant, second)
    shared.close()
    assert _sent(simulator, first) == [(400, 32000), (200, 8192)]
    assert _sent(simulator, second) == [(200, 8192)]


def test_without_redis_a_sibling_process_learns_it_from_the_database(make_tenant: Any, simulator: Any,
                                                                     e2e_database_url: str, tmp_path: Path,
                                                                     django_db_blocker: Any) -> None:
    tenant = make_tenant()
    log_a, log_b = _logs(tmp_path)
    with running_proxy(e2e_database_url, log_a) as a, running_proxy(e2e_database_url, log_b) as b:
        first, second = uuid.uuid4().hex, uuid.uuid4().hex
        _ask(a, tenant, first)
        _wait_for(lambda: _learned(django_db_blocker, tenant), "the learned row")
        _ask(b, tenant, second)  # b's key lookup reads the row into the principal
    assert _sent(simulator, first) == [(400, 32000), (200, 8192)]
    assert _sent(simulator, second) == [(200, 8192)]
