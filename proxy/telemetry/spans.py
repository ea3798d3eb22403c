"""The trace of one proxied request: the thin recorder the edge and the relay call.

Span tree (names and attributes: ``proxy.telemetry.semconv``; docs/metrics.md, "Tracing")::

    POST /v1/chat/completions      SERVER  one per request; its parent is the client's traceparent
      chat <upstream model>        CLIENT  one per upstream attempt; its context goes upstream
        event toolrelay.guard.finding      per guard finding: kind, frame, byte offset, tool, decision
        event toolrelay.upstream.refused   per answer the upstream client asked again past
      event toolrelay.retry / toolrelay.retry_budget.spent / toolrelay.loop_breaker / toolrelay.limit.refused

:func:`start_request` (the consumer, per request) returns a :class:`RequestTrace` and makes it the
task's :func:`current` one. With tracing off it returns :data:`NOOP`, whose methods only observe the
Prometheus GenAI metrics (``call_recorded``) and otherwise return at once. Nothing here raises into
the request path, and nothing blocks: ended spans go to the batch processor (``proxy.telemetry.tracing``).

Content: no prompt, completion or argument text, no finding detail, unless the request's policy has
``trace_content`` on (per tenant, overridable per route); then finding details and fragments and the
delivered turn (``gen_ai.output.messages``, capped) go out through ``infra.scrub.redact`` with the
upstream secrets, as the audit's texts do.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from infra import logcontext, metrics
from proxy.telemetry import semconv as sc
from proxy.telemetry import tracing

if TYPE_CHECKING:
    from audit.records import AttemptRecord
    from proxy.guard.turn import Decision, Turn
    from tenants.principal import UpstreamTarget

logger = logging.getLogger(__name__)

#: Longest string attribute toolrelay sets from what a client or upstream sent.
ATTRIBUTE_CHARS_MAX = 256
#: Longest captured content (``trace_content``) per attribute.
CONTENT_CHARS_MAX = 4096
#: Findings recorded as events per attempt (the audit keeps them all).
EVENTS_MAX = 64

_PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent / tracestate only: client baggage stays here
_current: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar("toolrelay_trace", default=None)

#: ``gen_ai.provider.name`` by upstream host suffix (well-known values of the conventions, else a custom one).
_PROVIDERS = (("openai.com", "openai"), ("openai.azure.com", "azure.ai.openai"), ("anthropic.com", "anthropic"),
              ("deepseek.com", "deepseek"), ("mistral.ai", "mistral_ai"), ("groq.com", "groq"), ("x.ai", "x_ai"),
              ("perplexity.ai", "perplexity"), ("cohere.com", "cohere"), ("cohere.ai", "cohere"),
              ("googleapis.com", "gcp.gen_ai"), ("dashscope.aliyuncs.com", "alibaba.dashscope"),
              ("hunyuan.cloud.tencent.com", "tencent.hunyuan"), ("bigmodel.cn", "zhipu"), ("z.ai", "zhipu"),
              ("moonshot.cn", "moonshot"), ("moonshot.ai", "moonshot"))
#: ``gen_ai.provider.name`` of an OpenAI-compatible upstream not in ``_PROVIDERS`` (vLLM, self-hosted, the simulator).
OPENAI_COMPATIBLE = "openai_compatible"


def _text(value: object, limit: int = ATTRIBUTE_CHARS_MAX) -> str:
    return str(value)[:limit]


@functools.lru_cache(maxsize=256)
def _server(base_url: str) -> tuple[str, int | None, str]:
    """``(host, port, provider name)`` of an upstream base URL."""
    try:
        parts = urlsplit(base_url)
        host, port = (parts.hostname or ""), parts.port
    except ValueError:
        return "", None, OPENAI_COMPATIBLE
    provider = next((name for suffix, name in _PROVIDERS if host == suffix or host.endswith("." + suffix)),
                    OPENAI_COMPATIBLE)
    return host, port, provider


def usage_details(usage: Mapping[str, Any] | None) -> dict[str, int]:
    """The GenAI usage attributes of an OpenAI-style usage object (absent or malformed parts left out):
    input, output, cache read (``prompt_tokens_details.cached_tokens``, DeepSeek's ``prompt_cache_hit_tokens``,
    Anthropic-style ``cache_read_input_tokens``), cache write (``cache_creation_input_tokens``) and
    reasoning (``completion_tokens_details.reasoning_tokens``) tokens."""
    if not isinstance(usage, Mapping):
        return {}

    def number(obj: Any, key: str) -> int | None:
        value = obj.get(key) if isinstance(obj, Mapping) else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    found = {
        sc.USAGE_INPUT_TOKENS: number(usage, "prompt_tokens"),
        sc.USAGE_OUTPUT_TOKENS: number(usage, "completion_tokens"),
        sc.USAGE_CACHE_READ_INPUT_TOKENS: next((v for v in (number(usage.get("prompt_tokens_details"), "cached_tokens"),
                                                            number(usage, "prompt_cache_hit_tokens"),
                                                            number(usage, "cache_read_input_tokens"))
                                                if v is not None), None),
        sc.USAGE_CACHE_CREATION_INPUT_TOKENS: number(usage, "cache_creation_input_tokens"),
        sc.USAGE_REASONING_OUTPUT_TOKENS: number(usage.get("completion_tokens_details"), "reasoning_tokens"),
    }
    return {k: v for k, v in found.items() if v is not None}


class _OtlpInstruments:
    """The GenAI histograms of the OTLP meter (created on first use; None without OTLP metrics)."""

    def __init__(self, meter: Any) -> None:
        self.tokens = meter.create_histogram(sc.METRIC_TOKEN_USAGE, unit="{token}",
                                             description="Number of input and output tokens used.")
        self.duration = meter.create_histogram(sc.METRIC_OPERATION_DURATION, unit="s",
                                               description="GenAI operation duration.")
        self.ttfc = meter.create_histogram(sc.METRIC_TIME_TO_FIRST_CHUNK, unit="s",
                                           description="Time to receive the first chunk of a streaming response.")
        self.cost = meter.create_counter(sc.METRIC_COST, unit="{USD}",
                                         description="USD spent upstream at the price in force (billing).")


_instruments: _OtlpInstruments | None | bool = False  # False: not looked up yet


def _otlp() -> _OtlpInstruments | None:
    global _instruments
    if _instruments is False:
        meter = tracing.meter()
        _instruments = _OtlpInstruments(meter) if meter is not None else None
    return _instruments if isinstance(_instruments, _OtlpInstruments) else None


def model_label(target: UpstreamTarget, labels: metrics.RequestLabels | None) -> str:
    """The ``model`` of the GenAI metrics: the upstream model of a route (an operator wrote it), or
    ``default`` when the tenant's default upstream served the client's own model string, which never
    becomes a label value (docs/metrics.md, "Labels")."""
    if labels is None or labels.route in (metrics.DEFAULT_ROUTE, metrics.NO_ROUTE, metrics.UNKNOWN):
        return metrics.DEFAULT_ROUTE
    return metrics.bounded("model", target.model)


#: The Prometheus children of one (upstream, model, error type) series set: duration, turns, TTFT, input and
#: output tokens. Looked up once (``labels()`` takes a lock and hashes every label: ~25 µs per call for the
#: five), then a dict read per upstream call; cleared at ``_CHILDREN_MAX`` entries.
_children: dict[tuple[str, str, str], tuple[Any, Any, Any, Any, Any]] = {}
_CHILDREN_MAX = 4096


def _series(upstream: str, model: str, error_type: str) -> tuple[Any, Any, Any, Any, Any]:
    key = (upstream, model, error_type)
    found = _children.get(key)
    if found is None:
        if len(_children) >= _CHILDREN_MAX:
            _children.clear()
        broken = "true" if error_type else "false"
        found = _children[key] = (
            metrics.GEN_AI_DURATION.labels(upstream=upstream, model=model, error_type=error_type),
            metrics.GEN_AI_TURNS.labels(upstream=upstream, model=model, broken=broken),
            metrics.GEN_AI_TTFT.labels(upstream=upstream, model=model),
            metrics.GEN_AI_TOKENS.labels(upstream=upstream, model=model, token_type=sc.TOKEN_INPUT),
            metrics.GEN_AI_TOKENS.labels(upstream=upstream, model=model, token_type=sc.TOKEN_OUTPUT))
    return found


def observe_call(target: UpstreamTarget, record: AttemptRecord, labels: metrics.RequestLabels | None = None) -> None:
    """The GenAI metrics of one finished upstream call (Prometheus always, OTLP when configured); ``labels``:
    the request's (its route decides whether the upstream model may be a label value). A call is broken
    (``broken="true"``) when its ``error_type`` is set: an HTTP status, ``broken_output`` or ``upstream_error``."""
    upstream = metrics.bounded("upstream", target.name)
    model = model_label(target, labels)
    error_type = (str(record.upstream_status) if record.upstream_status and record.upstream_status != 200
                  else ("broken_output" if record.outcome == "retry" else
                        ("upstream_error" if record.outcome == "upstream-error" else "")))
    duration, turns, ttft, tokens_in, tokens_out = _series(upstream, model, error_type)
    seconds = (record.duration_ms or 0.0) / 1000
    duration.observe(seconds)
    turns.inc()
    ttfc = record.ttfb_ms / 1000 if record.ttfb_ms is not None else None
    if ttfc is not None:
        ttft.observe(ttfc)
    if record.prompt_tokens:
        tokens_in.observe(record.prompt_tokens)
    if record.completion_tokens:
        tokens_out.observe(record.completion_tokens)
    otlp = _otlp()
    if otlp is None:
        return
    host, _, provider = _server(target.base_url)
    attrs: dict[str, Any] = {sc.OPERATION_NAME: sc.OPERATION_CHAT, sc.PROVIDER_NAME: provider,
                             sc.REQUEST_MODEL: model, sc.SERVER_ADDRESS: host, sc.UPSTREAM: upstream}
    otlp.duration.record(seconds, {**attrs, sc.ERROR_TYPE: error_type} if error_type else attrs)
    if ttfc is not None:
        otlp.ttfc.record(ttfc, attrs)
    if record.prompt_tokens:
        otlp.tokens.record(record.prompt_tokens, {**attrs, sc.TOKEN_TYPE: sc.TOKEN_INPUT})
    if record.completion_tokens:
        otlp.tokens.record(record.completion_tokens, {**attrs, sc.TOKEN_TYPE: sc.TOKEN_OUTPUT})
    if record.cost_usd:
        otlp.cost.add(record.cost_usd, {**attrs, sc.COST_KIND: "wasted" if error_type else "delivered"})


class AttemptScope:
    """The span of one upstream attempt, as a context manager (``with trace.attempt(n, target) as a:``);
    ``a.ended(result)`` hands it the attempt's result (its turn: response model, finish reasons, usage)."""

    def __enter__(self) -> AttemptScope:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        return None

    def ended(self, result: Any) -> None:
        """The attempt's ``proxy.relay.paths.Attempted`` (no-op here)."""


_NO_ATTEMPT = AttemptScope()


class RequestTrace:
    """The recorder of one request. This base is the no-op one (:data:`NOOP`): tracing off."""

    recording = False

    def routed(self, call: Any, *, secrets: Callable[[], frozenset[str]] | None = None) -> None:
        """The request is understood (a ``proxy.relay.loop.RelayCall``); ``secrets`` gives the redaction set."""

    def attempt(self, number: int, target: UpstreamTarget) -> AttemptScope:
        """Open the CLIENT span of attempt ``number`` (0-based) to ``target``; it is current inside the ``with``."""
        return _NO_ATTEMPT

    def call_recorded(self, target: UpstreamTarget, record: AttemptRecord,
                      labels: metrics.RequestLabels | None = None) -> None:
        """One upstream call journaled (``proxy.relay.attempts.AttemptLog.add``): GenAI metrics, span data."""
        observe_call(target, record, labels)

    def retry(self, number: int, *, upstream: str, cause: str, decision: Decision | None) -> None:
        """Retry ``number`` (1-based) is about to be made after a failed call to ``upstream``."""

    def event(self, name: str, **attributes: Any) -> None:
        """An event on the request span (``semconv.EVENT_*``): retry budget, loop breaker, limits."""

    def relayed(self, *, outcome: str, attempts: int, ttft: float | None, delivered_usd: float = 0.0,
                wasted_usd: float = 0.0, unpriced: bool = False) -> None:
        """The relay ended: its outcome, attempt count, the client's TTFT (seconds) and its cost in USD
        (``delivered_usd``: the attempt the client got; ``wasted_usd``: the others; ``unpriced``: an attempt
        with tokens had no price)."""

    def end(self, status: int | None) -> None:
        """The response is finished (its HTTP status); ends the request span."""


NOOP = RequestTrace()


class _AttemptSpan(AttemptScope):
    """A recording attempt span."""

    def __init__(self, trace: SpanTrace, number: int, target: UpstreamTarget) -> None:
        self.trace = trace
        tracer = tracing.tracer()
        assert tracer is not None
        name, base = _attempt_base(target.base_url, target.model, target.name)
        #: Every attribute but the start's: set on the span in one call when it closes (one lock, one pass).
        self.attrs: dict[str, Any] = {}
        self.span = tracer.start_span(name, kind=SpanKind.CLIENT, context=otel_trace.set_span_in_context(trace.span),
                                      attributes={**base, sc.ATTEMPT_NUMBER: number})
        self.records: list[AttemptRecord] = []
        self._token: object | None = None
        self.open = True

    def __enter__(self) -> _AttemptSpan:
        self._token = otel_context.attach(otel_trace.set_span_in_context(self.span))
        self.trace.attempt_span = self
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            if self._token is not None:
                otel_context.detach(self._token)  # type: ignore[arg-type]
            self._close(exc)
        except Exception:  # never into the request path
            logger.debug("attempt span", exc_info=True)

    def ended(self, result: Any) -> None:
        decision = getattr(result, "decision", None)
        turn = getattr(decision, "turn", None)
        if turn is not None:
            try:
                self._turn(turn)
            except Exception:
                logger.debug("attempt span turn", exc_info=True)

    def _turn(self, turn: Turn) -> None:
        attrs = self.attrs
        if turn.model:
            attrs[sc.RESPONSE_MODEL] = _text(turn.model)
        if turn.id:
            attrs[sc.RESPONSE_ID] = _text(turn.id)
        reasons = [c.finish_reason for c in turn.choices if c.finish_reason]
        if reasons:
            attrs[sc.RESPONSE_FINISH_REASONS] = [_text(r, 32) for r in reasons[:16]]
        attrs.update(usage_details(turn.usage))
        if self.trace.content:
            messages = [{"role": "assistant", "content": self.trace.scrub(c.content or ""),
                         "tool_calls": [{"name": t.name, "arguments": self.trace.scrub(t.arguments)}
                                        for t in c.tool_calls],
                         "finish_reason": c.finish_reason} for c in turn.choices]
            attrs[sc.OUTPUT_MESSAGES] = json.dumps(messages, ensure_ascii=False)[:CONTENT_CHARS_MAX]

    def record(self, target: UpstreamTarget, record: AttemptRecord) -> None:
        self.records.append(record)

    def _close(self, exc: BaseException | None) -> None:
        self.open = False
        if self.trace.attempt_span is self:
            self.trace.attempt_span = None
        span = self.span
        refused, last = self.records[:-1], (self.records[-1] if self.records else None)
        for earlier in refused:
            span.add_event(sc.EVENT_REFUSAL, {sc.HTTP_RESPONSE_STATUS_CODE: earlier.upstream_status or 0,
                                              sc.FINDING_KIND: [f.kind.value for f in earlier.findings][:8]})
        findings = [f for r in self.records for f in r.findings]
        for finding in findings[:EVENTS_MAX]:
            span.add_event(sc.EVENT_FINDING, self.trace.finding_attributes(finding))
        attrs = self.attrs
        error_type = ""
        if last is not None:
            attrs[sc.ATTEMPT_OUTCOME], attrs[sc.BYTES_RECEIVED], attrs[sc.FRAMES] = (
                last.outcome, last.bytes_received, last.frames)
            if last.upstream_status is not None:
                attrs[sc.HTTP_RESPONSE_STATUS_CODE] = last.upstream_status
            if last.ttfb_ms is not None:
                attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] = last.ttfb_ms / 1000
            if last.prompt_tokens and not attrs.get(sc.USAGE_INPUT_TOKENS):
                attrs[sc.USAGE_INPUT_TOKENS] = last.prompt_tokens
            if last.completion_tokens and not attrs.get(sc.USAGE_OUTPUT_TOKENS):
                attrs[sc.USAGE_OUTPUT_TOKENS] = last.completion_tokens
            if last.cost_usd is not None:
                attrs[sc.COST_USD] = last.cost_usd
            if last.outcome in ("retry", "upstream-error"):
                first = next(iter(last.findings), None)
                error_type = (str(last.upstream_status) if last.upstream_status and last.upstream_status != 200
                              else (first.kind.value if first is not None else last.outcome))
        if exc is not None:
            error_type = error_type or ("timeout" if isinstance(exc, TimeoutError) else type(exc).__name__)
        if error_type:
            attrs[sc.ERROR_TYPE] = error_type
            span.set_status(Status(StatusCode.ERROR, error_type))
        span.set_attributes(attrs)
        span.end()


@functools.lru_cache(maxsize=1024)
def _attempt_base(base_url: str, model: str, upstream: str) -> tuple[str, dict[str, Any]]:
    """The name and start attributes of an attempt span to one target (made once per target, copied per
    attempt: the same few targets serve every request)."""
    host, port, provider = _server(base_url)
    attributes: dict[str, Any] = {sc.OPERATION_NAME: sc.OPERATION_CHAT, sc.PROVIDER_NAME: provider,
                                  sc.REQUEST_MODEL: _text(model), sc.SERVER_ADDRESS: host, sc.UPSTREAM: _text(upstream)}
    if port is not None:
        attributes[sc.SERVER_PORT] = port
    return f"{sc.OPERATION_CHAT} {_text(model, 100)}", attributes


class SpanTrace(RequestTrace):
    """A recording trace: the request's SERVER span and its attempts' CLIENT spans."""

    recording = True

    def __init__(self, span: Any, *, request_id: str) -> None:
        self.span = span
        self.request_id = request_id
        self.attempt_span: _AttemptSpan | None = None
        self.content = False
        self._secrets: Callable[[], frozenset[str]] | None = None
        #: The request span's attributes after its start: set in one call at ``end``.
        self.attrs: dict[str, Any] = {}

    def scrub(self, text: str) -> str:
        """``text`` through the audit's redaction (``infra.scrub.redact``) with the upstream secrets, capped."""
        from infra.scrub import redact

        secrets = self._secrets() if self._secrets is not None else frozenset()
        return redact(text[:CONTENT_CHARS_MAX], secrets)

    def finding_attributes(self, finding: Any) -> dict[str, Any]:
        """The event attributes of a guard finding: never its detail or fragment unless content capture is on."""
        attrs: dict[str, Any] = {sc.FINDING_KIND: finding.kind.value, sc.FINDING_SEVERITY: str(finding.severity.value),
                                 sc.FINDING_DECISION: str(finding.action.value)}
        for key, value in ((sc.FINDING_FRAME, finding.frame), (sc.FINDING_OFFSET, finding.offset),
                           (sc.FINDING_CHOICE, finding.choice)):
            if isinstance(value, int):
                attrs[key] = value
        if finding.tool:
            attrs[sc.TOOL_NAME] = _text(finding.tool)
        if self.content:
            if finding.detail:
                attrs[sc.FINDING_DETAIL] = self.scrub(finding.detail)
            if finding.fragment:
                attrs[sc.FINDING_FRAGMENT] = self.scrub(finding.fragment)
        return attrs

    def routed(self, call: Any, *, secrets: Callable[[], frozenset[str]] | None = None) -> None:
        try:
            request = call.request
            self.attrs.update({sc.OPERATION_NAME: sc.OPERATION_CHAT, sc.REQUEST_MODEL: _text(request.model),
                               sc.REQUEST_STREAM: bool(request.stream), sc.PATH: call.path,
                               sc.CLIENT_PROTOCOL: call.protocol, sc.TENANT: call.principal.slug,
                               sc.ROUTE: _text(call.plan.route_name or metrics.DEFAULT_ROUTE)})
            self.content = bool(getattr(call.plan.policy, "trace_content", False))
            self._secrets = secrets
        except Exception:
            logger.debug("request span attributes", exc_info=True)

    def attempt(self, number: int, target: UpstreamTarget) -> AttemptScope:
        try:
            return _AttemptSpan(self, number, target)
        except Exception:
            logger.debug("attempt span", exc_info=True)
            return _NO_ATTEMPT

    def call_recorded(self, target: UpstreamTarget, record: AttemptRecord,
                      labels: metrics.RequestLabels | None = None) -> None:
        observe_call(target, record, labels)
        attempt = self.attempt_span
        if attempt is not None and attempt.open:
            attempt.record(target, record)
            return
        try:  # a call recorded outside an attempt span (the request deadline cut it): an event here
            self.span.add_event("toolrelay.attempt.interrupted", {
                sc.ATTEMPT_OUTCOME: record.outcome, sc.UPSTREAM: _text(target.name),
                sc.FINDING_KIND: [f.kind.value for f in record.findings][:8]})
        except Exception:
            logger.debug("interrupted attempt event", exc_info=True)

    def retry(self, number: int, *, upstream: str, cause: str, decision: Decision | None) -> None:
        reason = ""
        if decision is not None:
            first = next(iter(decision.findings), None)
            reason = first.kind.value if first is not None else (decision.error.type if decision.error else "")
        self.event(sc.EVENT_RETRY, **{sc.ATTEMPT_NUMBER: number, sc.UPSTREAM: _text(upstream),
                                      sc.RETRY_CAUSE: cause, sc.RETRY_REASON: _text(reason)})

    def event(self, name: str, **attributes: Any) -> None:
        try:
            self.span.add_event(name, attributes)
        except Exception:
            logger.debug("request event", exc_info=True)

    def relayed(self, *, outcome: str, attempts: int, ttft: float | None, delivered_usd: float = 0.0,
                wasted_usd: float = 0.0, unpriced: bool = False) -> None:
        attrs = self.attrs
        attrs[sc.OUTCOME], attrs[sc.ATTEMPTS] = outcome, attempts
        if ttft is not None:
            attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] = ttft
        attrs[sc.COST_DELIVERED_USD] = delivered_usd
        if wasted_usd:  # the total is delivered + wasted: no third attribute to encode per request
            attrs[sc.COST_WASTED_USD] = wasted_usd
        if unpriced:
            attrs[sc.COST_UNPRICED] = True

    def end(self, status: int | None) -> None:
        try:
            attrs = self.attrs
            if status is not None:
                attrs[sc.HTTP_RESPONSE_STATUS_CODE] = status
                if status >= 500:
                    self.span.set_status(Status(StatusCode.ERROR))
                    attrs[sc.ERROR_TYPE] = str(status)
            if attrs:
                self.span.set_attributes(attrs)
            self.span.end()
        except Exception:
            logger.debug("request span end", exc_info=True)


def current() -> RequestTrace:
    """The trace of the request the running task serves (:data:`NOOP` outside one, or with tracing off)."""
    return _current.get() or NOOP


_WANTED = frozenset({b"traceparent", b"tracestate"})
_NO_PARENT = otel_context.Context()  # a request without traceparent: a new trace (what ``extract`` gives)


def _headers(scope: Mapping[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1")[:512]
            for k, v in scope.get("headers") or () if k.lower() in _WANTED}


def start_request(scope: Mapping[str, Any], *, request_id: str, route: str | None = None) -> RequestTrace:
    """Begin the trace of one request (the consumer, in the request's own task): a SERVER span whose
    parent is the client's W3C ``traceparent`` / ``tracestate`` when valid, made current for the task;
    binds the log context (``infra.logcontext``). ``route``: the path template for the span name
    (None: the method alone, for paths nobody routed)."""
    tracer = tracing.tracer()
    if tracer is None:
        logcontext.bind(request_id=request_id)
        return NOOP
    try:
        carrier = _headers(scope)
        parent = _PROPAGATOR.extract(carrier) if carrier else _NO_PARENT
        method = _text(scope.get("method") or "HTTP", 16)
        attributes = {sc.HTTP_REQUEST_METHOD: method, sc.URL_PATH: _text(scope.get("path", "")),
                      sc.REQUEST_ID: request_id}
        if route:
            attributes[sc.HTTP_ROUTE] = route
        span = tracer.start_span(f"{method} {route}" if route else method, context=parent, kind=SpanKind.SERVER,
                                 attributes=attributes)
        otel_context.attach(otel_trace.set_span_in_context(span, parent))  # the task's own context
        context = span.get_span_context()
        logcontext.bind(request_id=request_id, trace_id=f"{context.trace_id:032x}", span_id=f"{context.span_id:016x}")
    except Exception:
        logger.debug("request span", exc_info=True)
        logcontext.bind(request_id=request_id)
        return NOOP
    trace = SpanTrace(span, request_id=request_id)
    _current.set(trace)
    return trace


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's ``traceparent`` (and ``tracestate``) to an upstream request's ``headers``;
    nothing when tracing is off or no span is current."""
    if tracing.provider() is None:
        return
    context = otel_trace.get_current_span().get_span_context()
    if not context.is_valid:
        return
    # W3C Trace Context level 1, section 3.2 (what TraceContextTextMapPropagator writes, without its generic path)
    headers["traceparent"] = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    if context.trace_state:
        headers["tracestate"] = context.trace_state.to_header()


__all__ = ["NOOP", "AttemptScope", "RequestTrace", "SpanTrace", "current", "inject", "observe_call",
           "start_request", "usage_details"]

