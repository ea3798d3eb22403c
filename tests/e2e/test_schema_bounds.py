"""Issue 15, item 1, over real sockets: a client's hostile tool schema never stalls the proxy.

A running ``manage.py serve`` (Daphne), the simulator as upstream, openai-python and anthropic as the
clients, and a thread probing ``/healthz`` all along. With the default bounds the review's schema (15
levels of ``anyOf`` of two ``$ref``) gets a 400 naming the bound at once; with bounds raised so that it
passes, each attempt's validation runs in the pool and is killed at its deadline, the attempt retried,
the finding recorded. Either way the probe's latency stays what it was. The four agents' real tool sets
go through with the default bounds.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import ProxyServer, running_proxy
from tests.proxy.guard.test_schema_bounds import AGENTS, FIXTURES, hostile

UNSATISFIABLE = {"type": "string", "not": {"type": "string"}}
#: A generous bound on one /healthz answer over loopback, on a shared 2-core machine (the review saw 7 s).
PROBE_BOUND = 1.0


class Probe:
    """``/healthz`` asked again and again in a thread; the slowest answer while it ran (seconds)."""

    def __init__(self, url: str) -> None:
        self.url, self.worst, self.count = f"{url}/healthz", 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                assert client.get(self.url).status_code == 200
                self.worst = max(self.worst, time.monotonic() - started)
                self.count += 1
                time.sleep(0.02)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=35)


def _tools(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "lookup", "parameters": schema}}]


def _messages() -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Look it up [{uuid.uuid4().hex}]"}]


def _client(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def lenient(e2e_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    """A server whose bounds let the hostile schema through, with a 0.5 s validation deadline."""
    log: Path = tmp_path_factory.mktemp("bounds") / "serve.log"
    with running_proxy(e2e_database_url, log, SCHEMA_MAX_REFS=str(10**9), SCHEMA_MAX_COST=str(10**9),
                       SCHEMA_VALIDATION_DEADLINE_SECONDS="0.5", SCHEMA_POOL_WORKERS="1") as server:
        yield server


def test_the_hostile_schema_gets_a_400_at_once_and_the_probe_never_waits(proxy_server: ProxyServer,
                                                                         make_tenant: Any) -> None:
    tenant = make_tenant(exhaustion="message")
    with Probe(proxy_server.url) as probe, _client(tenant.base_url, tenant.api_key) as client:
        time.sleep(0.3)
        baseline = probe.worst
        started = time.monotonic()
        for _ in range(10):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model="gen:calls=1", messages=_messages(),  # type: ignore[call-overload]
                                               tools=_tools(hostile(15)), stream=True)
        took = time.monotonic() - started
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "tools[0].function.parameters" and error["code"] == "tool_schema_too_complex"
    assert "'lookup'" in error["message"] and "(refs: validation can expand 65535 $ref" in error["message"]
    assert took < 10 * 2.0  # each 400 is immediate (the review: 10.8 s per validation)
    print(f"/healthz: {probe.count} probes, slowest {probe.worst:.3f} s (baseline {baseline:.3f} s); "  # noqa: T201
          f"10 refusals in {took:.2f} s")
    assert probe.count > 5 and probe.worst < max(PROBE_BOUND, baseline * 3)


def test_the_hostile_schema_gets_a_400_in_anthropic_shape(make_tenant: Any) -> None:
    tenant = make_tenant(exhaustion="message")
    client = anthropic.Anthropic(base_url=tenant.base_url.removesuffix("/v1"), api_key=tenant.api_key,
                                 max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="gen:calls=1", max_tokens=100, messages=_messages(),  # type: ignore[arg-type]
                               tools=[{"name": "lookup", "input_schema": hostile(15)}])  # type: ignore[list-item]
    assert caught.value.status_code == 400
    assert "too complex" in caught.value.message and "refs:" in caught.value.message


def test_a_400000_entry_enum_is_refused_naming_the_enum_bound(make_tenant: Any) -> None:
    tenant = make_tenant(exhaustion="message")
    schema = {"type": "object", "properties": {"a": {"enum": [f"value-{i}" for i in range(400_000)]}}}
    with _client(tenant.base_url, tenant.api_key) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gen:calls=1", messages=_messages(), tools=_tools(schema))  # type: ignore[call-overload]
    assert "enum: an enum has 400000 entries; the bound is 2000" in caught.value.message


@pytest.mark.parametrize("agent", AGENTS)
def test_real_agent_tool_sets_pass_with_the_default_bounds(agent: str, make_tenant: Any) -> None:
    tools = json.loads((FIXTURES / f"{agent}.json").read_text())["tools"]
    tenant = make_tenant(exhaustion="message")
    with _client(tenant.base_url, tenant.api_key) as client, client.chat.completions.stream(
            model="gen:calls=1", messages=_messages(),
            tools=[{"type": "function", "function": t} for t in tools]) as stream:  # type: ignore[misc]
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert call.function.name in {t["name"] for t in tools}  # validated against its schema, delivered
    assert isinstance(json.loads(call.function.arguments), dict)


def test_a_validation_past_its_deadline_is_killed_retried_and_recorded(lenient: ProxyServer, make_tenant: Any,
                                                                       audit_rows: Any,
                                                                       django_db_blocker: Any) -> None:
    """The hostile schema let through: every attempt's call takes seconds to validate, so each is killed at
    0.5 s in the pool; the attempts run out and the client gets the exhaustion answer; /healthz never waits."""
    from audit.models import Finding

    tenant = make_tenant(exhaustion="message")
    with Probe(lenient.url) as probe, _client(lenient.v1, tenant.api_key) as client:
        time.sleep(0.3)
        started = time.monotonic()
        stream = client.chat.completions.create(model="gen:calls=1", messages=_messages(), stream=True,  # type: ignore[call-overload]
                                                tools=_tools(hostile(15, UNSATISFIABLE)))
        request_id = stream.response.headers["x-request-id"]
        text = "".join(p.choices[0].delta.content or "" for p in stream if p.choices)
        took = time.monotonic() - started
    assert "3 attempt(s) failed" in text and "lookup: arguments not validated (validation took longer than 0.5 s" \
        in text
    print(f"three killed validations in {took:.2f} s")  # noqa: T201
    assert took < 3 * (0.5 * 2 + 2) + 5  # three attempts, each bounded by the deadline
    print(f"/healthz: {probe.count} probes, slowest {probe.worst:.3f} s")  # noqa: T201 -- shown with -s
    assert probe.count > 5 and probe.worst < PROBE_BOUND
    row = audit_rows(request_id)
    assert row.attempts == 3 and row.outcome != "clean"
    with django_db_blocker.unblock():
        kinds = set(Finding.objects.filter(request_id=request_id).values_list("kind", flat=True))
    assert "schema-validation-unfinished" in kinds


def _big(properties: int, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(properties)}, **extra}


def test_a_large_new_schema_is_checked_off_the_loop_and_served(make_tenant: Any) -> None:
    schema = _big(1_500, **{"$schema": "http://json-schema.org/draft-07/schema#", "required": ["p0"]})
    tenant = make_tenant(exhaustion="message")
    with _client(tenant.base_url, tenant.api_key) as client, client.chat.completions.stream(
            model="gen:calls=1", messages=_messages(), tools=_tools(schema)) as stream:  # type: ignore[arg-type]
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert call.function.name == "lookup" and "p0" in json.loads(call.function.arguments)


def test_a_schema_too_slow_to_check_gets_a_400_and_the_probe_never_waits(lenient: ProxyServer,
                                                                          make_tenant: Any) -> None:
    tenant = make_tenant(exhaustion="message")
    with Probe(lenient.url) as probe, _client(lenient.v1, tenant.api_key) as client:
        time.sleep(0.3)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="gen:calls=1", messages=_messages(),  # type: ignore[call-overload]
                                           tools=_tools(_big(4_900)))  # 2020-12's metaschema: seconds
    assert "(check: checking it against its metaschema took longer than 0.5 s" in caught.value.message
    print(f"/healthz: {probe.count} probes, slowest {probe.worst:.3f} s")  # noqa: T201 -- shown with -s
    assert probe.count > 5 and probe.worst < PROBE_BOUND
