"""The relay: async orchestration of one client request against its upstream(s).

Protocol-agnostic: the consumer hands it the request in chat.completions form, an ``Emitter`` for the
client's protocol and a ``Responder`` (how bytes reach the client). Three paths
(ARCHITECTURE.md "The request, as data"):

- pass-through (streaming, no ``tools``): upstream bytes are forwarded as they arrive, unchanged;
  usage is read from a small tail buffer afterwards, never delaying a byte;
- guarded (streaming with ``tools``): frames go through the guard core (``AttemptGuard``); text is
  released live, tool calls are held until valid; broken attempts are aborted early and retried;
  the response is committed at the first thing the client must see or at the commit deadline;
- non-stream: nothing is committed until the answer is ready (validated and retried when guarded).

Audit rows are written off the byte path: a failed attempt is written before its retry starts,
the rest in a background task once the response has ended.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import random
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from channels.db import database_sync_to_async
from django.conf import settings

from audit import services as audit
from proxy import metrics
from proxy.guard.attempt import AttemptGuard, decide_completion
from proxy.guard.emit import Emitter
from proxy.guard.errors import http_error_decision
from proxy.guard.events import Abort, Done, TextDelta, ToolCallValid
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from proxy.guard.policy import Exhaustion, FragmentStorage, GuardPolicy
from proxy.guard.turn import Decision, Outcome, RequestSpec, Turn, UpstreamError
from proxy.upstream import (
    UpstreamClient,
    UpstreamMisconfigured,
    UpstreamTimeout,
    UpstreamUnavailable,
    redact,
    secrets_of,
)
from tenants.selectors import RoutePlan, TenantSnapshot, UpstreamTarget

logger = logging.getLogger(__name__)

#: Upstreams (by id) that answered 400 to ``stream_options``: they get requests without it.
_REJECTS_STREAM_OPTIONS: set[int] = set()
#: Background audit writes, kept referenced until done.
_BACKGROUND: set[asyncio.Task[Any]] = set()
#: Bytes of the pass-through stream's end kept to read the usage chunk from.
_TAIL_BYTES = 8192
#: Upstream statuses that mean toolrelay's own credential was refused (never the client's key).
_UPSTREAM_AUTH_STATUSES = frozenset({401, 403, 407})
#: Non-stream upstream bodies larger than this are refused as an upstream failure.
_NON_STREAM_CAP = 32 * 1024 * 1024

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class Responder(Protocol):
    """How the relay reaches the client (a Channels consumer, or a test double)."""

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Send the status line and headers."""
        ...

    async def send(self, body: bytes, *, more: bool = True) -> None:
        """Send body bytes; ``more=False`` ends the response."""
        ...


@dataclass(slots=True)
class RelayRequest:
    """One client request, translated to chat.completions.

    ``body`` is the chat.completions request (``model`` = the client's public model name);
    ``raw_body`` the client's exact bytes when the client spoke OpenAI Chat (sent unchanged when
    nothing needs rewriting); ``include_usage``: the client asked for usage in the stream.
    """

    snapshot: TenantSnapshot
    plan: RoutePlan
    body: dict[str, Any]
    emitter: Emitter
    protocol: str = "openai-chat"
    user_agent: str = ""
    raw_body: bytes | None = None
    id: uuid.UUID = field(default_factory=uuid.uuid4)

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    @property
    def guarded(self) -> bool:
        return bool(self.body.get("tools"))

    @property
    def include_usage(self) -> bool:
        options = self.body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    @property
    def forwards_raw(self) -> bool:
        """True when upstream bytes go back unchanged: an OpenAI Chat client without ``tools``.
        Other protocols always go through the guard, which translates frame by frame."""
        return self.protocol == "openai-chat" and not self.guarded

    @property
    def path(self) -> str:
        if not self.stream:
            return "non-stream"
        return "pass-through" if self.forwards_raw else "guarded"


def schedule(coro: Awaitable[Any]) -> None:
    """Run ``coro`` in the background, detached from the request task (not cancelled with it)."""
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def drain_background() -> None:
    """Wait for pending background audit writes (tests, shutdown)."""
    while _BACKGROUND:
        await asyncio.gather(*list(_BACKGROUND), return_exceptions=True)


async def _audit(fn: Callable[..., None], **kwargs: Any) -> None:
    try:
        await database_sync_to_async(fn)(**kwargs)
    except Exception:  # an audit failure must never fail the client's request
        logger.exception("audit write failed")


async def _audit_and_release(**kwargs: Any) -> None:
    try:
        await _audit(audit.request_finish, **kwargs)
    finally:
        metrics.IN_FLIGHT.dec()


def upstream_body(req: RelayRequest, target: UpstreamTarget, *, ask_usage: bool) -> bytes:
    """The body for ``target``: model mapped, output tokens capped, usage asked for when ``ask_usage``.

    Returns the client's exact bytes when nothing changes (pass-through must stay byte-identical
    upstream too).
    """
    body = req.body
    changes: dict[str, Any] = {}
    if body.get("model") != target.model:
        changes["model"] = target.model
    cap = req.plan.max_output_tokens
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if cap and isinstance(value, int) and value > cap:
            changes[key] = cap
    if ask_usage and target.upstream_id not in _REJECTS_STREAM_OPTIONS and not req.include_usage:
        options = body.get("stream_options")
        changes["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    elif "stream_options" in body and target.upstream_id in _REJECTS_STREAM_OPTIONS:
        changes["stream_options"] = None
    if not changes and req.raw_body is not None:
        return req.raw_body
    merged = {**body, **changes}
    return json.dumps({k: v for k, v in merged.items() if v is not None or k not in changes}).encode()


def _rejects_stream_options(status: int, body: bytes) -> bool:
    return status in (400, 422) and b"stream_options" in body


def _usage_tokens(usage: dict[str, Any] | None) -> tuple[int, int]:
    if not isinstance(usage, dict):
        return 0, 0
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else 0), (completion if isinstance(completion, int) else 0)


def usage_from_tail(tail: bytes) -> dict[str, Any] | None:
    """The last ``usage`` object found in the data lines of an SSE tail, else None."""
    for line in reversed(tail.split(b"\n")):
        if b'"usage"' not in line or not line.startswith(b"data:"):
            continue
        try:
            usage = json.loads(line[5:]).get("usage")
        except (ValueError, AttributeError):
            continue
        if isinstance(usage, dict):
            return usage
    return None


def exhaustion_message(req: RelayRequest, attempts: int, reason: str) -> str:
    """The text of the terminal assistant message sent when retries run out (agents do not retry it)."""
    tools = " No tool was run." if req.guarded else ""
    return (f"[toolrelay] The upstream model could not produce a valid answer: {attempts} attempt(s) failed "
            f"(last problem: {reason}).{tools} Please try again or rephrase. Request id: {req.id}.")


def _finding(kind: FindingKind, detail: str) -> Finding:
    return Finding(kind=kind, severity=Severity.ERROR, action=Action.RETRY, detail=detail)


def failure_decision(exc: Exception) -> Decision:
    """A retryable decision for a connection failure or a timeout."""
    if isinstance(exc, UpstreamMisconfigured):
        error = UpstreamError(status=502, message=str(exc), type="upstream_misconfigured", retryable=False)
        kind = FindingKind.UPSTREAM_CONNECTION_ERROR
        finding = Finding(kind=kind, severity=Severity.ERROR, action=Action.ERROR, detail=str(exc))
        return Decision(Outcome.UPSTREAM_ERROR, None, (finding,), reason=str(exc), error=error)
    if isinstance(exc, UpstreamTimeout):
        error = UpstreamError(status=504, message=str(exc), type="upstream_timeout")
        kind = FindingKind.UPSTREAM_TIMEOUT
    else:
        error = UpstreamError(status=502, message=str(exc), type="upstream_unavailable")
        kind = FindingKind.UPSTREAM_CONNECTION_ERROR
    return Decision(Outcome.UPSTREAM_ERROR, None, (_finding(kind, str(exc)),), reason=str(exc), error=error)


@dataclass(slots=True)
class _AttemptResult:
    decision: Decision
    record: audit.AttemptRecord
    held: list[TextDelta]


class Relay:
    """Drives one request to the end: ``await Relay(req, responder, client).run()``.

    Cancellation (the client left) propagates out of ``run()`` after the upstream response is
    closed by its context manager; the request is then recorded as client-cancelled.
    """

    def __init__(self, req: RelayRequest, responder: Responder, client: UpstreamClient) -> None:
        self.req = req
        self.responder = responder
        self.client = client
        self.policy: GuardPolicy = req.plan.policy
        self.emitter = req.emitter
        self.spec = RequestSpec.from_openai(req.body)
        self.record = audit.RequestRecord(
            id=req.id, tenant_id=req.snapshot.tenant_id, api_key_id=req.snapshot.api_key_id, model=req.body["model"],
            path=req.path, client_protocol=req.protocol, client_user_agent=req.user_agent,
            route_id=req.plan.route_id, upstream_id=req.plan.target(0).upstream_id,
            upstream_model=req.plan.target(0).model, fragments=self.policy.fragments,
        )
        self.started = time.monotonic()
        self.ttft: float | None = None
        self.status: int | None = None
        self.committed = False
        self.finished = False
        self.text_sent: dict[tuple[int, str], str] = {}
        self.pending: list[audit.AttemptRecord] = []
        self.written: list[audit.AttemptRecord] = []
        self.outcome = "upstream-error"
        self.error = ""
        self.final_usage: dict[str, Any] | None = None
        self._commit_lock = asyncio.Lock()
        self._last_send = time.monotonic()
        self._ticker: asyncio.Task[None] | None = None
        self._seq = 0

    # ----- sending -----

    def _headers(self, extra: list[tuple[bytes, bytes]] | None = None) -> list[tuple[bytes, bytes]]:
        return [*(extra or []), (b"x-request-id", str(self.req.id).encode())]

    async def _commit(self) -> None:
        """Send status and SSE headers (once), then the emitter's opening bytes."""
        async with self._commit_lock:  # uncontended: one acquire per response
            if self.committed:
                return
            await self.responder.start(200, self._headers(SSE_HEADERS))
            self.status = 200
            self.committed = True
            opening = self.emitter.open()
            if opening:
                await self.responder.send(opening)

    async def _send(self, data: bytes, *, more: bool = True) -> None:
        if not self.committed:
            await self._commit()
        if self.ttft is None and data:
            self.ttft = time.monotonic() - self.started
        self._last_send = time.monotonic()
        if not more:
            self._stop_ticker()
            self.finished = True
        await self.responder.send(data, more=more)

    async def _send_json(self, status: int, obj: dict[str, Any], *, should_retry: bool | None = None) -> None:
        headers = [(b"content-type", b"application/json")]
        if should_retry is not None:
            headers.append((b"x-should-retry", b"true" if should_retry else b"false"))
        self.status = status
        self.committed = True
        self.finished = True
        await self.responder.start(status, self._headers(headers))
        await self.responder.send(json.dumps(obj).encode(), more=False)

    async def send_error(self, status: int, message: str, *, type: str, code: str | None = None,
                         param: str | None = None, should_retry: bool | None = None) -> None:
        """An HTTP error in the client's protocol; the message always carries the request id.

        If the commit deadline committed the stream meanwhile, the error goes in-stream instead.
        """
        self.error = message
        text = f"{message} (request id: {self.req.id})"
        async with self._commit_lock:
            if not self.committed:
                body = self.emitter.error_body(status, text, type=type, param=param, code=code)
                await self._send_json(status, body, should_retry=should_retry)
                return
        await self._send(self.emitter.close_error(UpstreamError(status, text, type, code=code)), more=False)

    # ----- keep-alives and the commit deadline -----

    def _start_ticker(self) -> None:
        self._ticker = asyncio.ensure_future(self._tick())

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    async def _tick(self) -> None:
        """Commit with a keep-alive at the commit deadline, then keep the connection alive while holding."""
        await asyncio.sleep(self.policy.commit_deadline)
        if not self.committed:
            await self._commit()
            await self._keepalive()
        interval = self.policy.keepalive_interval
        while True:
            await asyncio.sleep(max(0.05, self._last_send + interval - time.monotonic()))
            if time.monotonic() - self._last_send >= interval:
                await self._keepalive()

    async def _keepalive(self) -> None:
        if not self.finished:
            self._last_send = time.monotonic()
            await self.responder.send(self.emitter.keepalive())

    # ----- entry point -----

    async def run(self) -> None:
        """Serve the request on its path; always leaves an audit record behind."""
        metrics.IN_FLIGHT.inc()
        try:
            if not self.req.stream:
                await self._non_stream()
            elif self.req.forwards_raw:
                await self._pass_through()
            else:
                await self._guarded()
        except asyncio.CancelledError:
            self.outcome = "client-cancelled"
            raise
        except Exception as exc:
            logger.exception("relay failed")
            self.outcome, self.error = "upstream-error", f"internal error: {type(exc).__name__}"
            await self._internal_error()
        finally:
            self._stop_ticker()
            self._finish()

    async def _internal_error(self) -> None:
        if not self.committed:
            await self.send_error(500, "toolrelay failed to serve this request", type="server_error",
                                  should_retry=False)
        elif not self.finished:
            await self._send(self.emitter.close_error(UpstreamError(500, "toolrelay internal error", "server_error")),
                             more=False)

    def _finish(self) -> None:
        attempts = self.written + self.pending
        if self.outcome == "client-cancelled":
            metrics.CLIENT_CANCELLED.inc()
        total_ms = (time.monotonic() - self.started) * 1000
        prompt = sum(a.prompt_tokens for a in attempts)
        completion = sum(a.completion_tokens for a in attempts)
        delivered = self.outcome not in ("exhausted", "client-cancelled", "upstream-error")
        good = attempts[-1] if attempts and delivered else None
        wasted = [a for a in attempts if a is not good]
        result = audit.RequestResult(
            outcome=self.outcome, status=self.status, attempts=len(attempts),
            ttft_ms=self.ttft * 1000 if self.ttft is not None else None, total_ms=total_ms,
            prompt_tokens=prompt, completion_tokens=completion,
            wasted_completion_tokens=sum(a.completion_tokens for a in wasted),
            wasted_ms=sum(a.duration_ms or 0 for a in wasted), error=self.error,
        )
        metrics.observe_request(self.req.snapshot.slug, self.req.path, self.outcome, self.ttft)
        schedule(_audit_and_release(request=self.record, result=result, attempts=list(self.pending),
                                    exists=bool(self.written)))

    async def _record_now(self, attempt: audit.AttemptRecord) -> None:
        """Write a failed attempt before the retry starts (so a crash loses nothing already decided)."""
        await _audit(audit.attempt_record, request=self.record, attempt=attempt)
        self.written.append(attempt)

    # ----- attempts -----

    def _attempt_record(self, target: UpstreamTarget, outcome: str, started: float,
                        **kwargs: Any) -> audit.AttemptRecord:
        """The audit record of one upstream call; records are numbered in call order."""
        metrics.ATTEMPTS.labels(outcome=outcome).inc()
        for finding in kwargs.get("findings", ()):
            metrics.FINDINGS.labels(kind=finding.kind.value).inc()
        if kwargs.get("body"):
            kwargs["body"] = redact(kwargs["body"].decode("utf-8", "replace"), self._secrets).encode()
        # Numbered in call order: a re-ask without stream_options reuses its attempt's target but is a
        # call of its own.
        self._seq += 1
        return audit.AttemptRecord(number=self._seq - 1, upstream_id=target.upstream_id, upstream_model=target.model,
                                   outcome=outcome, duration_ms=(time.monotonic() - started) * 1000, **kwargs)

    @functools.cached_property
    def _secrets(self) -> frozenset[str]:
        """Every credential and extra header value of the plan's upstreams."""
        return frozenset().union(*(secrets_of(t) for t in self.req.plan.targets))

    def _scrub(self, decision: Decision) -> Decision:
        """``decision`` with upstream credentials redacted from every text that reaches the client or
        the audit (some upstreams echo the key they were sent in their error messages)."""
        if not decision.findings and decision.error is None:
            return decision
        secrets = self._secrets
        findings = tuple(dataclasses.replace(f, detail=redact(f.detail, secrets), fragment=redact(f.fragment, secrets))
                         for f in decision.findings)
        error = decision.error
        if error is not None:
            error = dataclasses.replace(error, message=redact(error.message, secrets))
        return dataclasses.replace(decision, findings=findings, reason=redact(decision.reason, secrets), error=error)

    async def _backoff(self, attempt: int, error: UpstreamError | None) -> None:
        """Wait before retry ``attempt`` + 1: Retry-After within a bound, jittered exponential for 429/5xx,
        nothing for broken model output (asking again at once is the point)."""
        if error is None or not (error.status == 429 or error.status >= 500):
            return
        cap = settings.RETRY_AFTER_MAX_SECONDS
        if error.retry_after is not None:
            delay = min(error.retry_after, cap)
        else:
            delay = min(cap, settings.RETRY_BACKOFF_BASE_SECONDS * 2**attempt) * (0.5 + random.random() / 2)  # noqa: S311
        await asyncio.sleep(max(0.0, delay))

    def _can_retry(self, attempt: int, decision: Decision) -> bool:
        retryable = decision.outcome == Outcome.RETRY or (decision.error is not None and decision.error.retryable)
        return retryable and attempt < self.policy.max_retries

    # ----- pass-through -----

    async def _pass_through(self) -> None:
        attempt = 0
        while True:
            target = self.req.plan.target(attempt)
            started = time.monotonic()
            try:
                decision = await self._pass_through_attempt(target, started)
            except (UpstreamTimeout, UpstreamUnavailable) as exc:
                if self.committed:
                    await self._end_broken_pass_through(target, started, exc)
                    return
                decision = failure_decision(exc)
                self.pending.append(self._attempt_record(target, "upstream-error", started,
                                                         abort_reason=str(exc), findings=decision.findings))
            if decision is None:
                return
            if not self._can_retry(attempt, decision):
                await self._fail_before_commit(decision)
                return
            await self._backoff(attempt, decision.error)
            attempt += 1

    async def _pass_through_attempt(self, target: UpstreamTarget, started: float) -> Decision | None:
        """Forward one attempt; returns None when the response was delivered, else the failure decision."""
        body = upstream_body(self.req, target, ask_usage=False)
        async with self.client.open(target, body, stream=True) as response:
            if response.status != 200:
                return await self._http_failure(target, started, response)
            content_type = response.headers.get("content-type", "text/event-stream").encode()
            await self.responder.start(200, self._headers([(b"content-type", content_type),
                                                           (b"cache-control", b"no-cache"),
                                                           (b"x-accel-buffering", b"no")]))
            self.committed, self.status = True, 200
            # The last chunks covering _TAIL_BYTES, joined once at the end (not an 8 KB copy per chunk).
            recent: deque[bytes] = deque()
            kept, size, send = 0, 0, self.responder.send
            async for chunk in response.chunks():
                await send(chunk)
                if self.ttft is None:
                    self.ttft = time.monotonic() - self.started
                size += len(chunk)
                recent.append(chunk)
                kept += len(chunk)
                while kept - len(recent[0]) >= _TAIL_BYTES:
                    kept -= len(recent.popleft())
            await self._send(b"", more=False)
        prompt, completion = _usage_tokens(usage_from_tail(b"".join(recent)[-_TAIL_BYTES:]))
        self.outcome = "clean"
        self.pending.append(self._attempt_record(target, "clean", started, upstream_status=200,
                                                 bytes_received=size, prompt_tokens=prompt,
                                                 completion_tokens=completion))
        return None

    async def _end_broken_pass_through(self, target: UpstreamTarget, started: float,
                                       exc: Exception) -> None:
        """The upstream failed after bytes were forwarded: nothing can be retried, so end the stream with
        the protocol's in-stream error (PROTOCOLS.md 1.6), never a silently truncated success. The
        leading blank lines end any event the upstream left half-sent."""
        self.outcome, self.error = "upstream-error", str(exc)
        decision = failure_decision(exc)
        self.pending.append(self._attempt_record(target, "upstream-error", started, upstream_status=200,
                                                 abort_reason=str(exc), findings=decision.findings))
        if not self.finished and decision.error is not None:
            message = f"the upstream stream broke off: {exc} (request id: {self.req.id})"
            error = dataclasses.replace(decision.error, message=message)
            await self._send(b"\n\n" + self.emitter.close_error(error), more=False)

    async def _http_failure(self, target: UpstreamTarget, started: float, response: Any) -> Decision:
        body = await response.read_capped()
        decision = self._scrub(http_error_decision(response.status, body, response.headers))
        self.pending.append(self._attempt_record(target, "upstream-error", started,
                                                 upstream_status=response.status, findings=decision.findings,
                                                 abort_reason=decision.reason, body=body))
        if _rejects_stream_options(response.status, body) and target.upstream_id not in _REJECTS_STREAM_OPTIONS:
            # The upstream refuses stream_options: remember it and ask again without (not counted as a retry).
            _REJECTS_STREAM_OPTIONS.add(target.upstream_id)
            return Decision(Outcome.RETRY, None, decision.findings, reason="stream_options rejected")
        return decision

    async def _fail_before_commit(self, decision: Decision) -> None:
        """Nothing was sent: an HTTP error with ``x-should-retry: false`` (we already retried)."""
        error = decision.error
        if error is not None and error.status in _UPSTREAM_AUTH_STATUSES:
            # Not the client's key: the upstream refused toolrelay's credential. A 401 here would send
            # the user after the wrong key (and make some clients retry).
            self.outcome = "upstream-error"
            await self.send_error(502, f"the upstream refused toolrelay's credential (HTTP {error.status}): "
                                  f"{error.message}; an operator must fix the upstream's credential",
                                  type="upstream_error", code="upstream_auth_failed", should_retry=False)
            return
        if error is not None and not error.retryable:
            self.outcome = "upstream-error"
            await self.send_error(error.status, f"upstream error: {error.message}", type=error.type, code=error.code,
                                  should_retry=False)
            return
        self.outcome = "exhausted" if decision.outcome == Outcome.RETRY else "upstream-error"
        status = error.status if error is not None and error.status in (429, 504) else 502
        reason = error.message if error is not None else decision.reason
        await self.send_error(status, f"the upstream failed {len(self.written) + len(self.pending)} time(s): {reason}",
                              type="upstream_error", code="upstream_failed", should_retry=False)

    # ----- guarded streaming -----

    async def _guarded(self) -> None:
        self._start_ticker()
        attempt = 0
        last: Decision | None = None
        while True:
            result = await self._guarded_attempt(attempt)
            last = result.decision
            if last.usable and last.turn is not None:
                self.pending.append(result.record)
                await self._deliver(last, result.held, attempt)
                return
            if last.error is not None and not last.error.retryable or not self._can_retry(attempt, last):
                self.pending.append(result.record)
                break
            await self._record_now(result.record)
            await self._backoff(attempt, last.error)
            if not last.reason == "stream_options rejected":
                attempt += 1
        await self._give_up(last, attempt + 1)

    async def _guarded_attempt(self, number: int) -> _AttemptResult:
        target = self.req.plan.target(number)
        started = time.monotonic()
        try:
            return await self._read_guarded(target, started)
        except (UpstreamTimeout, UpstreamUnavailable) as exc:
            decision = failure_decision(exc)
            record = self._attempt_record(target, "upstream-error", started, abort_reason=str(exc),
                                          findings=decision.findings)
            return _AttemptResult(decision, record, [])

    async def _read_guarded(self, target: UpstreamTarget, started: float) -> _AttemptResult:
        asked = self.req.include_usage or target.upstream_id not in _REJECTS_STREAM_OPTIONS
        guard = AttemptGuard(dataclasses.replace(self.spec, usage_requested=asked), self.policy)
        live = self.policy.stream_text and not self.text_sent
        held: list[TextDelta] = []
        keep_body = self.policy.fragments == FragmentStorage.ATTEMPT
        body_parts: list[bytes] = []
        size = 0
        abort: Abort | None = None
        ttfb: float | None = None
        async with self.client.open(target, upstream_body(self.req, target, ask_usage=True), stream=True) as response:
            if response.status != 200:
                decision = await self._http_failure(target, started, response)
                return _AttemptResult(decision, self.pending.pop(), [])
            async for chunk in response.chunks():
                if ttfb is None:
                    ttfb = (time.monotonic() - started) * 1000
                    metrics.UPSTREAM_TTFB.observe(ttfb / 1000)
                size += len(chunk)
                if keep_body and size <= settings.AUDIT_BODY_CAP:
                    body_parts.append(chunk)
                abort = await self._handle(guard.feed(chunk), live, held)
                if abort is not None and self.policy.early_abort:
                    break
        final = guard.finish()
        await self._handle([e for e in final if not isinstance(e, Done)], live, held)
        done = next((e for e in final if isinstance(e, Done)), None)
        decision = Decision(Outcome.RETRY, None, reason="no decision") if done is None else self._scrub(done.decision)
        turn = decision.turn
        prompt, completion = _usage_tokens(turn.usage if turn is not None else None)
        record = self._attempt_record(target, decision.outcome.value, started, upstream_status=200, ttfb_ms=ttfb,
            abort_reason=abort.finding.detail if abort is not None else ("" if decision.usable else decision.reason),
            findings=decision.findings, prompt_tokens=prompt, completion_tokens=completion, bytes_received=size,
            body=b"".join(body_parts), tool_names=guard.tool_names(),
        )
        return _AttemptResult(decision, record, held)

    async def _handle(self, events: list[Any], live: bool, held: list[TextDelta]) -> Abort | None:
        """Act on guard events: release or hold text, commit on a valid tool call; return an Abort if any."""
        abort = None
        for event in events:
            if isinstance(event, TextDelta):
                if live:
                    await self._send_text(event)
                else:
                    held.append(event)
            elif isinstance(event, ToolCallValid):
                await self._commit()
            elif isinstance(event, Abort):
                abort = abort or event
        return abort

    async def _send_text(self, delta: TextDelta) -> None:
        key = (delta.choice, delta.channel)
        self.text_sent[key] = self.text_sent.get(key, "") + delta.text
        await self._send(self.emitter.text(delta.choice, delta.channel, delta.text))

    async def _deliver(self, decision: Decision, held: list[TextDelta], attempt: int) -> None:
        """Emit a usable turn: held text, then tool calls, finish, usage and the terminator.

        After a retry that follows streamed text (issue rule): a turn with tool calls sends only its
        tool calls; a text-only turn sends its text minus the prefix the client already has.
        """
        turn = decision.turn
        assert turn is not None
        if attempt > 0 and self.text_sent:
            await self._send_after_retry(turn, held)
        else:
            for delta in held:
                await self._send_text(delta)
        await self._send(self.emitter.close(turn), more=False)
        self.outcome = _request_outcome(decision, attempt)

    async def _send_after_retry(self, turn: Turn, held: list[TextDelta]) -> None:
        with_calls = {c.index for c in turn.choices if c.tool_calls}
        texts: dict[tuple[int, str], str] = {}
        for delta in held:
            if delta.choice not in with_calls:
                key = (delta.choice, delta.channel)
                texts[key] = texts.get(key, "") + delta.text
        for (choice, channel), text in texts.items():
            sent = self.text_sent.get((choice, channel), "")
            remainder = text[len(os.path.commonprefix([sent, text])):]
            if remainder:
                await self._send_text(TextDelta(choice, channel, remainder))  # type: ignore[arg-type]

    async def _give_up(self, decision: Decision, attempts: int) -> None:
        """Retries ran out (or the error is not retryable): a clean error, never a partial tool call.

        Broken model output (the upstream answered, but no usable turn) gets the policy's exhaustion
        answer even before the commit, as the fault corpus expects: a terminal assistant message
        lets the agent loop go on instead of failing or retrying blindly. Transport and HTTP status
        failures before the commit are HTTP errors with ``x-should-retry: false``.
        """
        error = decision.error
        retryable = error is None or error.retryable
        if not self.committed and not (retryable and model_failure(decision)
                                       and self.policy.exhaustion == Exhaustion.MESSAGE):
            await self._fail_before_commit(decision)
            return
        if error is not None and not error.retryable:
            self.outcome, self.error = "upstream-error", error.message
            await self._send(self.emitter.close_error(error), more=False)
            return
        self.outcome = "exhausted"
        reason = error.message if error is not None else decision.reason
        self.error = reason
        if self.policy.exhaustion == Exhaustion.ERROR:
            message = f"the upstream failed {attempts} time(s): {reason} (request id: {self.req.id})"
            failure = UpstreamError(502, message, "upstream_error", code="upstream_failed")
            await self._send(self.emitter.close_error(failure), more=False)
        else:
            # Set apart from text the client already has from an earlier attempt.
            separator = "\n\n" if any(self.text_sent.values()) else ""
            message = separator + exhaustion_message(self.req, attempts, reason)
            await self._send(self.emitter.close_exhausted(message), more=False)

    # ----- non-stream -----

    async def _non_stream(self) -> None:
        attempt = 0
        while True:
            target = self.req.plan.target(attempt)
            started = time.monotonic()
            try:
                decision = await self._non_stream_attempt(target, started)
            except (UpstreamTimeout, UpstreamUnavailable) as exc:
                decision = failure_decision(exc)
                self.pending.append(self._attempt_record(target, "upstream-error", started,
                                                         abort_reason=str(exc), findings=decision.findings))
            if decision is None:
                return
            if decision.usable and decision.turn is not None:
                self.outcome = _request_outcome(decision, attempt)
                await self._send_json(200, self.emitter.complete(decision.turn))
                return
            if not self._can_retry(attempt, decision):
                await self._non_stream_give_up(decision, attempt + 1)
                return
            if not self.req.forwards_raw:
                await self._record_now(self.pending.pop())
            await self._backoff(attempt, decision.error)
            if decision.reason != "stream_options rejected":
                attempt += 1

    async def _non_stream_give_up(self, decision: Decision, attempts: int) -> None:
        error = decision.error
        if (self.req.forwards_raw or self.policy.exhaustion != Exhaustion.MESSAGE or not model_failure(decision)
                or (error is not None and not error.retryable)):
            await self._fail_before_commit(decision)
            return
        self.outcome = "exhausted"
        self.error = error.message if error is not None else decision.reason
        await self._send_json(200, self.emitter.complete_exhausted(exhaustion_message(self.req, attempts, self.error)))

    async def _non_stream_attempt(self, target: UpstreamTarget,
                                  started: float) -> Decision | None:
        async with self.client.open(target, upstream_body(self.req, target, ask_usage=False), stream=False) as response:
            if response.status != 200:
                return await self._http_failure(target, started, response)
            body = await response.read_capped(_NON_STREAM_CAP)
            content_type = response.headers.get("content-type", "application/json")
        if self.req.forwards_raw:
            await self._forward_plain(target, started, body, content_type)
            return None
        decision = self._scrub(decide_completion(body, self.spec, self.policy))
        prompt, completion = _usage_tokens(decision.turn.usage if decision.turn else None)
        self.pending.append(self._attempt_record(target, decision.outcome.value, started,
                                                 upstream_status=200, findings=decision.findings,
                                                 abort_reason="" if decision.usable else decision.reason,
                                                 prompt_tokens=prompt, completion_tokens=completion,
                                                 bytes_received=len(body), body=body))
        return decision

    async def _forward_plain(self, target: UpstreamTarget, started: float, body: bytes,
                             content_type: str) -> None:
        """A tool-less non-stream answer goes back unchanged, with the upstream's content type."""
        try:
            usage = json.loads(body).get("usage")
        except (ValueError, AttributeError):
            usage = None
        prompt, completion = _usage_tokens(usage)
        self.pending.append(self._attempt_record(target, "clean", started, upstream_status=200,
                                                 prompt_tokens=prompt, completion_tokens=completion,
                                                 bytes_received=len(body)))
        self.outcome, self.status, self.committed, self.finished = "clean", 200, True, True
        await self.responder.start(200, self._headers([(b"content-type", content_type.encode("latin-1"))]))
        await self.responder.send(body, more=False)


#: Findings that mean the model's output failed, not the transport (C41, C47).
_MODEL_FAILURE_KINDS = frozenset({FindingKind.MID_STREAM_ERROR_CHUNK, FindingKind.PRE_STREAM_TOOL_USE_FAILED})


def model_failure(decision: Decision) -> bool:
    """True when ``decision`` is about broken model output rather than an unreachable or failing upstream."""
    return decision.outcome == Outcome.RETRY or any(f.kind in _MODEL_FAILURE_KINDS for f in decision.findings)


def _request_outcome(decision: Decision, attempt: int) -> str:
    if attempt > 0:
        return "recovered-by-retry"
    return decision.outcome.value
