"""The relay: one client request driven against its upstream(s), in one attempt loop.

Protocol-agnostic: the consumer hands it a ``RelayCall`` (the principal, the route plan, the
prepared chat request and the emitter of the client's protocol) and the ``ClientResponse`` it
writes to. The path strategy (``proxy.relay.paths``: pass-through, guarded, non-stream) makes each
upstream call; the loop here decides whether to retry, waits between retries, and when the
attempts run out asks ``proxy.guard.decisions.answer.answer_for`` what the client gets. The request outcome
is set once, when the request ends.

Audit records go to the process's journal at once (``audit.services``): the request's start, each
attempt when it ends (before any retry), the request's end; the journal writer moves them into the
database off the byte path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from audit import records as audit
from infra import metrics
from infra.background import drain_background, schedule
from proxy.guard.checks.request import ChatRequest
from proxy.guard.decisions.answer import RequestOutcome, answer_for, model_failure
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from proxy.guard.protocols.emit import Emitter
from proxy.guard.turn import Decision, Outcome, UpstreamError
from proxy.policy.loop_breaker import LoopBreaker
from proxy.policy.retry_budget import count_request, take_retry
from proxy.relay.attempts import AttemptLog
from proxy.relay.paths import (
    Attempted,
    Deadlines,
    Delivered,
    Ending,
    Failed,
    Guarded,
    NonStream,
    PassThrough,
    PathInputs,
    Received,
)
from proxy.routing import quality
from proxy.routing.router import Router, key_failure
from proxy.telemetry import semconv, spans
from proxy.upstreams.client import DeadlineExceeded, UpstreamClient
from tenants.principal import Principal, RoutePlan, UpstreamTarget

if TYPE_CHECKING:
    from proxy.edge.response import ClientResponse

logger = logging.getLogger(__name__)

__all__ = ["Relay", "RelayCall", "drain_background"]


#: Characters per token of the request estimate (``proxy.edge.protocols.CHARS_PER_TOKEN``).
_CHARS_PER_TOKEN = 4


#: How a stream passed through unchanged to its end counts for the router: answered, no error.
_ANSWERED = Decision(Outcome.CLEAN, None)


def _judged(result: Attempted) -> Decision:
    """The decision an attempt's result is judged by (routing, quality): its own, or ``_ANSWERED``."""
    return result.decision if result.decision is not None else _ANSWERED


def _overflow_figures(decision: Decision, call: RelayCall) -> tuple[int, int | None]:
    """The request's size (tokens, estimated from its messages) and output budget, for a context-window
    refusal the upstream gave without figures (``answer_for``); nothing is counted for other answers."""
    error = decision.error
    if error is None or error.retryable:
        return 0, None
    body = call.request.body
    budget = next((v for k in ("max_tokens", "max_completion_tokens") if isinstance(v := body.get(k), int)
                   and not isinstance(v, bool) and v > 0), None)
    size = len(json.dumps(body.get("messages"), ensure_ascii=False, default=str))
    return max(1, size // _CHARS_PER_TOKEN), budget


@dataclass(slots=True)
class RelayCall:
    """One client request, understood: who (``principal``), where (``plan``), what (``request``, in
    chat.completions form) and how to answer (``emitter``, ``protocol``)."""

    principal: Principal
    plan: RoutePlan
    request: ChatRequest
    emitter: Emitter
    protocol: str = "openai-chat"  # the client protocol's name, for the audit and the trace
    #: The client's protocol is the upstream's (``proxy.edge.protocols.ClientProtocol.passes_through``): a
    #: request without ``tools`` may take the upstream's bytes unchanged.
    passes_through: bool = True
    user_agent: str = ""
    dropped: tuple[str, ...] = ()  # client fields the translation could not carry (each a finding)
    session: str = ""  # the agent session (``proxy.guard.decisions.loops.session_id``); "" = none known
    prompt_estimate: int = 0  # the request's input tokens, estimated from its size (for answers without usage)
    notes: tuple[Finding, ...] = ()  # request-level findings of its admission (a money budget past its threshold)
    #: The request's routing state (``proxy.routing.router``; ``plan`` is already its routed plan); None:
    #: nothing read, every circuit closed and every key ok for this request.
    router: Router | None = None

    @property
    def forwards_raw(self) -> bool:
        """True when upstream bytes go back unchanged: a pass-through protocol's request without ``tools``.
        Other protocols always go through the guard, which translates frame by frame."""
        return self.passes_through and not self.request.declares_tools

    @property
    def path(self) -> str:
        """``pass-through``, ``guarded`` or ``non-stream`` (``audit.models.ProxyRequest.Path``)."""
        if not self.request.stream:
            return "non-stream"
        return "pass-through" if self.forwards_raw else "guarded"


def request_record(call: RelayCall, response: ClientResponse) -> audit.RequestRecord:
    """The audit's record of ``call`` (its id is the client's ``x-request-id``), first target's upstream."""
    first = call.plan.target(0)
    return audit.RequestRecord(
        id=response.request_id, tenant_id=call.principal.tenant_id, api_key_id=call.principal.api_key_id,
        model=call.request.model, path=call.path, client_protocol=call.protocol,
        client_user_agent=call.user_agent, route_id=call.plan.route_id, upstream_id=first.upstream_id,
        upstream_model=first.model, fragments=call.plan.policy.fragments,
        member_id=call.principal.member_id, member_username=call.principal.member_username,
        findings=(*(Finding(FindingKind.REQUEST_FIELD_NOT_FORWARDED, Severity.INFO, Action.IGNORED,
                            f"not forwarded upstream: {path}"[:500]) for path in call.dropped), *call.notes),
    )


def refused(call: RelayCall, response: ClientResponse, *, status: int, error: str) -> None:
    """Journal a request refused before any upstream call (a limit's 429): outcome ``rejected``, no attempt,
    so usage reports count the limits hit (``audit.usage``)."""
    total_ms = 1000 * (time.monotonic() - response.started)
    audit.request_finished(request=request_record(call, response), result=audit.RequestResult(
        outcome="rejected", status=status, attempts=0, total_ms=total_ms, error=error))


def money(attempts: list[audit.AttemptRecord], good: audit.AttemptRecord | None, labels: metrics.RequestLabels,
          upstreams: list[str]) -> dict[str, Any]:
    """The request's cache and reasoning tokens, estimate flag and cost split (``delivered_usd``: ``good``'s,
    ``wasted_usd``: every other attempt's) as ``audit.RequestResult`` fields; counted in
    ``toolrelay_cost_usd_total`` (``upstreams``: each attempt's upstream name). An attempt with tokens and no
    price makes the request ``unpriced``."""
    delivered = (good.cost_usd or 0.0) if good is not None else 0.0
    wasted = sum(a.cost_usd or 0.0 for a in attempts if a is not good)
    for attempt, upstream in zip(attempts, upstreams, strict=False):
        if attempt.cost_usd:
            metrics.observe_cost(labels, upstream=upstream, model=attempt.upstream_model, usd=attempt.cost_usd,
                                 kind="delivered" if attempt is good else "wasted")
    return {"cache_read_tokens": sum(a.cache_read_tokens for a in attempts),
            "cache_write_tokens": sum(a.cache_write_tokens for a in attempts),
            "reasoning_tokens": sum(a.reasoning_tokens for a in attempts),
            "usage_estimated": any(a.usage_estimated for a in attempts),
            "unpriced": any(a.cost_usd is None for a in attempts), "delivered_usd": delivered, "wasted_usd": wasted}


class Relay:
    """Drives one request to the end: ``await Relay(call, response, client).run()``.

    Cancellation (the client left) propagates out of ``run()`` after the upstream response is
    closed by its context manager; the request is then recorded as client-cancelled.
    """

    def __init__(self, call: RelayCall, response: ClientResponse, client: UpstreamClient) -> None:
        self.call = call
        self.response = response
        self.client = client
        response.emitter = call.emitter
        first = call.plan.target(0)
        record = request_record(call, response)
        self.labels = metrics.request_labels(tenant=call.principal.slug, route=call.plan.route_name,
                                             upstream=first.name, path=call.path)
        self.log = AttemptLog(record, call.plan.targets, self.labels)
        self.log.prompt_estimate = call.prompt_estimate
        self.trace = spans.current()  # the request's trace (``proxy.telemetry``; a no-op with tracing off)
        self.trace.routed(call, secrets=lambda: self.log.secrets)
        self.deadlines = Deadlines(request=response.started + call.plan.deadline,
                                   retries=response.started + settings.RETRY_DEADLINE_SECONDS)
        self._current: tuple[UpstreamTarget, float] | None = None  # the attempt under way and its start
        self._last: Attempted | None = None
        self.attempts_made = 0
        self.outcome = RequestOutcome.UPSTREAM_ERROR
        self.error = ""
        #: What the client got at the end (``audit.delivered``), as the path that answered returned it; None
        #: for bytes passed through unchanged.
        self.delivered: Received = None
        #: The loop breaker of a request that declares tools (None for the others).
        self.loops = LoopBreaker(session=call.session, messages=call.request.body.get("messages"),
                                 policy=call.plan.policy) if call.request.declares_tools else None
        self.inputs = PathInputs(call=call, response=response, client=client, log=self.log,
                                 deadlines=self.deadlines, loops=self.loops, trace=self.trace)
        #: Set when the tenant's retry budget stopped a retry (``proxy.policy.retry_budget``).
        self.budget_spent: Finding | None = None
        self.session_moved: Finding | None = None
        self.router = call.router or Router(call.plan, {}, {}, tenant_id=call.principal.tenant_id)

    async def run(self) -> None:
        """Serve the request on its path; always leaves an audit record behind."""
        metrics.IN_FLIGHT.inc()
        audit.request_started(request=self.log.record)
        count_request(self.call.principal.tenant_id)
        try:
            await self._serve()
        except asyncio.CancelledError:
            self.outcome = RequestOutcome.CLIENT_CANCELLED
            raise
        except Exception as exc:
            logger.exception("relay failed")
            self.outcome, self.error = RequestOutcome.UPSTREAM_ERROR, f"internal error: {type(exc).__name__}"
            await self.response.fail_internal()
        finally:
            self.response.release()
            self._finish()

    def _path(self) -> PassThrough | Guarded | NonStream:
        call = self.call
        if not call.request.stream:
            return NonStream(self.inputs)
        if call.forwards_raw:
            return PassThrough(self.inputs)
        self.response.hold(call.plan.policy.commit_deadline, call.plan.policy.keepalive_interval)
        return Guarded(self.inputs)

    async def _serve(self) -> None:
        call = self.call
        path = self._path()
        try:
            async with asyncio.timeout_at(self.deadlines.request):  # the loop's clock is time.monotonic()
                result = await self._attempts(path)
        except TimeoutError:
            result = await self._deadline_passed(path)
        if isinstance(result, Delivered):
            self.outcome, self.error, self.delivered = result.outcome, result.error, result.received
            return
        prompt_tokens, budget = _overflow_figures(result.decision, call)
        answer = answer_for(result.decision, committed=self.response.committed, stream=call.request.stream,
                            checked=not call.forwards_raw, policy=call.plan.policy, attempts=self.attempts_made,
                            request_id=str(self.response.request_id), prompt_tokens=prompt_tokens,
                            budget=budget, overflow_in_stream=call.emitter.overflow_in_stream)
        if self.budget_spent is not None:
            answer = dataclasses.replace(answer, reason=f"{answer.reason}; no retry was made: the tenant's retry "
                                                        f"budget is spent")
        self.outcome, self.error = answer.outcome, answer.audit_error
        if answer.outcome is RequestOutcome.EXHAUSTED and self.loops is not None:
            stuck = await self.loops.check_exhausted()
            if stuck is not None:
                self.delivered = await path.stuck(stuck)
                return
        self.delivered = await path.give_up(answer, attempts=self.attempts_made)

    async def _attempts(self, path: PassThrough | Guarded | NonStream) -> Attempted:
        """Attempt after attempt until one is delivered, the failure is not retryable, the policy's retries
        the tenant's retry budget or the retry deadline are spent; returns the last attempt's result."""
        result: Attempted | None = None
        failed: UpstreamTarget | None = None
        index = 0  # in the plan's targets (``RoutePlan.next_index``: the route's ``retry_target``)
        for attempt, _ in self.call.plan.attempts():
            target = self.router.pick(self.call.plan.targets[index])
            if isinstance(result, Failed) and failed is not None and not await self._retrying(attempt, target,
                                                                                               failed, result):
                break
            self.attempts_made = attempt + 1
            self._current = (target, time.monotonic())
            with self.trace.attempt(attempt, target) as traced:
                result = self._last = await path.attempt(attempt, target)
                traced.ended(result)
            self._current, failed = None, target
            await self._after(attempt, target, result)
            if isinstance(result, Delivered) or (result.ending is Ending.ERROR
                                                 and not self._other_key(target, result.decision)):
                break
            index = self.call.plan.next_index(index, broken=model_failure(result.decision))
        assert result is not None, "a plan has at least one attempt"
        return result

    async def _retrying(self, attempt: int, target: UpstreamTarget, failed: UpstreamTarget, last: Failed) -> bool:
        """Before retry ``attempt`` to ``target`` after ``last`` failed on ``failed``: True once the tenant's
        retry budget allowed it (for broken output) and the backoff waited; False: no retry."""
        decision = last.decision
        if model_failure(decision) and not await self._retry_budget_allows():
            return False
        # A refused key with another one to try: at once (the wait was for that key).
        moved = key_failure(decision) is not None and (
            target.key_id != failed.key_id or target.upstream_id != failed.upstream_id)
        if not await self._backoff(attempt - 1, None if moved else decision.error, self.deadlines.retries):
            return False
        cause = "broken_output" if model_failure(decision) else "upstream_error"
        metrics.observe_retry(self.labels, upstream=failed.name, cause=cause)
        self.trace.retry(attempt, upstream=failed.name, cause=cause, decision=decision)
        return True

    async def _after(self, attempt: int, target: UpstreamTarget, result: Attempted) -> None:
        """The routing bookkeeping of an attempt: a tool-declaring request's judged first attempt counts in the
        target's broken-turn rate; the router observes the result (awaited when a retry's choice needs it)."""
        delivered = isinstance(result, Delivered)
        if attempt == 0 and self.call.request.declares_tools and (delivered or model_failure(_judged(result))):
            schedule(self._counted(target, broken=not delivered))
        if delivered:  # the client has its answer: the bookkeeping must not outlive its connection
            self.session_moved = self.router.move_finding(target)  # on the request's row (the request page)
            schedule(self._observed(target, result))
        else:  # the next attempt's choice of key and upstream needs it
            await self._observed(target, result)

    async def _observed(self, target: UpstreamTarget, result: Attempted) -> None:
        """Tell the router how ``target`` did; an answer keeps it as the session's upstream and key, and a
        move of the session (from a failed upstream or key) is recorded on the trace and in the log (and, by
        ``_after``, as the request's ``session-moved`` finding).

        An answer's session is kept first: the task runs detached (``_attempts``), and its first step, before
        any await, writes this process's copy of the session, which the session's next turn reads."""
        decision = _judged(result)
        if isinstance(result, Failed):
            await self.router.observe(target, decision)
            return
        moved = await self.router.delivered(target, decision.turn)
        await self.router.observe(target, decision)
        if moved is not None:
            self.trace.event(semconv.EVENT_SESSION_MOVED, **{"toolrelay.session.from_upstream_id": moved[0],
                                                             "toolrelay.session.to_upstream_id": target.upstream_id})
            logger.info("session moved from upstream %s key %s to upstream %s key %s", moved[0], moved[1],
                        target.upstream_id, target.key_id)

    async def _counted(self, target: UpstreamTarget, *, broken: bool) -> None:
        """Count a tool-declaring request's judged first attempt in ``target``'s live broken-turn rate
        (``proxy.routing.quality``) and show the rate after it in ``toolrelay_routing_broken_rate``."""
        rate = await quality.count(self.router.state, target, broken=broken)
        metrics.observe_broken_rate(self.labels, upstream=target.name, model=spans.model_label(target, self.labels),
                                    rate=rate.observed(), turns=rate.total)

    def _other_key(self, target: UpstreamTarget, decision: Decision) -> bool:
        """True when a key refused (401/403: not retryable in itself) and its pool has another key to try."""
        return key_failure(decision) is not None and self.router.another_key(target)

    async def _retry_budget_allows(self) -> bool:
        """True when the tenant's retry budget allows one more attempt for broken output (and counts it)."""
        percent = self.call.principal.policy.retry_budget_percent
        check = await take_retry(self.call.principal.tenant_id, percent)
        if not check.allowed:
            self.budget_spent = check.finding(percent)
            metrics.RETRY_BUDGET_SPENT.inc()
            self.trace.event(semconv.EVENT_RETRY_BUDGET)
        return check.allowed

    async def _deadline_passed(self, path: PassThrough | Guarded | NonStream) -> Attempted:
        """The request deadline cut the attempt under way (recorded as a timeout), or the wait before a retry."""
        exc = DeadlineExceeded(self.call.plan.deadline)
        if self._current is not None:
            return await path.interrupted(*self._current, exc)
        if self._last is not None:
            return self._last
        return await path.interrupted(self.call.plan.target(0), self.response.started, exc)

    async def _backoff(self, attempt: int, error: UpstreamError | None, deadline: float) -> bool:
        """Wait before retry ``attempt`` + 1: Retry-After within a bound, jittered exponential for 429/5xx,
        nothing for broken model output (asking again at once is the point). False when the retry deadline
        (``deadline``, ``RETRY_DEADLINE_SECONDS`` after the request arrived) does not leave room for the retry."""
        delay = 0.0
        if error is not None and (error.status == 429 or error.status >= 500):
            cap = settings.RETRY_AFTER_MAX_SECONDS
            if error.retry_after is not None:
                delay = min(error.retry_after, cap)
            else:
                delay = min(cap, settings.RETRY_BACKOFF_BASE_SECONDS * 2**attempt) * (0.5 + random.random() / 2)  # noqa: S311
        if time.monotonic() + delay >= deadline:
            return False
        await asyncio.sleep(max(0.0, delay))
        return True

    def _finish(self) -> None:
        attempts = self.log.all
        if self.outcome is RequestOutcome.CLIENT_CANCELLED:
            metrics.CLIENT_CANCELLED.inc()
        response = self.response
        delivered = self.outcome not in (RequestOutcome.EXHAUSTED, RequestOutcome.CLIENT_CANCELLED,
                                         RequestOutcome.UPSTREAM_ERROR)
        good = attempts[-1] if attempts and delivered else None
        wasted = [a for a in attempts if a is not good]
        result = audit.RequestResult(
            outcome=self.outcome.value, status=response.status, attempts=len(attempts),
            ttft_ms=response.ttft * 1000 if response.ttft is not None else None,
            total_ms=(time.monotonic() - response.started) * 1000,
            prompt_tokens=sum(a.prompt_tokens for a in attempts),
            completion_tokens=sum(a.completion_tokens for a in attempts),
            wasted_completion_tokens=sum(a.completion_tokens for a in wasted),
            wasted_ms=sum(a.duration_ms or 0 for a in wasted), error=self.error, delivered=self.delivered,
            findings=tuple(f for f in (self.loops.finding() if self.loops is not None else None, self.budget_spent,
                                       self.session_moved) if f is not None),
            **money(attempts, good, self.labels, self.log.upstreams),
        )
        added = None
        if good is not None and good.duration_ms is not None and result.total_ms is not None:
            added = (result.total_ms - good.duration_ms) / 1000
        metrics.observe_request(self.labels, outcome=self.outcome.value, ttft=response.ttft, added_latency=added)
        self.trace.relayed(outcome=self.outcome.value, attempts=len(attempts), ttft=response.ttft,
                           delivered_usd=result.delivered_usd, wasted_usd=result.wasted_usd, unpriced=result.unpriced)
        audit.request_finished(request=self.log.record, result=result)
        metrics.IN_FLIGHT.dec()
