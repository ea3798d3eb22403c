"""Prometheus metrics (prometheus-client), safe with several Daphne processes.

With ``PROMETHEUS_MULTIPROC_DIR`` set (an empty directory shared by the processes, cleared at
deploy), ``/metrics`` aggregates every process through ``MultiProcessCollector``; without it, the
process's own registry is served.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter("toolrelay_requests_total", "Client requests by tenant, path and outcome.",
                   ["tenant", "path", "outcome"])
ATTEMPTS = Counter("toolrelay_upstream_attempts_total", "Upstream attempts by outcome.", ["outcome"])
FINDINGS = Counter("toolrelay_findings_total", "Guard findings by kind.", ["kind"])
CLIENT_CANCELLED = Counter("toolrelay_client_cancelled_total", "Requests whose client went away mid-response.")
SERVER_REFUSED = Counter("toolrelay_server_refused_total",
                         "Requests or connections `manage.py serve` cut short, by reason "
                         "(body_too_large: 413 before buffering; header_timeout: headers too slow).", ["reason"])
IN_FLIGHT = Gauge("toolrelay_requests_in_flight", "Requests being relayed.", multiprocess_mode="livesum")
JOURNAL_BACKLOG = Gauge("toolrelay_journal_backlog_bytes", "Audit journal bytes not yet in the database.",
                        multiprocess_mode="livesum")
JOURNAL_DROPPED = Counter("toolrelay_journal_dropped_total",
                          "Audit journal parts dropped at its bound or refused by the database, by what.", ["what"])
DATABASE_UP = Gauge("toolrelay_database_up", "1 while the journal writer's last database call worked.",
                    multiprocess_mode="livemin")
CLIENT_TTFT = Histogram("toolrelay_client_ttft_seconds", "Time from request to first byte sent to the client.",
                        ["path"], buckets=_TTFT_BUCKETS)
UPSTREAM_TTFB = Histogram("toolrelay_upstream_ttfb_seconds", "Time from upstream call to its first body byte.",
                          buckets=_TTFT_BUCKETS)


def observe_request(tenant: str, path: str, outcome: str, ttft: float | None) -> None:
    """Count a finished request; ``ttft`` in seconds (None when nothing was sent)."""
    REQUESTS.labels(tenant=tenant, path=path, outcome=outcome).inc()
    if ttft is not None:
        CLIENT_TTFT.labels(path=path).observe(ttft)


def render() -> tuple[bytes, str]:
    """The exposition text and its content type."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST
