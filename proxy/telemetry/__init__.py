"""OpenTelemetry for the request path: traces (``tracing``: SDK setup from ``OTEL_*``; ``spans``: the
recorder the relay calls), the attribute names followed (``semconv``, one module, one pinned version)
and the GenAI metrics beside the Prometheus ones (``infra.metrics``). Off, and near free, when no
OTLP endpoint is configured. docs/metrics.md, "Tracing"."""
