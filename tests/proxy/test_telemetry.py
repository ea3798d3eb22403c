"""Traces and GenAI metrics (``proxy.telemetry``) with the SDK's in-memory exporter: the span tree of a
retried guarded request, the client's traceparent continued and ours sent upstream, findings as events,
no content unless the policy captures it, the bounded export queue and its dropped-span counter, and
log lines that carry the trace ids. The upstream is scripted at the HTTP seam (``tests/proxy/test_relay``)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from opentelemetry.trace import SpanKind

from infra import logcontext, metrics
from proxy.telemetry import semconv, spans, tracing
from tests.proxy.test_relay import (  # noqa: F401 - the fixtures are used by name
    BROKEN,
    CALL,
    DONE,
    FINISH_CALLS,
    SECRET,
    _close_thread_connections,
    chunk,
    make_request,
    run,
    upstream,
)

pytestmark = pytest.mark.django_db(transaction=True)

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
USAGE = b"data: " + json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3},
              "completion_tokens_details": {"reasoning_tokens": 2}}}).encode() + b"\n\n"


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on with the in-memory exporter (reset to the environment's setup after the test)."""
    exporter = InMemorySpanExporter()
    tracing.setup(exporter=exporter, force=True)
    yield exporter
    tracing.reset()


def finished(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    provider = tracing.provider()
    assert provider is not None
    provider.force_flush()
    return list(exporter.get_finished_spans())


def scope(headers: Sequence[tuple[bytes, bytes]] = ()) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": list(headers)}


async def traced_run(request: Any, client: Any, headers: Sequence[tuple[bytes, bytes]] = ()) -> Any:
    """Run the relay inside a request trace, in a task of its own (as the consumer does)."""

    async def serve() -> Any:
        trace = spans.start_request(scope(headers), request_id="req-1", route="/v1/chat/completions")
        recorder, response = await run(request, client)
        trace.end(response.status)
        return recorder

    return await asyncio.create_task(serve())


def by_kind(found: list[ReadableSpan], kind: SpanKind) -> list[ReadableSpan]:
    return sorted((s for s in found if s.kind is kind), key=lambda s: s.start_time or 0)


def test_the_genai_names_are_the_installed_conventions_own() -> None:
    for name in ("OPERATION_NAME", "PROVIDER_NAME", "REQUEST_MODEL", "RESPONSE_MODEL", "RESPONSE_ID",
                 "RESPONSE_FINISH_REASONS", "USAGE_INPUT_TOKENS", "USAGE_OUTPUT_TOKENS",
                 "USAGE_CACHE_READ_INPUT_TOKENS",
                 "USAGE_CACHE_CREATION_INPUT_TOKENS", "USAGE_REASONING_OUTPUT_TOKENS", "TOKEN_TYPE", "TOOL_NAME",
                 "RESPONSE_TIME_TO_FIRST_CHUNK", "REQUEST_STREAM", "OUTPUT_MESSAGES"):
        assert getattr(semconv, name) == getattr(gen_ai_attributes, f"GEN_AI_{name}"), name
    assert semconv.METRIC_TOKEN_USAGE == gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE
    assert semconv.METRIC_OPERATION_DURATION == gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION
    assert semconv.METRIC_TIME_TO_FIRST_CHUNK == gen_ai_metrics.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK


def test_tracing_is_off_without_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    tracing.reset()
    try:
        assert tracing.tracer() is None
        assert spans.start_request(scope([(b"traceparent", TRACEPARENT.encode())]), request_id="r") is spans.NOOP
        headers: dict[str, str] = {}
        spans.inject(headers)
        assert headers == {}
        assert logcontext.current() == {"request_id": "r"}
    finally:
        logcontext.bind()
        tracing.reset()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    assert tracing.traces_configured()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.traces_configured()


async def test_a_retried_guarded_request_is_a_server_span_with_two_attempt_children(
        make_request: Any, exported: InMemorySpanExporter) -> None:  # noqa: F811
    request = make_request()
    # the tenant's default upstream serves the client's own model string: never a label value
    turns = metrics.GEN_AI_TURNS.labels(upstream=request.plan.target(0).name, model="default", broken="true")
    before = turns._value.get()
    seen_headers: list[httpx.Headers] = []
    client = upstream([(0, chunk({"content": "Let me check"})), (0, BROKEN)],
                      [(0, CALL), (0, FINISH_CALLS), (0, USAGE), (0, DONE)])
    inner = client._client._transport.handler  # type: ignore[attr-defined]

    async def spy(req: httpx.Request) -> httpx.Response:
        seen_headers.append(req.headers)
        response: httpx.Response = await inner(req)
        return response

    client._client._transport.handler = spy  # type: ignore[attr-defined]
    recorder = await traced_run(request, client, [(b"traceparent", TRACEPARENT.encode()),
                                                  (b"tracestate", b"vendor=abc")])
    assert recorder.tool_names() == ["get_weather"]
    found = finished(exported)
    [server] = by_kind(found, SpanKind.SERVER)
    first, second = by_kind(found, SpanKind.CLIENT)
    # the client's trace continues: same trace id, its span is our parent, its tracestate kept
    assert f"{server.context.trace_id:032x}" == CLIENT_TRACE
    assert server.parent is not None and f"{server.parent.span_id:016x}" == CLIENT_SPAN
    assert server.context.trace_state.get("vendor") == "abc"
    assert server.name == "POST /v1/chat/completions"
    assert first.parent is not None and second.parent is not None
    assert first.parent.span_id == second.parent.span_id == server.context.span_id
    # our traceparent went upstream: the attempt's own span
    for headers, attempt in zip(seen_headers, (first, second), strict=True):
        assert headers["traceparent"] == f"00-{CLIENT_TRACE}-{attempt.context.span_id:016x}-01"
        assert "vendor=abc" in headers["tracestate"]
    attrs = dict(second.attributes or {})
    assert attrs[semconv.OPERATION_NAME] == "chat"
    assert attrs[semconv.REQUEST_MODEL] == "m"
    assert attrs[semconv.RESPONSE_MODEL] == "m"
    assert attrs[semconv.RESPONSE_FINISH_REASONS] == ("tool_calls",)
    assert (attrs[semconv.USAGE_INPUT_TOKENS], attrs[semconv.USAGE_OUTPUT_TOKENS]) == (11, 7)
    assert attrs[semconv.USAGE_CACHE_READ_INPUT_TOKENS] == 3
    assert attrs[semconv.USAGE_REASONING_OUTPUT_TOKENS] == 2
    assert attrs[semconv.ATTEMPT_OUTCOME] in ("clean", "normalized")
    assert semconv.RESPONSE_TIME_TO_FIRST_CHUNK in attrs
    assert dict(first.attributes or {})[semconv.ATTEMPT_OUTCOME] == "retry"
    assert first.status.is_ok is False
    findings = [e for e in first.events if e.name == semconv.EVENT_FINDING]
    assert findings, "the broken frame is an event on the first attempt"
    event = dict(findings[0].attributes or {})
    assert event[semconv.FINDING_FRAME] == 1 and isinstance(event[semconv.FINDING_OFFSET], int)
    assert event[semconv.FINDING_DECISION] == "retry"
    assert semconv.FINDING_DETAIL not in event and semconv.FINDING_FRAGMENT not in event
    [retry] = [e for e in server.events if e.name == semconv.EVENT_RETRY]
    assert dict(retry.attributes or {})[semconv.RETRY_CAUSE] == "broken_output"
    server_attrs = dict(server.attributes or {})
    assert server_attrs[semconv.OUTCOME] == "recovered-by-retry"
    assert server_attrs[semconv.ATTEMPTS] == 2
    assert server_attrs[semconv.HTTP_RESPONSE_STATUS_CODE] == 200
    assert turns._value.get() == before + 1


def _exported_text(found: list[ReadableSpan]) -> str:
    return "\n".join(s.to_json() for s in found)


async def test_no_content_and_no_secret_reaches_a_span_unless_the_policy_captures_content(
        make_request: Any, exported: InMemorySpanExporter) -> None:  # noqa: F811
    canary = "CANARY-prompt-7f3a"
    leak = chunk({"content": f"echo {SECRET} and {canary}"})
    script: list[tuple[float, bytes]] = [(0, leak), (0, BROKEN)]
    again = chunk({"content": f"{canary} again"})
    retry: list[tuple[float, bytes]] = [(0, again), (0, CALL), (0, FINISH_CALLS), (0, DONE)]

    request = make_request()
    request.request.body["messages"][0]["content"] = canary
    await traced_run(request, upstream(script, retry))
    text = _exported_text(finished(exported))
    assert canary not in text and SECRET not in text and "Paris" not in text
    exported.clear()

    request = make_request(trace_content=True)
    await traced_run(request, upstream(script, retry))
    found = finished(exported)
    text = _exported_text(found)
    assert SECRET not in text, "captured content goes through the audit's scrubber"
    assert "Paris" in text, "the delivered turn's arguments are captured"
    first = by_kind(found, SpanKind.CLIENT)[0]
    event = dict(next(e for e in first.events if e.name == semconv.EVENT_FINDING).attributes or {})
    assert semconv.FINDING_DETAIL in event


def test_the_model_label_is_a_routes_upstream_model_only(make_request: Any) -> None:  # noqa: F811
    target = make_request().plan.target(0)
    routed = metrics.request_labels(tenant="t", route="coder", upstream="u", path="guarded")
    unrouted = metrics.request_labels(tenant="t", route=None, upstream="u", path="guarded")
    assert spans.model_label(target, routed) == target.model
    assert spans.model_label(target, unrouted) == spans.model_label(target, None) == "default"


def test_usage_details_reads_every_dialect_and_ignores_garbage() -> None:
    assert spans.usage_details({"prompt_tokens": 5, "completion_tokens": 2, "prompt_cache_hit_tokens": 4,
                                "cache_creation_input_tokens": 1}) == {
        semconv.USAGE_INPUT_TOKENS: 5, semconv.USAGE_OUTPUT_TOKENS: 2, semconv.USAGE_CACHE_READ_INPUT_TOKENS: 4,
        semconv.USAGE_CACHE_CREATION_INPUT_TOKENS: 1}
    assert spans.usage_details({"prompt_tokens": True, "completion_tokens": -1, "prompt_tokens_details": "x"}) == {}
    assert spans.usage_details(None) == {}
    assert spans.usage_details([1, 2]) == {}  # type: ignore[arg-type]


class _Blocked(SpanExporter):
    """An exporter stuck until released: the collector that hangs."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(10)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


class _Refused(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        return None


def _dropped(reason: str) -> float:
    value: float = metrics.SPANS_DROPPED.labels(reason=reason)._value.get()
    return value


def test_a_hung_collector_fills_the_bounded_queue_and_the_drops_are_counted() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    blocked = _Blocked()
    processor = tracing.BoundedSpanProcessor(blocked, max_queue_size=4, max_export_batch_size=1,
                                             schedule_delay_millis=1)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    before = _dropped("queue_full")
    tracer = provider.get_tracer("t")
    for _ in range(20):
        tracer.start_span("s").end()  # returns at once: the export thread is stuck, not the caller
    assert _dropped("queue_full") - before >= 20 - 4 - 1  # at most one batch taken by the stuck export
    blocked.release.set()
    provider.shutdown()


def test_a_refused_export_counts_its_spans_dropped() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    provider.add_span_processor(tracing.BoundedSpanProcessor(_Refused()))
    before = _dropped("export_failed")
    tracer = provider.get_tracer("t")
    for _ in range(3):
        tracer.start_span("s").end()
    provider.force_flush()
    assert _dropped("export_failed") - before == 3
    provider.shutdown()


def test_log_lines_carry_the_request_and_trace_ids(exported: InMemorySpanExporter) -> None:
    record = logging.LogRecord("proxy.x", logging.WARNING, __file__, 1, "upstream %s slow", ("u1",), None)

    async def inside() -> tuple[str, str, dict[str, str]]:
        trace = spans.start_request(scope([(b"traceparent", TRACEPARENT.encode())]), request_id="req-9")
        logcontext.ContextFilter().filter(record)
        ids = logcontext.current()
        trace.end(200)
        return logcontext.JsonFormatter().format(record), logcontext.PlainFormatter().format(record), ids

    line, plain, ids = asyncio.run(inside())
    data = json.loads(line)
    assert data["message"] == "upstream u1 slow" and data["level"] == "WARNING"
    assert data["request_id"] == "req-9" and data["trace_id"] == CLIENT_TRACE == ids["trace_id"]
    assert len(data["span_id"]) == 16
    assert plain.endswith(f"request_id=req-9 trace_id={CLIENT_TRACE} span_id={data['span_id']}")
    outside = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    contextvars.Context().run(logcontext.ContextFilter().filter, outside)  # no request bound there
    assert "request_id" not in json.loads(logcontext.JsonFormatter().format(outside))


def test_a_malformed_traceparent_starts_a_new_trace(exported: InMemorySpanExporter) -> None:
    async def inside() -> None:
        spans.start_request(scope([(b"traceparent", b"00-zz-yy-01")]), request_id="r").end(400)

    asyncio.run(inside())
    [server] = finished(exported)
    assert server.parent is None
    assert f"{server.context.trace_id:032x}" != CLIENT_TRACE
