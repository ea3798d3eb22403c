"""The audit side of one request's upstream calls: numbered records, scrubbed texts, metrics.

``AttemptLog`` numbers every upstream call in call order (a refused call that the upstream client
asked again past is a call of its own), redacts upstream credentials from every text that reaches
the client or the audit (some upstreams echo the key they were sent in their error messages), and
journals each record the moment its call ends (``audit.records.attempt_finished``): a corrupted
attempt is on record before its retry starts, without a database round trip.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from audit import records as audit
from billing.book import price_book
from infra import metrics
from infra.scrub import redact
from proxy.guard.checks.usage import Usage, read_usage
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from proxy.guard.stream.errors import http_error_decision
from proxy.guard.turn import Decision, Outcome, UpstreamError
from proxy.telemetry import spans
from proxy.upstreams.client import (
    Refusal,
    UpstreamMisconfigured,
    UpstreamRefusedByPolicy,
    UpstreamResponse,
    UpstreamTimeout,
    secrets_of,
)
from proxy.upstreams.refusals import Refused
from tenants.principal import UpstreamTarget


def failure_decision(exc: Exception) -> Decision:
    """The decision for a connection failure or a timeout (``UpstreamMisconfigured`` is not retryable)."""
    if isinstance(exc, UpstreamMisconfigured):
        error = UpstreamError(status=502, message=str(exc), type="upstream_misconfigured", retryable=False)
        refused = isinstance(exc, UpstreamRefusedByPolicy)
        kind = FindingKind.OUTBOUND_ADDRESS_REFUSED if refused else FindingKind.UPSTREAM_CONNECTION_ERROR
        finding = Finding(kind, Severity.ERROR, Action.ERROR, exc.detail)
        return Decision(Outcome.UPSTREAM_ERROR, None, (finding,), reason=str(exc), error=error)
    if isinstance(exc, UpstreamTimeout):
        error = UpstreamError(status=504, message=str(exc), type="upstream_timeout")
        kind = FindingKind.UPSTREAM_TIMEOUT
    else:
        error = UpstreamError(status=502, message=str(exc), type="upstream_unavailable")
        kind = FindingKind.UPSTREAM_CONNECTION_ERROR
    finding = Finding(kind, Severity.ERROR, Action.RETRY, str(exc))
    return Decision(Outcome.UPSTREAM_ERROR, None, (finding,), reason=str(exc), error=error)


def parameter_refused_detail(refused: Refused) -> str:
    """The audit's sentence for a parameter refusal, e.g. ``deepseek refused it: "Invalid max_tokens
    value, ..."; asked again at once with max_tokens <= 8192 (remembered)``."""
    fixes = ", ".join(f"{f.describe()} ({'remembered' if f.remember else 'this request only'})" for f in refused.fixes)
    return f'{refused.family} refused it: "{refused.message}"; asked again at once with {fixes}'[:1000]


#: Bytes of an upstream event stream per output token, for an answer without usage (frames carry JSON
#: around each delta; ``proxy.edge.consumers`` counts the same).
OUTPUT_BYTES_PER_TOKEN = 16


@dataclasses.dataclass(frozen=True, slots=True)
class UpstreamCall:
    """One upstream call as it ended, what ``AttemptLog.add`` makes an ``audit.AttemptRecord`` of.

    ``outcome`` is the guard's verdict (its value is the record's and the journal's ``outcome``: ``clean``,
    ``normalized``, ``repaired``, ``retry``, ``upstream-error``); ``started`` / ``ended`` are monotonic
    seconds (``ended`` None: now); ``upstream_status`` None when no answer came (a transport failure);
    ``usage`` the upstream's raw usage object of an answer (read, bounded, estimated and priced by ``add``);
    ``ttfb_ms`` milliseconds to the first upstream byte; ``body`` the raw upstream body (redacted by ``add``)."""

    target: UpstreamTarget
    outcome: Outcome
    started: float
    ended: float | None = None
    upstream_status: int | None = None
    findings: Sequence[Finding] = ()
    abort_reason: str = ""
    usage: Any = None
    ttfb_ms: float | None = None
    bytes_received: int = 0
    frames: int = 0
    body: bytes = b""

    @classmethod
    def answered(cls, target: UpstreamTarget, started: float, decision: Decision, *, bytes_received: int,
                 frames: int = 0, body: bytes = b"", ttfb_ms: float | None = None,
                 findings: Sequence[Finding] | None = None, abort_reason: str | None = None) -> UpstreamCall:
        """A 200 answer the guard judged (``decision``): its outcome, findings (``findings`` in their place when
        given), the reason of an unusable turn (``abort_reason`` in its place when given) and the turn's usage."""
        return cls(target, decision.outcome, started, upstream_status=200,
                   findings=decision.findings if findings is None else findings,
                   abort_reason=("" if decision.usable else decision.reason) if abort_reason is None else abort_reason,
                   usage=decision.turn.usage if decision.turn is not None else None, ttfb_ms=ttfb_ms,
                   bytes_received=bytes_received, frames=frames, body=body)


@dataclasses.dataclass(frozen=True, slots=True)
class _Tokens:
    """An answered call's tokens, their estimate flag, the usage findings and its cost (``billing``)."""

    usage: Usage
    findings: tuple[Finding, ...]
    cost_usd: float | None  # None: no price for its model (unpriced)

    def fields(self) -> dict[str, Any]:
        usage = self.usage
        return {"prompt_tokens": usage.prompt or 0, "completion_tokens": usage.completion or 0,
                "cache_read_tokens": usage.cache_read, "cache_write_tokens": usage.cache_write,
                "reasoning_tokens": usage.reasoning, "usage_estimated": usage.estimated, "cost_usd": self.cost_usd}


def read_tokens(raw: Any, *, answered: bool, prompt_estimate: int, bytes_received: int) -> tuple[Usage,
                                                                                               tuple[Finding, ...]]:
    """An attempt's upstream ``raw`` usage object read (``proxy.guard.checks.usage``), and one ``usage-invalid``
    finding per refused field. An attempt the upstream ``answered`` (200 with bytes) without usable usage is
    estimated: the request's ``prompt_estimate`` and ``bytes_received`` / ``OUTPUT_BYTES_PER_TOKEN``; one it did
    not answer cost nothing."""
    usage = read_usage(raw)
    if not usage.known and answered:
        usage = usage.with_estimate(prompt_estimate, bytes_received // OUTPUT_BYTES_PER_TOKEN)
    extra = tuple(Finding(FindingKind.USAGE_INVALID, Severity.WARNING, Action.NORMALIZED, text[:500])
                  for text in usage.anomalies)
    return usage, extra


class AttemptLog:
    """The upstream calls of one request (``all``, in call order), each journaled when it ends."""

    def __init__(self, record: audit.RequestRecord, targets: tuple[UpstreamTarget, ...],
                 labels: metrics.RequestLabels | None = None) -> None:
        self.record = record
        self._targets = targets
        self.labels = labels or metrics.request_labels(tenant="", route=None, upstream=None, path=record.path)
        self._secrets: frozenset[str] | None = None
        self.all: list[audit.AttemptRecord] = []
        self.upstreams: list[str] = []  # the upstream name of each of ``all``
        #: The request's input tokens, estimated from its size (an answer without usage is charged this).
        self.prompt_estimate = 0
        self.trace = spans.current()  # GenAI metrics and the attempt span (``proxy.telemetry.spans``)

    @property
    def secrets(self) -> frozenset[str]:
        """Every credential and extra header value of the plan's upstreams (decrypted once, on demand)."""
        if self._secrets is None:
            self._secrets = frozenset().union(*(secrets_of(t) for t in self._targets))
        return self._secrets

    def add(self, call: UpstreamCall) -> audit.AttemptRecord:
        """Record one upstream call, numbered in call order: its body and abort reason redacted; the usage
        of an answer (200, or any call with a usage object) read and bounded, estimated when unusable, priced."""
        target, findings = call.target, call.findings
        tokens = self._tokens(call) if call.upstream_status == 200 or call.usage is not None else None
        if tokens is not None and tokens.findings:
            findings = (*findings, *tokens.findings)
        metrics.observe_attempt(self.labels, upstream=target.name, outcome=call.outcome.value,
                                ttfb=call.ttfb_ms / 1000 if call.ttfb_ms is not None else None,
                                findings=[f.kind.value for f in findings])
        body = call.body  # surrogateescape: undecodable upstream bytes come back exactly
        if body:
            body = redact(body.decode("utf-8", "surrogateescape"), self.secrets).encode("utf-8", "surrogateescape")
        duration = ((call.ended if call.ended is not None else time.monotonic()) - call.started) * 1000
        record = audit.AttemptRecord(
            number=len(self.all), upstream_id=target.upstream_id, upstream_model=target.model,
            outcome=call.outcome.value, duration_ms=duration, upstream_status=call.upstream_status,
            abort_reason=redact(call.abort_reason, self.secrets) if call.abort_reason else call.abort_reason,
            ttfb_ms=call.ttfb_ms, bytes_received=call.bytes_received, frames=call.frames, findings=findings,
            body=body, **(tokens.fields() if tokens is not None else {}))
        self.all.append(record)
        self.upstreams.append(target.name)
        audit.attempt_finished(request=self.record, attempt=record)
        self.trace.call_recorded(target, record, self.labels)
        return record

    def _tokens(self, call: UpstreamCall) -> _Tokens:
        """The call's tokens, their estimate flag, usage findings and cost (``billing``)."""
        answered = call.upstream_status == 200 and bool(call.bytes_received)
        usage, extra = read_tokens(call.usage, answered=answered, prompt_estimate=self.prompt_estimate,
                                   bytes_received=call.bytes_received or 0)
        target = call.target
        cost = price_book().cost(usage, model=target.model, upstream=target.name) \
            if usage.prompt or usage.completion else 0.0
        return _Tokens(usage, extra, cost)

    def scrub(self, decision: Decision) -> Decision:
        """``decision`` with upstream credentials redacted from its findings, reason and error."""
        if not decision.findings and decision.error is None:
            return decision
        secrets = self.secrets
        findings = tuple(dataclasses.replace(f, detail=redact(f.detail, secrets), fragment=redact(f.fragment, secrets))
                         for f in decision.findings)
        error = decision.error
        if error is not None:
            error = dataclasses.replace(error, message=redact(error.message, secrets))
        return dataclasses.replace(decision, findings=findings, reason=redact(decision.reason, secrets), error=error)

    def refusals(self, target: UpstreamTarget, response: UpstreamResponse) -> None:
        """Record the answers the upstream client asked again past (each a call of its own); a parameter
        refusal carries an ``upstream-parameter-refused`` finding saying what was fixed."""
        for refusal in response.refusals:
            if refusal.refused is None:
                self._http_record(target, refusal)
                continue
            finding = Finding(FindingKind.UPSTREAM_PARAMETER_REFUSED, Severity.WARNING, Action.RETRY,
                              redact(parameter_refused_detail(refusal.refused), self.secrets),
                              fragment=redact(refusal.refused.message, self.secrets))
            self.add(UpstreamCall(target, Outcome.UPSTREAM_ERROR, refusal.started, ended=refusal.ended,
                                  upstream_status=refusal.status, findings=(finding,), abort_reason=finding.detail,
                                  body=refusal.body))

    def _http_record(self, target: UpstreamTarget, refusal: Refusal) -> Decision:
        decision = self.scrub(http_error_decision(refusal.status, refusal.body, refusal.headers))
        self.add(UpstreamCall(target, Outcome.UPSTREAM_ERROR, refusal.started, ended=refusal.ended,
                              upstream_status=refusal.status, findings=decision.findings,
                              abort_reason=decision.reason, body=refusal.body))
        return decision

    async def http_failure(self, target: UpstreamTarget, started: float, response: UpstreamResponse) -> Decision:
        """Record a non-200 answer and return its decision."""
        body = await response.read_capped()
        return self._http_record(target, Refusal(response.status, body, response.headers, started, time.monotonic()))

    def transport_failure(self, target: UpstreamTarget, started: float, exc: Exception, *,
                          upstream_status: int | None = None) -> Decision:
        """Record a connection failure or timeout and return its decision (scrubbed: an httpx error about an
        illegal header value quotes the value, which may be a secret)."""
        decision = self.scrub(failure_decision(exc))
        self.add(UpstreamCall(target, Outcome.UPSTREAM_ERROR, started, upstream_status=upstream_status,
                              findings=decision.findings, abort_reason=decision.reason))
        return decision
