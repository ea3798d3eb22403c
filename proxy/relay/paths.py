"""The three request paths, as small strategies the relay's one attempt loop drives.

Each path's ``attempt(number, target)`` makes one upstream call and either delivers the answer to
the client (``Attempted.delivered``) or returns the decision that says why not; the relay decides
whether to retry and, when the attempts run out, hands ``proxy.guard.decisions.answer.answer_for``'s verdict
to ``give_up``.

- ``PassThrough`` (OpenAI Chat, streaming, no ``tools``): upstream bytes forwarded as they arrive,
  unchanged; usage read from a small tail buffer afterwards, never delaying a byte.
- ``Guarded`` (streaming, ``tools`` or a translated protocol): frames through ``AttemptGuard``; text
  released per ``Delivery``; tool calls held until valid; a provably broken attempt aborted early;
  the response committed at the first thing the client must see or at the commit deadline.
- On a route with ``continue_text``, a text stream the upstream cuts after text reached the client is
  continued from exactly that text where the upstream takes a prefix (``proxy.relay.continued``).
- ``NonStream``: nothing is sent until the answer is ready (checked unless it is a tool-less OpenAI
  Chat answer, which goes back unchanged with the upstream's content type).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from audit.delivered import delivered_error, delivered_exhaustion, delivered_turn
from infra.scrub import redact
from proxy.guard.checks.passcheck import PassCheck
from proxy.guard.checks.request import ChatRequest
from proxy.guard.decisions.answer import Answer, AnswerKind, RequestOutcome, exhaustion_message
from proxy.guard.decisions.attempt import AttemptGuard, completion_guard
from proxy.guard.decisions.delivery import Delivery
from proxy.guard.decisions.loops import Stuck, stuck_message
from proxy.guard.events import Abort, Done, TextDelta, ToolCallValid
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from proxy.guard.policy import Exhaustion, FragmentStorage
from proxy.guard.stream.errors import classify_inband_error
from proxy.guard.turn import Decision, Outcome, Turn, UpstreamError
from proxy.relay import schema_pool
from proxy.relay.continued import GuardedSeam, PassSeam
from proxy.telemetry import semconv
from proxy.upstreams.client import UpstreamResponse, UpstreamTimeout, UpstreamUnavailable
from tenants.principal import UpstreamTarget

if TYPE_CHECKING:
    from proxy.relay.loop import Relay

#: Non-stream upstream bodies larger than this are refused as an upstream failure.
NON_STREAM_CAP = 32 * 1024 * 1024  # bytes
_NO_DECISION = Decision(Outcome.RETRY, None, reason="no decision")


@dataclass(frozen=True, slots=True)
class Attempted:
    """One attempt's result: ``delivered`` with the request ``outcome`` (and ``error``, the audit's text
    for a stream that broke off after the commit), or the ``decision`` against it."""

    decision: Decision
    delivered: bool = False
    outcome: RequestOutcome = RequestOutcome.UPSTREAM_ERROR
    error: str = ""


class _Path(abc.ABC):
    """What every path shares: the relay's request, response, client and audit log."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.call = relay.call
        self.request = relay.call.request
        self.response = relay.response
        self.log = relay.log
        self.client = relay.client

    def open(self, target: UpstreamTarget, *, ask_usage: bool = False, request: ChatRequest | None = None) -> Any:
        """The upstream call for ``target`` (an async context manager yielding ``UpstreamResponse``), its
        deadlines shortened to what the request deadline and the retry budget leave; ``request``: another
        body than the client's (a continuation's)."""
        first_byte, idle = self.relay.timeouts(target)
        return self.client.open(target, request or self.request, ask_usage=ask_usage, first_byte=first_byte,
                                idle=idle, max_output_tokens=self.call.plan.max_output_tokens)

    async def interrupted(self, target: UpstreamTarget, started: float, exc: Exception) -> Attempted:
        """The attempt under way was cut by the request deadline (``exc``): record it like a timeout."""
        return await self._broke(target, started, exc)

    async def attempt(self, number: int, target: UpstreamTarget) -> Attempted:
        """One upstream call; transport failures become their decision."""
        started = time.monotonic()
        try:
            return await self._call(number, target, started)
        except (UpstreamTimeout, UpstreamUnavailable) as exc:
            return await self._broke(target, started, exc)

    @abc.abstractmethod
    async def _call(self, number: int, target: UpstreamTarget, started: float) -> Attempted:
        """The path's upstream call ``number`` (0-based) to ``target``, started at ``started`` (monotonic)."""

    async def _broke(self, target: UpstreamTarget, started: float, exc: Exception) -> Attempted:
        return Attempted(self.log.transport_failure(target, started, exc))

    def _scrub(self, text: str) -> str:
        return redact(text, self.log.secrets)

    def separator(self) -> str:
        """What sets the exhaustion answer apart from text the client already has."""
        return ""

    async def _text(self, delta: TextDelta) -> None:
        text = redact(delta.text, self.log.secrets)  # an upstream echoing toolrelay's credential
        await self.response.stream(self.call.emitter.text(delta.choice, delta.channel, text))

    async def _release(self, delta: TextDelta) -> None:
        """Text of a turn that did not stream (the guarded path applies its delivery rule here)."""
        await self._text(delta)

    async def _close(self, decision: Decision, number: int) -> Attempted:
        """End the stream with ``decision``'s turn (tool calls, finish, usage, terminator)."""
        assert decision.turn is not None
        turn = redact_turn(decision.turn, self.log.secrets)
        self.deliver(turn)
        await self.response.end(self.call.emitter.close(turn))
        return Attempted(decision, delivered=True, outcome=RequestOutcome.delivered(decision, number))

    def deliver(self, turn: Turn) -> None:
        """Note for the audit the turn the client is sent (texts kept unless the policy keeps no content)."""
        self.relay.delivered = delivered_turn(turn, content=self.call.plan.policy.fragments != FragmentStorage.NONE)

    async def _not_sse(self, number: int, target: UpstreamTarget, started: float,
                       upstream: UpstreamResponse) -> Attempted:
        """A 200 that is no event stream, to a streaming request: an error body in place of the stream is that
        error (retried when it is retryable); a whole ``chat.completion`` is the turn, sent as a canonical
        stream; anything else is retried. Never an empty "successful" stream."""
        body = await upstream.read_capped(NON_STREAM_CAP)
        error = _error_body(body)
        if error is not None:
            action = Action.RETRY if error.retryable else Action.ERROR
            finding = Finding(FindingKind.UPSTREAM_NOT_SSE, Severity.ERROR, action,
                              f"an error body in place of the stream: {error.message[:300]}")
            decision = self.log.scrub(Decision(Outcome.UPSTREAM_ERROR, None, (finding,), finding.detail, error))
            self.log.add(target, "upstream-error", started, upstream_status=200, findings=decision.findings,
                         abort_reason=decision.reason, bytes_received=len(body), body=body)
            return Attempted(decision)
        note = Finding(FindingKind.UPSTREAM_NOT_SSE, Severity.INFO, Action.NORMALIZED,
                       "a whole chat.completion instead of an event stream; sent as a stream")
        decision = self.log.scrub(await schema_pool.decision(completion_guard(body, self.request.spec,
                                                                              self.call.plan.policy)))
        outcome = Outcome.NORMALIZED if decision.outcome is Outcome.CLEAN else decision.outcome
        decision = dataclasses.replace(decision, outcome=outcome, findings=(note, *decision.findings))
        self.log.add(target, decision.outcome.value, started, upstream_status=200, findings=decision.findings,
                     abort_reason="" if decision.usable else decision.reason,
                     usage=decision.turn.usage if decision.turn else None, bytes_received=len(body), frames=1,
                     body=body)
        if not decision.usable or decision.turn is None:
            return Attempted(decision)
        for choice in decision.turn.choices:
            for channel, text in (("reasoning", choice.reasoning), ("content", choice.content),
                                  ("refusal", choice.refusal)):
                if text:
                    await self._release(TextDelta(choice.index, channel, text))  # type: ignore[arg-type]
        return await self._close(decision, number)

    async def looping(self, decision: Decision, number: int) -> Attempted | None:
        """When the loop breaker finds that ``decision``'s usable turn completes an agent loop: the stuck
        answer sent in its place and the attempt's result; else None (deliver the turn)."""
        loops = self.relay.loops
        if loops is None or decision.turn is None:
            return None
        stuck = await loops.check_turn(decision.turn)
        if stuck is None:
            return None
        await self.stuck(stuck)
        return Attempted(decision, delivered=True, outcome=RequestOutcome.delivered(decision, number))

    async def stuck(self, stuck: Stuck) -> None:
        """The loop breaker's answer: a terminal assistant message saying the agent seems stuck and why
        (finish ``stop`` / ``end_turn``, ``response.completed``), in place of the turn or the exhaustion answer."""
        message = stuck_message(stuck, request_id=str(self.response.request_id))
        self.relay.trace.event(semconv.EVENT_LOOP_BROKEN, **{semconv.LOOP_RULE: stuck.rule})
        if self.call.plan.policy.exhaustion is Exhaustion.FAIL:
            await self._fail(message, status=400, code="agent_loop_detected")
            return
        self.relay.delivered = delivered_exhaustion(message, scrub=self._scrub)
        if self.request.stream:
            await self.response.end(self.call.emitter.close_exhausted(self.separator() + message))
        else:
            await self.response.send_json(200, self.call.emitter.complete_exhausted(message))

    async def _fail(self, message: str, *, status: int, code: str) -> None:
        """End the turn with ``message`` as the protocol's terminal error (the ``fail`` exhaustion
        policy): in-stream when streaming, else an HTTP ``status`` error with ``x-should-retry: false``."""
        self.relay.delivered = delivered_exhaustion(message, as_error=True, scrub=self._scrub)
        if self.request.stream:
            await self.response.end(self.call.emitter.close_terminal(message))
        else:
            said = message.removesuffix(f" Request id: {self.response.request_id}.")  # error() adds the id
            await self.response.error(status, said, type="invalid_request_error", code=code, should_retry=False)

    async def give_up(self, answer: Answer) -> None:
        """Render ``answer`` (``answer_for``) in the client's protocol."""
        response, emitter = self.response, self.call.emitter
        error = answer.error
        scrub = self._scrub
        if answer.kind is AnswerKind.HTTP_ERROR and error is not None:
            self.relay.delivered = delivered_error(error.status, error.message, scrub=scrub)
            await response.error(error.status, error.message, type=error.type, code=error.code,
                                 should_retry=answer.retryable, retry_after=error.retry_after)
        elif answer.kind is AnswerKind.STREAM_ERROR and error is not None:
            self.relay.delivered = delivered_exhaustion(error.message, as_error=True, scrub=scrub) \
                if answer.outcome is RequestOutcome.EXHAUSTED else delivered_error(error.status, error.message,
                                                                                   scrub=scrub)
            await response.end(emitter.close_error(error))
        elif answer.kind is AnswerKind.TERMINAL:
            await self._fail(exhaustion_message(attempts=self.relay.attempts_made, reason=answer.reason,
                                                guarded=self.request.guarded, request_id=str(response.request_id)),
                             status=502, code="upstream_failed")
        else:
            message = exhaustion_message(attempts=self.relay.attempts_made, reason=answer.reason,
                                         guarded=self.request.guarded, request_id=str(response.request_id))
            self.relay.delivered = delivered_exhaustion(message, scrub=scrub)
            if self.request.stream:
                await response.end(emitter.close_exhausted(self.separator() + message))
            else:
                await response.send_json(200, emitter.complete_exhausted(message))


class PassThrough(_Path):
    """OpenAI Chat streaming without tools: the upstream's bytes, unchanged, checked on the side.

    On a route with ``continue_text`` on, ``seam`` reads what the client was sent, and a stream the upstream
    cuts after text is continued in the same client stream where the upstream takes a prefix
    (``proxy.relay.continued``); otherwise a cut ends with the protocol's in-stream error."""

    def __init__(self, relay: Relay) -> None:
        super().__init__(relay)
        self.seam = PassSeam(self) if relay.call.plan.continue_text else None

    async def interrupted(self, target: UpstreamTarget, started: float, exc: Exception) -> Attempted:
        self.seam = None  # the request deadline passed: no time for a continuation
        return await super().interrupted(target, started, exc)

    async def _call(self, number: int, target: UpstreamTarget, started: float) -> Attempted:
        async with self.open(target) as upstream:
            self.log.refusals(target, upstream)
            if upstream.status != 200:
                return Attempted(await self.log.http_failure(target, started, upstream))
            if not is_event_stream(upstream):
                return await self._not_sse(number, target, started, upstream)
            content_type = upstream.headers.get("content-type", "text/event-stream").encode()
            await self.response.start(200, [(b"content-type", content_type), (b"cache-control", b"no-cache"),
                                            (b"x-accel-buffering", b"no")])
            check = PassCheck(max_line=settings.MAX_SSE_LINE_BYTES, secrets=self.log.secrets)
            size = await self._forward(upstream, check)
        return await self._ended(number, target, started, size, check)

    async def _forward(self, upstream: UpstreamResponse, check: PassCheck) -> int:
        """Forward every chunk as it arrives (cut at its last line end); return the bytes received."""
        size, send, ready, feed = 0, self.response.send, self.response.ready, check.feed
        seen = self.seam.transcript.feed if self.seam is not None else None
        async for chunk in upstream.chunks():
            size += len(chunk)
            data = feed(chunk)
            if data:
                if seen is not None:
                    seen(data)
                await send(data)
            await ready()  # a slow reader pauses the upstream read here
        return size

    async def _ended(self, number: int, target: UpstreamTarget, started: float, size: int,
                     check: PassCheck) -> Attempted:
        """The upstream body ended: record what the side checks saw; a stream that ended with neither a
        finish reason nor ``[DONE]`` gets the protocol's error at its end, never a silent success."""
        findings = check.finish()
        fatal = any(f.fatal for f in findings)
        outcome = "upstream-error" if fatal else ("normalized" if findings else "clean")
        reason = next((f.detail for f in findings if f.fatal), "")
        self.log.add(target, outcome, started, upstream_status=200, bytes_received=size, frames=check.frames,
                     usage=check.usage, findings=findings, abort_reason=reason)
        if check.broken_off and self.seam is not None and self.seam.possible(target):
            request_outcome, error_text = await self.seam.run(target, reason or "the stream ended without a finish "
                                                                                  "reason")
            return Attempted(_NO_DECISION, delivered=True, outcome=request_outcome, error=error_text)
        if check.broken_off:
            await self.end_with_error(UpstreamError(
                502, f"the upstream stream ended without a finish reason (request id: {self.response.request_id})",
                "upstream_error", code="upstream_truncated"))
        else:
            await self.response.end()
        if fatal:
            request_outcome = RequestOutcome.UPSTREAM_ERROR
        else:
            request_outcome = RequestOutcome.RECOVERED if number > 0 else RequestOutcome(outcome)
        return Attempted(_NO_DECISION, delivered=True, outcome=request_outcome, error=reason)

    async def _broke(self, target: UpstreamTarget, started: float, exc: Exception) -> Attempted:
        """The upstream failed after bytes were forwarded: nothing can be retried, so end the stream with
        the protocol's in-stream error (PROTOCOLS.md 1.6), never a silently truncated success. A half line
        was never forwarded (``PassCheck``); the leading blank lines end an event whose complete data lines
        the client has, so the error event stands alone."""
        if not self.response.committed:
            return await super()._broke(target, started, exc)
        decision = self.log.transport_failure(target, started, exc, upstream_status=200)
        if self.seam is not None and not self.response.ended and self.seam.possible(target):
            outcome, error_text = await self.seam.run(target, decision.reason)
            return Attempted(decision, delivered=True, outcome=outcome, error=error_text)
        if decision.error is not None:
            message = f"the upstream stream broke off: {decision.reason} (request id: {self.response.request_id})"
            await self.end_with_error(dataclasses.replace(decision.error, message=message))
        return Attempted(decision, delivered=True, outcome=RequestOutcome.UPSTREAM_ERROR, error=decision.reason)

    async def end_with_error(self, error: UpstreamError) -> None:
        """End the client's stream with the protocol's in-stream ``error`` (nothing when it already ended); the
        leading blank lines end an event whose complete data lines the client has, so the error stands alone."""
        if not self.response.ended:
            await self.response.end(b"\n\n" + self.call.emitter.close_error(error))


class Guarded(_Path):
    """Streaming through the guard: live text, held tool calls, early abort, one canonical stream."""

    def __init__(self, relay: Relay) -> None:
        super().__init__(relay)
        self.policy = relay.call.plan.policy
        self.delivery = Delivery(stream_text=self.policy.stream_text)
        self.seam = GuardedSeam(self)  # a cut text stream continued (``proxy.relay.continued``)
        self._guard: AttemptGuard | None = None  # the attempt under way's
        self._transport = False  # the attempt under way ended in a transport failure

    def separator(self) -> str:
        return self.delivery.exhaustion_separator()

    async def attempt(self, number: int, target: UpstreamTarget) -> Attempted:
        self.delivery.begin(continuing=self.seam.start(target))
        self._guard, self._transport = None, False
        result = await super().attempt(number, target)
        if not result.delivered:
            self.seam.ended(result.decision, target, cut=self._transport or self._unfinished(),
                            calls=self._calls_begun())
        return result

    def _unfinished(self) -> bool:
        """True when the attempt's stream ended with neither a finish reason nor ``[DONE]``."""
        return self._guard is not None and self._guard.unfinished

    def _calls_begun(self) -> bool:
        """True when the attempt's guard saw a tool call begin (a prefix of text cannot continue one)."""
        return self._guard is not None and self._guard.calls_started

    async def _broke(self, target: UpstreamTarget, started: float, exc: Exception) -> Attempted:
        self._transport = True
        return await super()._broke(target, started, exc)

    async def _call(self, number: int, target: UpstreamTarget, started: float) -> Attempted:
        keep_body = self.policy.fragments == FragmentStorage.ATTEMPT
        parts: list[bytes] = []
        size, ttfb, abort = 0, None, None
        async with self.open(target, ask_usage=True, request=self.seam.request(target)) as upstream:
            self.log.refusals(target, upstream)
            if upstream.status != 200:
                return Attempted(await self.log.http_failure(target, started, upstream))
            if not is_event_stream(upstream):
                return await self._not_sse(number, target, started, upstream)
            spec = dataclasses.replace(self.request.spec, usage_requested=upstream.asked_usage)
            guard = self._guard = AttemptGuard(spec, self.policy, max_line=settings.MAX_SSE_LINE_BYTES,
                                               max_bytes=settings.MAX_ATTEMPT_BYTES)
            async for chunk in upstream.chunks():
                if ttfb is None:
                    ttfb = (time.monotonic() - started) * 1000
                size += len(chunk)
                if keep_body and size <= settings.AUDIT_BODY_CAP:
                    parts.append(chunk)
                events = guard.feed(chunk)
                if guard.usage is not None and not self.response.committed:
                    self.call.emitter.early_usage(guard.usage)
                abort = await self._handle(events) or abort
                if abort is not None and self.policy.early_abort:
                    break
                await self.response.ready()  # a slow reader pauses the upstream read here
        final = await schema_pool.finish(guard)  # calls over the inline budget: validated in the pool
        await self._handle([e for e in final if not isinstance(e, Done)])
        done = next((e for e in final if isinstance(e, Done)), None)
        decision = _NO_DECISION if done is None else self.log.scrub(done.decision)
        self.log.add(target, decision.outcome.value, started, upstream_status=200, ttfb_ms=ttfb,
                     abort_reason=abort.finding.detail if abort is not None else ("" if decision.usable
                                                                                   else decision.reason),
                     findings=(*self.seam.findings(target), *decision.findings),
                     usage=decision.turn.usage if decision.turn is not None else None,
                     bytes_received=size, frames=guard.frames, body=b"".join(parts))
        if not decision.usable or decision.turn is None:
            return Attempted(decision)
        return await self._close(decision, number)

    async def _release(self, delta: TextDelta) -> None:
        if self.delivery.offer(delta) is not None:
            await self._text(delta)

    async def _close(self, decision: Decision, number: int) -> Attempted:
        """Deliver a usable turn: the text the delivery rule still sends, then tool calls, finish, terminator
        (or the loop breaker's answer in their place)."""
        assert decision.turn is not None
        stopped = await self.looping(decision, number)
        if stopped is not None:
            return stopped
        for delta in self.delivery.settle(decision.turn):
            await self._text(delta)
        return await super()._close(decision, number)

    async def _handle(self, events: list[Any]) -> Abort | None:
        """Act on guard events: release or hold text, commit on a valid tool call; return an Abort if any."""
        abort = None
        for event in events:
            if isinstance(event, TextDelta):
                await self._release(event)
            elif isinstance(event, ToolCallValid):
                await self.response.commit_stream()
            elif isinstance(event, Abort):
                abort = abort or event
        return abort

class NonStream(_Path):
    """A non-stream request: one JSON answer when it is ready."""

    async def _call(self, number: int, target: UpstreamTarget, started: float) -> Attempted:
        async with self.open(target) as upstream:
            self.log.refusals(target, upstream)
            if upstream.status != 200:
                return Attempted(await self.log.http_failure(target, started, upstream))
            body = await upstream.read_capped(NON_STREAM_CAP + 1)
            content_type = upstream.headers.get("content-type", "application/json")
        if len(body) > NON_STREAM_CAP:  # bounded memory: an answer this large is no answer
            finding = Finding(FindingKind.UPSTREAM_BODY_TOO_LARGE, Severity.ERROR, Action.RETRY,
                              f"the upstream's answer is larger than {NON_STREAM_CAP} bytes")
            decision = Decision(Outcome.RETRY, None, (finding,), finding.detail)
            self.log.add(target, "retry", started, upstream_status=200, findings=decision.findings,
                         abort_reason=decision.reason, bytes_received=len(body))
            return Attempted(decision)
        if self.call.forwards_raw:
            return await self._forward(target, started, body, content_type)
        decision = self.log.scrub(await schema_pool.decision(completion_guard(body, self.request.spec,
                                                                              self.call.plan.policy)))
        self.log.add(target, decision.outcome.value, started, upstream_status=200, findings=decision.findings,
                     abort_reason="" if decision.usable else decision.reason,
                     usage=decision.turn.usage if decision.turn else None, bytes_received=len(body),
                     frames=1 if body else 0, body=body)
        if not decision.usable or decision.turn is None:
            return Attempted(decision)
        stopped = await self.looping(decision, number)
        if stopped is not None:
            return stopped
        turn = redact_turn(decision.turn, self.log.secrets)
        self.deliver(turn)
        await self.response.send_json(200, self.call.emitter.complete(turn))
        return Attempted(decision, delivered=True, outcome=RequestOutcome.delivered(decision, number))

    async def _forward(self, target: UpstreamTarget, started: float, body: bytes, content_type: str) -> Attempted:
        """A tool-less OpenAI Chat answer goes back unchanged, with the upstream's content type."""
        try:
            usage = json.loads(body).get("usage")
        except (ValueError, AttributeError):
            usage = None
        self.log.add(target, "clean", started, upstream_status=200, usage=usage, bytes_received=len(body),
                     frames=1 if body else 0)
        await self.response.start(200, [(b"content-type", content_type.encode("latin-1"))])
        await self.response.end(body)
        return Attempted(_NO_DECISION, delivered=True, outcome=RequestOutcome.CLEAN)


def redact_turn(turn: Turn, secrets: frozenset[str]) -> Turn:
    """``turn`` with upstream credentials redacted from its texts and tool-call arguments (an upstream that
    echoes the key it was sent must not hand it to the client or to a tool)."""
    def scrubbed(text: str | None) -> str | None:
        return redact(text, secrets) if text else text

    choices = [dataclasses.replace(c, content=scrubbed(c.content), reasoning=scrubbed(c.reasoning),
                                   tool_calls=[dataclasses.replace(t, arguments=redact(t.arguments, secrets))
                                               for t in c.tool_calls])
               for c in turn.choices]
    return dataclasses.replace(turn, choices=choices)


def is_event_stream(upstream: UpstreamResponse) -> bool:
    """True when the answer is an event stream (or says nothing about its type: then it is read as one)."""
    content_type = upstream.headers.get("content-type", "")
    return not content_type or "event-stream" in content_type or "ndjson" in content_type


def _error_body(body: bytes) -> UpstreamError | None:
    """The error of a JSON error body (``{"error": ...}``), else None."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(obj, dict) and obj.get("error"):
        return classify_inband_error(obj["error"])
    return None
