"""Prometheus metrics (prometheus-client), safe with several Daphne processes.

With ``PROMETHEUS_MULTIPROC_DIR`` set (an empty directory shared by the processes, cleared at
deploy), ``/metrics`` aggregates every process through ``MultiProcessCollector``; without it, the
process's own registry is served. Names, labels and PromQL: docs/metrics.md.

Labels name what an operator configured, never what a client sent: ``tenant`` (slug), ``route``
(the matched route's public name or pattern as configured, ``default`` for the tenant's default
upstream, ``none`` before routing), ``upstream`` (the upstream's name in its tenant), ``path``
(pass-through / guarded / non-stream) and bounded enums (``outcome``, ``cause``, ``kind``). The
client's ``model`` string is never a label. Each label keeps at most ``LABEL_VALUES_MAX`` distinct
values per process; later ones are counted as ``other`` (a misconfiguration must not blow up the
series count).

The relay calls :func:`request_labels` once per request, then :func:`observe_attempt` per upstream
call, :func:`observe_retry` before each retry and :func:`observe_request` at the end.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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
_ADDED_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: Distinct values kept per label per process before ``OTHER``.
LABEL_VALUES_MAX = 500
LABEL_CHARS_MAX = 100
OTHER = "other"
UNKNOWN = "unknown"
#: ``route`` when the tenant's default upstream served the model (no route matched).
DEFAULT_ROUTE = "default"
#: ``route`` / ``upstream`` of a request refused before routing.
NO_ROUTE = "none"
#: ``cause`` of a retry: the upstream answered but the turn was unusable, or the upstream failed.
RETRY_CAUSES = ("broken_output", "upstream_error")

_REQUEST_LABELS = ["tenant", "route", "upstream", "path", "outcome"]
_ATTEMPT_LABELS = ["tenant", "route", "upstream", "path", "outcome"]

REQUESTS = Counter("toolrelay_requests_total", "Client requests by tenant, route, upstream (the route's primary), "
                   "path and outcome.", _REQUEST_LABELS)
_ATTEMPTS = Counter("toolrelay_upstream_attempts_total", "Upstream calls by tenant, route, the upstream called, "
                    "path and the guard's verdict (clean, normalized, repaired, retry, upstream-error).",
                    _ATTEMPT_LABELS)
RETRIES = Counter("toolrelay_retries_total", "Upstream retries by tenant, route, the upstream that failed, path and "
                  "cause (broken_output, upstream_error).", ["tenant", "route", "upstream", "path", "cause"])
FINDINGS = Counter("toolrelay_findings_total", "Guard findings by kind.", ["kind"])
RETRY_BUDGET_SPENT = Counter("toolrelay_retry_budget_spent_total",
                             "Retries for broken output not made because the tenant's retry budget was spent.")
LOOPS_BROKEN = Counter("toolrelay_loops_broken_total", "Answers replaced by the loop breaker's, by rule.", ["rule"])
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
LIMITS_FAIL_OPEN = Counter("toolrelay_limits_fail_open_total",
                           "Shared-state (Redis) calls of the limits not made or failed, answered as if no limit "
                           "applied, by operation (admit, add, release, remember, recall, append, recent, "
                           "publish).", ["op"])
LIMITS_REFUSED = Counter("toolrelay_limits_refused_total", "Requests refused by a limit, by tenant and limit "
                         "(rpm, tpm, concurrency, daily_tokens, monthly_tokens, wrong_key).", ["tenant", "limit"])
LIMITS_TOKENS = Counter("toolrelay_limits_tokens_total", "Tokens counted against token limits, by tenant and source "
                        "(usage: the answer's usage; estimate: no usage came back, estimated from the request "
                        "and the bytes received).", ["tenant", "source"])
CLIENT_TTFT = Histogram("toolrelay_client_ttft_seconds", "Time from request to first byte sent to the client.",
                        ["path"], buckets=_TTFT_BUCKETS)
_UPSTREAM_TTFB = Histogram("toolrelay_upstream_ttfb_seconds", "Time from upstream call to its first body byte.",
                           ["upstream"], buckets=_TTFT_BUCKETS)
ADDED_LATENCY = Histogram("toolrelay_added_latency_seconds", "Time a client waited beyond the answering upstream "
                          "call: retries, backoff and toolrelay's own work (usable answers only).",
                          ["tenant", "route", "upstream", "path"], buckets=_ADDED_BUCKETS)

# GenAI metrics in the semantic conventions' shape (``proxy.telemetry.semconv``, version pinned there), per
# upstream and upstream model (both configured by an operator, never the client's model string); the
# buckets are the conventions' advice. Observed per upstream call by ``proxy.telemetry.spans``.
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
GEN_AI_TOKENS = Histogram("toolrelay_gen_ai_client_token_usage", "gen_ai.client.token.usage: tokens per upstream "
                          "call by upstream, upstream model and token type (input, output).",
                          ["upstream", "model", "token_type"], buckets=_TOKEN_BUCKETS)
GEN_AI_DURATION = Histogram("toolrelay_gen_ai_client_operation_duration_seconds", "gen_ai.client.operation.duration: "
                            "seconds per upstream call by upstream, upstream model and error type (empty: none).",
                            ["upstream", "model", "error_type"], buckets=_DURATION_BUCKETS)
GEN_AI_TTFT = Histogram("toolrelay_gen_ai_client_time_to_first_chunk_seconds",
                        "gen_ai.client.operation.time_to_first_chunk: seconds from upstream call to its first body "
                        "byte, by upstream and upstream model.", ["upstream", "model"], buckets=_TTFT_BUCKETS)
GEN_AI_TURNS = Counter("toolrelay_gen_ai_turns_total", "Upstream turns by upstream, upstream model and whether the "
                       "guard found them broken (true: retried or refused; the broken-turn rate).",
                       ["upstream", "model", "broken"])
ROUTING_BROKEN_RATE = Gauge("toolrelay_routing_broken_rate", "Live broken-turn rate the router sees (share of "
                            "guarded first attempts found broken over ROUTING_QUALITY_WINDOW_SECONDS), by tenant, "
                            "upstream and upstream model; set each time a turn is counted.",
                            ["tenant", "upstream", "model"], multiprocess_mode="livemostrecent")
ROUTING_WINDOW_TURNS = Gauge("toolrelay_routing_window_turns", "Guarded first attempts in the router's window, by "
                             "tenant, upstream and upstream model.", ["tenant", "upstream", "model"],
                             multiprocess_mode="livemostrecent")
SPANS_DROPPED = Counter("toolrelay_trace_spans_dropped_total", "Trace spans not exported, by reason (queue_full: the "
                        "batch queue was full; export_failed: the collector refused or could not be reached).",
                        ["reason"])


class _Bounded:
    """Per-label sets of the values seen; a value past ``LABEL_VALUES_MAX`` becomes ``OTHER``."""

    def __init__(self) -> None:
        self._seen: dict[str, set[str]] = {}
        #: (label, raw value) -> its accepted text: the per-request fast path (a dict read, no lock:
        #: several labels of every request, on the byte path). Bounded as ``_seen`` is.
        self._accepted: dict[tuple[str, str | None], str] = {}
        self._lock = threading.Lock()

    def __call__(self, label: str, value: str | None) -> str:
        known = self._accepted.get((label, value))
        if known is not None:
            return known
        text = "".join(ch for ch in (value or UNKNOWN) if ch.isprintable())[:LABEL_CHARS_MAX] or UNKNOWN
        with self._lock:
            seen = self._seen.setdefault(label, set())
            if text not in seen:
                if len(seen) >= LABEL_VALUES_MAX:
                    return OTHER
                seen.add(text)
            if len(self._accepted) < 4 * LABEL_VALUES_MAX * max(1, len(self._seen)):
                self._accepted[(label, value)] = text
            return text

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()
            self._accepted.clear()


bounded = _Bounded()


@dataclass(frozen=True, slots=True)
class RequestLabels:
    """The labels every series of one request shares; made by :func:`request_labels`."""

    tenant: str
    route: str
    upstream: str
    path: str


def request_labels(*, tenant: str, route: str | None, upstream: str | None, path: str,
                   routed: bool = True) -> RequestLabels:
    """Labels of a request: ``tenant`` slug, the matched route's configured public name (None: the
    tenant's default upstream), the plan's primary upstream name, the path. ``routed=False``: refused
    before routing (``route`` and ``upstream`` are ``none``)."""
    if not routed:
        route, upstream = NO_ROUTE, NO_ROUTE
    return RequestLabels(tenant=bounded("tenant", tenant), route=bounded("route", route or DEFAULT_ROUTE),
                         upstream=bounded("upstream", upstream or NO_ROUTE), path=bounded("path", path))


def observe_attempt(labels: RequestLabels, *, upstream: str, outcome: str, ttfb: float | None = None,
                    findings: Iterable[str] = ()) -> None:
    """Count one finished upstream call to ``upstream`` (its name) with the guard's ``outcome``;
    ``ttfb`` in seconds (None: no byte came); ``findings``: the kinds of its findings."""
    name = bounded("upstream", upstream)
    _ATTEMPTS.labels(tenant=labels.tenant, route=labels.route, upstream=name, path=labels.path,
                     outcome=bounded("outcome", outcome)).inc()
    if ttfb is not None:
        _UPSTREAM_TTFB.labels(upstream=name).observe(ttfb)
    for kind in findings:
        FINDINGS.labels(kind=bounded("kind", kind)).inc()


COST_USD = Counter("toolrelay_cost_usd_total", "USD spent upstream at the prices in force (billing), by tenant, "
                   "upstream model, upstream and kind (delivered: the attempt the client got; wasted: attempts "
                   "discarded as broken, cut or refused).", ["tenant", "model", "upstream", "kind"])


def observe_cost(labels: RequestLabels, *, upstream: str, model: str, usd: float, kind: str) -> None:
    """Count ``usd`` (>= 0) spent on one attempt to ``upstream`` / ``model``; ``kind`` ``delivered`` or ``wasted``."""
    if usd > 0:
        COST_USD.labels(tenant=labels.tenant, model=bounded("model", model), upstream=bounded("upstream", upstream),
                        kind="delivered" if kind == "delivered" else "wasted").inc(usd)


def observe_retry(labels: RequestLabels, *, upstream: str, cause: str) -> None:
    """Count a retry after a failed call to ``upstream``; ``cause`` is one of ``RETRY_CAUSES``."""
    RETRIES.labels(tenant=labels.tenant, route=labels.route, upstream=bounded("upstream", upstream), path=labels.path,
                   cause=cause if cause in RETRY_CAUSES else OTHER).inc()


def observe_broken_rate(labels: RequestLabels, *, upstream: str, model: str, rate: float | None,
                        turns: float) -> None:
    """Show the router's live broken-turn rate of ``upstream`` / ``model`` (None: no turn in the window)."""
    names = {"tenant": labels.tenant, "upstream": bounded("upstream", upstream), "model": bounded("model", model)}
    ROUTING_WINDOW_TURNS.labels(**names).set(turns)
    if rate is not None:
        ROUTING_BROKEN_RATE.labels(**names).set(rate)


def observe_request(tenant: str | RequestLabels, path: str | None = None, outcome: str = UNKNOWN,
                    ttft: float | None = None, *, added_latency: float | None = None) -> None:
    """Count a finished request; ``ttft`` and ``added_latency`` in seconds (None: not applicable).

    Takes :class:`RequestLabels` (``observe_request(labels, outcome=…, ttft=…, added_latency=…)``),
    or the older ``(tenant, path, outcome, ttft)`` whose route and upstream are then ``unknown``.
    """
    labels = tenant if isinstance(tenant, RequestLabels) else RequestLabels(
        bounded("tenant", tenant), UNKNOWN, UNKNOWN, bounded("path", path))
    REQUESTS.labels(tenant=labels.tenant, route=labels.route, upstream=labels.upstream, path=labels.path,
                    outcome=bounded("outcome", outcome)).inc()
    if ttft is not None:
        CLIENT_TTFT.labels(path=labels.path).observe(ttft)
    if added_latency is not None:
        ADDED_LATENCY.labels(tenant=labels.tenant, route=labels.route, upstream=labels.upstream,
                             path=labels.path).observe(max(0.0, added_latency))


class _Unlabelled:
    """The older call shapes (``ATTEMPTS.labels(outcome=…).inc()``, ``UPSTREAM_TTFB.observe(s)``) on
    the labelled metrics, with the missing labels ``unknown``: the relay keeps working until it calls
    :func:`observe_attempt`, which fills them."""

    def __init__(self, metric: Any, names: list[str]) -> None:
        self._metric, self._names = metric, names

    def labels(self, **given: str) -> Any:
        return self._metric.labels(**{name: given.get(name, UNKNOWN) for name in self._names})

    def observe(self, value: float) -> None:
        self.labels().observe(value)


ATTEMPTS = _Unlabelled(_ATTEMPTS, _ATTEMPT_LABELS)
UPSTREAM_TTFB = _Unlabelled(_UPSTREAM_TTFB, ["upstream"])


def render() -> tuple[bytes, str]:
    """The exposition text and its content type."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST
