"""OpenTelemetry traces over real sockets: a real Daphne server (``manage.py serve``) exporting OTLP/HTTP to
a real receiver in this process (protobuf ``ExportTraceServiceRequest`` decoded with opentelemetry-proto,
not a mock exporter), the openai SDK as the client and the simulator as the upstream, its first attempt
broken. And a collector that is not there: requests still succeed and the lost spans are counted."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.e2e.conftest import ProxyServer, TenantFixture, running_proxy

WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
#: A first attempt broken by a fault the guard sees (fused, truncated SSE frames), then a clean one.
BROKEN_ONCE = "gen:calls=1:broken=1:kinds=fused-truncated-sse-frames"
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
UPSTREAM_KEY = "sk-trace-canary-upstream-key-4242"


@dataclass
class Receiver:
    """An OTLP/HTTP receiver: every ``/v1/traces`` body kept raw and decoded."""

    url: str
    bodies: list[bytes] = field(default_factory=list)
    metric_bodies: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """``(resource attributes, span)`` of every span received so far."""
        found = []
        with self.lock:
            bodies = list(self.bodies)
        for body in bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    found += [(resource, span) for span in scope_spans.spans]
        return found

    def metric_names(self) -> set[str]:
        """Names of every metric received so far (``/v1/metrics``)."""
        names = set()
        with self.lock:
            bodies = list(self.metric_bodies)
        for body in bodies:
            request = ExportMetricsServiceRequest()
            request.ParseFromString(body)
            names |= {m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
        return names

    def wait_for(self, check: Callable[[list[Span]], bool], timeout: float = 15.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = [s for _, s in self.spans()]
            if check(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"the receiver did not get the expected spans: {[s.name for _, s in self.spans()]}")


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def attrs(item: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in item.attributes}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with holder[0].lock:
                if self.path == "/v1/traces":
                    holder[0].bodies.append(body)
                elif self.path == "/v1/metrics":
                    holder[0].metric_bodies.append(body)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield holder[0]
    server.shutdown()
    server.server_close()


def _quiet(server: ProxyServer) -> None:
    """Wait until the server has journaled and written everything (before the test database is flushed)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if httpx.get(f"{server.url}/readyz", timeout=5).json()["journal_backlog_bytes"] == 0:
            return
        time.sleep(0.05)


@contextlib.contextmanager
def traced_proxy(database_url: str, log: Path, endpoint: str, **extra: str) -> Iterator[ProxyServer]:
    settings = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50",
                "OTEL_SERVICE_NAME": "toolrelay-e2e", "OTEL_METRICS_EXPORTER": "none", **extra}
    with running_proxy(database_url, log, listening=None, **settings) as server:
        try:
            yield server
        finally:
            _quiet(server)


@pytest.fixture
def tenant(simulator: Any, django_db_blocker: Any) -> Callable[[ProxyServer], TenantFixture]:
    def make(server: ProxyServer) -> TenantFixture:
        from tenants.services import provision

        with django_db_blocker.unblock():
            done = provision(tenant_name=f"t-{uuid.uuid4().hex[:10]}", upstream_url=simulator.url,
                             upstream_key=UPSTREAM_KEY)
        return TenantFixture(done.tenant, done.raw_key or "", server.v1, done.upstream)

    return make


def _upstream_calls(simulator: Any, marker: str) -> list[dict[str, Any]]:
    return [r for r in simulator.stats()["requests"] if marker in str(r.get("body", {}))]


def test_a_retried_guarded_request_arrives_as_one_server_span_with_two_attempt_children(
        receiver: Receiver, simulator: Any, tenant: Any, e2e_database_url: str, tmp_path: Path,
        django_db_blocker: Any) -> None:
    from billing.models import ModelPrice

    marker = f"CANARY-prompt-{uuid.uuid4().hex}"
    with django_db_blocker.unblock():  # $1 input / $2 output per million tokens: the spans carry the cost
        ModelPrice.objects.create(model="*", input_usd=1, output_usd=2)
    with traced_proxy(e2e_database_url, tmp_path / "serve.log", receiver.url, OTEL_METRICS_EXPORTER="otlp",
                      OTEL_METRIC_EXPORT_INTERVAL="200") as server:
        fixture = tenant(server)
        headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "agent=claude"}
        with openai.OpenAI(base_url=fixture.base_url, api_key=fixture.api_key, max_retries=0,
                           default_headers=headers) as client:
            with client.chat.completions.stream(model=BROKEN_ONCE, tools=WEATHER,  # type: ignore[arg-type]
                                                messages=[{"role": "user", "content": marker}]) as stream:
                final = stream.get_final_completion()
        assert final.choices[0].message.tool_calls

        def complete(spans: list[Span]) -> bool:
            ours = [s for s in spans if s.trace_id.hex() == CLIENT_TRACE]
            return any(s.kind == Span.SPAN_KIND_SERVER for s in ours) and \
                sum(s.kind == Span.SPAN_KIND_CLIENT for s in ours) >= 2

        spans = [s for s in receiver.wait_for(complete) if s.trace_id.hex() == CLIENT_TRACE]
        genai = {"gen_ai.client.token.usage", "gen_ai.client.operation.duration", "toolrelay.gen_ai.client.cost"}
        deadline = time.monotonic() + 10
        while not genai <= receiver.metric_names() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert genai <= receiver.metric_names(), "the GenAI metrics are exported by OTLP too"
    print(render(spans))  # the drawing in docs/metrics.md ("pytest -s" shows it)
    [server_span] = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER]
    attempts = sorted((s for s in spans if s.kind == Span.SPAN_KIND_CLIENT), key=lambda s: s.start_time_unix_nano)
    assert len(attempts) == 2
    # the client's traceparent is the parent; its tracestate continues
    assert server_span.parent_span_id.hex() == CLIENT_SPAN
    assert "agent=claude" in server_span.trace_state
    assert server_span.name == "POST /v1/chat/completions"
    assert all(a.parent_span_id == server_span.span_id for a in attempts)
    request_id = attrs(server_span)["toolrelay.request.id"]
    assert attrs(server_span)["toolrelay.outcome"] == "recovered-by-retry"
    assert attrs(server_span)["http.response.status_code"] == 200
    resource = next(r for r, s in receiver.spans() if s.span_id == server_span.span_id)
    assert resource["service.name"] == "toolrelay-e2e"
    # the broken attempt: its finding as an event with frame and byte offset
    first, second = attempts
    assert attrs(first)["toolrelay.attempt.outcome"] == "retry"
    findings = [attrs(e) for e in first.events if e.name == "toolrelay.guard.finding"]
    assert findings, [e.name for e in first.events]
    assert any(isinstance(f.get("toolrelay.finding.frame"), int) and isinstance(f.get("toolrelay.finding.offset"), int)
               for f in findings), findings
    assert all(f["toolrelay.finding.decision"] for f in findings)
    [retry] = [attrs(e) for e in server_span.events if e.name == "toolrelay.retry"]
    assert retry["toolrelay.retry.cause"] == "broken_output"
    # the good attempt: GenAI attributes
    good = attrs(second)
    assert good["gen_ai.operation.name"] == "chat"
    assert good["gen_ai.request.model"] == BROKEN_ONCE
    assert good["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert good["gen_ai.usage.input_tokens"] > 0 and good["gen_ai.usage.output_tokens"] > 0
    assert good["gen_ai.response.time_to_first_chunk"] > 0
    assert second.name == f"chat {BROKEN_ONCE}"
    # cost: each attempt's at $1 / $2 per million tokens; the request's split into delivered (the good
    # attempt's) and wasted (the broken one's)
    for attempt in (attrs(first), good):
        expected = (attempt["gen_ai.usage.input_tokens"] * 1 + attempt.get("gen_ai.usage.output_tokens", 0) * 2) / 1e6
        assert attempt["toolrelay.cost.usd"] == pytest.approx(expected, rel=0.01), attempt
    request = attrs(server_span)
    assert request["toolrelay.cost.delivered_usd"] == pytest.approx(good["toolrelay.cost.usd"])
    assert request["toolrelay.cost.wasted_usd"] == pytest.approx(attrs(first)["toolrelay.cost.usd"])
    assert request["toolrelay.cost.wasted_usd"] > 0 and "toolrelay.cost.unpriced" not in request
    # the upstream calls carried each attempt's own span as their parent
    calls = _upstream_calls(simulator, marker)
    assert [c["headers"].get("traceparent") for c in calls] == [
        f"00-{CLIENT_TRACE}-{a.span_id.hex()}-01" for a in attempts]
    # no secret and no content in any exported byte
    with receiver.lock:
        exported = b"".join(receiver.bodies)
    assert request_id and request_id.encode() in exported
    assert marker.encode() not in exported
    assert UPSTREAM_KEY.encode() not in exported
    assert fixture.api_key.encode() not in exported
    assert b"Paris" not in exported and b"city" not in exported  # tool arguments


def test_a_request_refused_by_a_limit_is_a_server_span_with_the_limit_as_an_event(
        receiver: Receiver, tenant: Any, e2e_database_url: str, tmp_path: Path, django_db_blocker: Any) -> None:
    from tenants.services import limits_set

    with traced_proxy(e2e_database_url, tmp_path / "serve.log", receiver.url) as server:
        fixture = tenant(server)
        with django_db_blocker.unblock():
            limits_set(tenant=fixture.tenant, values={"rpm": 0})  # 0 blocks
        trace = uuid.uuid4().hex
        response = httpx.post(f"{fixture.base_url}/chat/completions", timeout=30, json={
            "model": "gen", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {fixture.api_key}", "traceparent": f"00-{trace}-{CLIENT_SPAN}-01"})
        assert response.status_code == 429
        receiver.wait_for(lambda spans: any(s.trace_id.hex() == trace for s in spans))
        span = next(s for _, s in receiver.spans() if s.trace_id.hex() == trace)
    assert attrs(span)["http.response.status_code"] == 429
    [event] = [attrs(e) for e in span.events if e.name == "toolrelay.limit.refused"]
    assert event["toolrelay.limit.code"] == response.json()["error"]["code"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _dropped(server: ProxyServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("toolrelay_trace_spans_dropped_total{"))


@contextlib.contextmanager
def _silent_collector() -> Iterator[str]:
    """A collector that accepts connections and never reads or answers (a hung or flooded collector)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("collector", ["refusing", "silent"])
def test_a_dead_collector_costs_requests_nothing_and_the_lost_spans_are_counted(
        collector: str, tenant: Any, e2e_database_url: str, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        url = (f"http://127.0.0.1:{_closed_port()}" if collector == "refusing"
               else stack.enter_context(_silent_collector()))
        server = stack.enter_context(traced_proxy(e2e_database_url, tmp_path / "serve.log", url,
                                                  OTEL_EXPORTER_OTLP_TIMEOUT="1"))
        fixture = tenant(server)
        started = time.monotonic()
        with openai.OpenAI(base_url=fixture.base_url, api_key=fixture.api_key, max_retries=0) as client:
            for _ in range(3):
                with client.chat.completions.stream(model=BROKEN_ONCE, tools=WEATHER,  # type: ignore[arg-type]
                                                    messages=[{"role": "user", "content": "hello"}]) as stream:
                    assert stream.get_final_completion().choices[0].message.tool_calls
        # Each request takes well under a second; an export waiting on the collector (1 s timeout, retried)
        # inside a request would add seconds to each.
        assert time.monotonic() - started < 10
        deadline = time.monotonic() + 20
        while _dropped(server) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _dropped(server) > 0, "spans the collector never got are counted"
        assert server.process.poll() is None


def render(spans: list[Span]) -> str:
    """A span tree as text (docs/metrics.md shows one of a real export): name, kind, duration, key attributes
    and events, children indented under their parent."""
    kinds = {Span.SPAN_KIND_SERVER: "SERVER", Span.SPAN_KIND_CLIENT: "CLIENT"}
    shown = ("toolrelay.outcome", "toolrelay.attempts", "http.response.status_code", "toolrelay.attempt.outcome",
             "gen_ai.provider.name", "gen_ai.response.finish_reasons", "gen_ai.usage.input_tokens",
             "gen_ai.usage.output_tokens", "gen_ai.response.time_to_first_chunk", "error.type")
    ids = {s.span_id for s in spans}
    lines: list[str] = []

    def walk(span: Span, depth: int) -> None:
        pad = "  " * depth
        ms = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
        lines.append(f"{pad}{span.name}  [{kinds.get(span.kind, span.kind)}, {ms:.1f} ms]")
        for key, value in attrs(span).items():
            if key in shown:
                lines.append(f"{pad}    {key} = {round(value, 4) if isinstance(value, float) else value}")
        for event in span.events:
            detail = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in attrs(event).items())
            lines.append(f"{pad}    * {event.name}: {detail}")
        children = [s for s in spans if s.parent_span_id == span.span_id]
        for child in sorted(children, key=lambda s: s.start_time_unix_nano):
            walk(child, depth + 1)

    for root in (s for s in spans if s.parent_span_id not in ids):
        lines.append(f"(parent: the client's span {root.parent_span_id.hex() or 'none'})")
        walk(root, 1)
    return "\n".join(lines)
