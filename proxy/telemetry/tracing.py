"""The OpenTelemetry SDK for this process, configured from the standard ``OTEL_*`` environment.

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (and
``OTEL_SDK_DISABLED`` is not ``true``, ``OTEL_TRACES_EXPORTER`` not ``none``); off otherwise, and then
:func:`tracer` is None and the request path pays one attribute read per hook. The SDK itself reads
the rest: ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (the resource; ``service.name``
defaults to ``toolrelay``), ``OTEL_TRACES_SAMPLER`` / ``_ARG`` (default ``parentbased_always_on``),
``OTEL_EXPORTER_OTLP_HEADERS`` / ``_TIMEOUT`` / ``_COMPRESSION`` (the OTLP/HTTP protobuf exporter,
``/v1/traces`` appended to the base endpoint) and ``OTEL_BSP_*`` (the batch processor).

Never on the byte path: ended spans go to a ``BatchSpanProcessor`` (a bounded queue, default 2048
spans, exported by its own thread). A collector that is down or slow fills the queue; spans past it,
and the spans of every failed export, are dropped and counted in
``toolrelay_trace_spans_dropped_total{reason="queue_full"|"export_failed"}``. With
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` or the base endpoint set (``OTEL_METRICS_EXPORTER`` not
``none``) the GenAI metrics are also exported by OTLP (:func:`meter`).

Set up lazily, once per process (after Daphne's processes exist), by the first request.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Tracer

from infra import metrics
from proxy.telemetry import semconv

logger = logging.getLogger(__name__)

#: ``service.name`` when ``OTEL_SERVICE_NAME`` does not say.
SERVICE_NAME = "toolrelay"
_DEFAULT_QUEUE = 2048


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def traces_configured() -> bool:
    """True when the environment asks for traces (an OTLP endpoint, the SDK not disabled)."""
    if _env("OTEL_SDK_DISABLED").lower() == "true" or _env("OTEL_TRACES_EXPORTER").lower() == "none":
        return False
    return bool(_env("OTEL_EXPORTER_OTLP_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def metrics_configured() -> bool:
    """True when the environment asks for OTLP metrics (an endpoint, the SDK not disabled)."""
    if _env("OTEL_SDK_DISABLED").lower() == "true" or _env("OTEL_METRICS_EXPORTER").lower() == "none":
        return False
    return bool(_env("OTEL_EXPORTER_OTLP_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))


class CountingExporter(SpanExporter):
    """Wraps an exporter: the spans of an export that fails (or raises) are counted as dropped, and
    every span handed over is counted for :class:`BoundedSpanProcessor`'s queue estimate."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.taken = 0  # spans the batch processor handed to export (its queue shrank by these)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export ``spans`` with the inner exporter; count them dropped unless it succeeded."""
        with self._lock:
            self.taken += len(spans)
        try:
            result = self.inner.export(spans)
        except Exception:  # an exporter must not kill the export thread
            logger.warning("span export raised", exc_info=True)
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            metrics.SPANS_DROPPED.labels(reason="export_failed").inc(len(spans))
        return result

    def shutdown(self) -> None:
        """Shut the inner exporter down."""
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the inner exporter."""
        return self.inner.force_flush(timeout_millis)


class BoundedSpanProcessor(SpanProcessor):
    """A ``BatchSpanProcessor`` whose queue overflows are counted (``reason="queue_full"``).

    The SDK's processor drops the oldest span when its queue (``max_queue_size``) is full and only logs
    it; the count here is ``ended - handed to export`` against the same bound (an estimate off by at
    most one batch in flight, never a lock shared with the export thread beyond a counter).
    """

    def __init__(self, exporter: SpanExporter, *, max_queue_size: int | None = None, **batch: Any) -> None:
        self.exporter = exporter if isinstance(exporter, CountingExporter) else CountingExporter(exporter)
        self.max_queue_size = max_queue_size or int(_env("OTEL_BSP_MAX_QUEUE_SIZE") or _DEFAULT_QUEUE)
        self.batch = BatchSpanProcessor(self.exporter, max_queue_size=self.max_queue_size, **batch)
        self.ended = 0

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do at a span's start."""

    def on_end(self, span: ReadableSpan) -> None:
        """Queue ``span`` (never blocks); count it when the queue is full and the oldest one goes."""
        if span.context is None or not span.context.trace_flags.sampled:
            return
        if self.ended - self.exporter.taken >= self.max_queue_size:
            metrics.SPANS_DROPPED.labels(reason="queue_full").inc()
            self.ended -= 1  # the queue stays at its bound: one out (dropped), one in
        self.ended += 1
        self.batch.on_end(span)

    def shutdown(self) -> None:
        """Export what is queued and stop the export thread."""
        self.batch.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what is queued now (blocking: tests and shutdown only)."""
        return self.batch.force_flush(timeout_millis)


_lock = threading.Lock()
_ready = False
_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_meter: Any = None


def setup(*, exporter: SpanExporter | None = None, force: bool = False) -> Tracer | None:
    """Configure tracing for this process once (``force``: again, tests); return the tracer or None (off).

    ``exporter`` replaces the OTLP exporter (tests: the SDK's in-memory one), and turns tracing on
    whatever the environment says. Never raises: a broken configuration logs and leaves tracing off.
    """
    global _ready, _tracer, _provider
    if _ready and not force:
        return _tracer
    with _lock:
        if _ready and not force:
            return _tracer
        if _provider is not None:
            _provider.shutdown()
        _tracer, _provider = None, None
        try:
            if exporter is not None or traces_configured():
                _provider, _tracer = _build(exporter)
            _setup_meter()
        except Exception:
            logger.exception("OpenTelemetry setup failed: tracing stays off")
            _tracer, _provider = None, None
        _ready = True
    return _tracer


def _build(exporter: SpanExporter | None) -> tuple[TracerProvider, Tracer]:
    from opentelemetry.sdk.resources import SERVICE_NAME as SERVICE_KEY
    from opentelemetry.sdk.resources import Resource

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    detected = Resource.create()
    if not _env("OTEL_SERVICE_NAME") and "service.name=" not in _env("OTEL_RESOURCE_ATTRIBUTES"):
        detected = detected.merge(Resource({SERVICE_KEY: SERVICE_NAME}))
    # the sampler: OTEL_TRACES_SAMPLER (SDK default otherwise)
    provider = TracerProvider(resource=_resource(detected.attributes, detected.schema_url))
    provider.add_span_processor(BoundedSpanProcessor(exporter))
    return provider, provider.get_tracer("toolrelay", schema_url=semconv.SCHEMA_URL)


def _resource(attributes: Any, schema_url: str) -> Any:
    """The process's ``Resource`` with its hash computed once: the OTLP encoder groups every exported span by
    resource, and the SDK's ``Resource.__hash__`` JSON-encodes all its attributes per call (~15 µs per span in
    the export thread; ``bench/tracing_micro.py``). It is immutable, so one hash holds for its life."""
    from opentelemetry.sdk.resources import Resource

    class _HashedResource(Resource):
        def __init__(self, attributes: Any, schema_url: str | None = None) -> None:
            super().__init__(attributes, schema_url)
            self._hash = super().__hash__()

        def __hash__(self) -> int:
            return self._hash

        __eq__ = Resource.__eq__

    return _HashedResource(attributes, schema_url)


def _setup_meter() -> None:
    """The OTLP meter of the GenAI metrics, when OTLP metrics are configured (else None)."""
    global _meter
    _meter = None
    if not metrics_configured():
        return
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"service.name": _env("OTEL_SERVICE_NAME") or SERVICE_NAME})
    provider = MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())])
    _meter = provider.get_meter("toolrelay", schema_url=semconv.SCHEMA_URL)


def tracer() -> Tracer | None:
    """The process tracer (set up on first call), or None when tracing is off."""
    if not _ready:
        return setup()
    return _tracer


def meter() -> Any:
    """The OTLP meter of the GenAI metrics, or None (no OTLP metrics configured)."""
    if not _ready:
        setup()
    return _meter


def provider() -> TracerProvider | None:
    """The process tracer provider (None: tracing off); tests flush it."""
    return _provider


def reset() -> None:
    """Forget the setup (tests): the next :func:`tracer` call configures again from the environment."""
    global _ready, _tracer, _provider, _meter
    with _lock:
        if _provider is not None:
            _provider.shutdown()
        _ready, _tracer, _provider, _meter = False, None, None, None
