"""The three request paths, as small strategies the relay's one attempt loop drives.

A path is built from ``PathInputs`` (what it uses: the request, the client response, the upstream client,
the attempt records, the request's ``Deadlines``, its loop breaker, its trace) and never writes into the
relay. Its ``attempt(number, target)`` makes one upstream call and returns one ``Attempted``: ``Delivered``
(the client has its answer: the request outcome, what the client received for the audit, the decision
of the turn or of the failure that cut a delivered stream) or ``Failed`` (the decision that says why
not; its ``ending`` is ``RETRY`` when asking again can help, else ``ERROR``). The relay decides whether
to retry and, when the attempts run out, hands ``proxy.guard.decisions.answer.answer_for``'s verdict to
``give_up``, which returns what the client received.

- ``PassThrough`` (a client protocol that passes bytes through, streaming, no ``tools``): upstream bytes
  forwarded as they arrive, unchanged; usage read from a small tail buffer afterwards, never delaying a byte.
- ``Guarded`` (streaming, ``tools`` or a translated protocol): frames through ``AttemptGuard``; text
  released per ``Delivery``; tool calls held until valid; a provably broken attempt aborted early;
  the response committed at the first thing the client must see or at the commit deadline.
- On a route with ``continue_text``, a text stream the upstream cuts after text reached the client is
  continued from exactly that text where the upstream takes a prefix (``proxy.relay.continued``).
- ``NonStream``: nothing is sent until the answer is ready (checked unless it is a tool-less answer of a
  pass-through protocol, which goes back unchanged with the upstream's content type).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

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
from proxy.relay.attempts import UpstreamCall
from proxy.relay.continued import GuardedSeam, PassSeam
from proxy.telemetry import semconv
from proxy.upstreams.client import UpstreamResponse, UpstreamTimeout, UpstreamUnavailable
from tenants.principal import UpstreamTarget

if TYPE_CHECKING:
    from proxy.edge.response import ClientResponse
    from proxy.policy.loop_breaker import LoopBreaker
    from proxy.relay.attempts import AttemptLog
    from proxy.relay.loop import RelayCall
    from proxy.telemetry.spans import RequestTrace
    from proxy.upstreams.client import UpstreamClient

#: Non-stream upstream bodies larger than this are refused as an upstream failure.
NON_STREAM_CAP = 32 * 1024 * 1024  # bytes
#: A guarded stream that ended without the guard's ``Done`` (it always gives one): asked again.
_UNDECIDED = Decision(Outcome.RETRY, None, reason="no decision")

#: What the client received, for the audit (``audit.delivered``); None: bytes passed through unchanged.
Received = dict[str, Any] | None


def retryable(decision: Decision) -> bool:
    """True when asking the upstream again can help: broken model output, or a retryable error."""
    return decision.outcome == Outcome.RETRY or (decision.error is not None and decision.error.retryable)


class Ending(enum.Enum):
    """How an attempt ended, for the relay's loop."""

    DELIVERED = "delivered"  # the client has its answer: no more attempts
    RETRY = "retry"  # not delivered; asking again can help (``retryable``)
    ERROR = "error"  # not delivered; asking again cannot help (a refused key may still move to another)


@dataclass(frozen=True, slots=True)
class Delivered:
    """An attempt that answered the client: the request ``outcome``, what the client ``received``, ``error``
    (the audit's text for a stream that broke off after the commit) and ``decision``: the delivered turn's,
    or the failure that cut a delivered stream (the router counts it); None for a stream passed through
    unchanged to its end."""

    outcome: RequestOutcome
    received: Received = None
    error: str = ""
    decision: Decision | None = None
    ending: ClassVar[Ending] = Ending.DELIVERED


@dataclass(frozen=True, slots=True)
class Failed:
    """An attempt that did not answer the client, and the ``decision`` against it."""

    decision: Decision

    @property
    def ending(self) -> Ending:
        return Ending.RETRY if retryable(self.decision) else Ending.ERROR


#: One attempt's result.
Attempted = Delivered | Failed


@dataclass(frozen=True, slots=True)
class Deadlines:
    """A request's clocks, monotonic seconds: ``request`` (its route's deadline) and ``retries`` (the retry
    deadline, ``RETRY_DEADLINE_SECONDS`` after the request arrived)."""

    request: float
    retries: float

    def timeouts(self, target: UpstreamTarget, *, retry: bool) -> tuple[float, float]:
        """``(first_byte, idle)`` seconds for a call to ``target``: its own deadlines, shortened to the time
        left before the request deadline and, for a ``retry``, before the retry deadline."""
        now = time.monotonic()
        left = self.request - now
        first_byte = min(target.first_byte_timeout, left)
        if retry:
            first_byte = min(first_byte, self.retries - now)
        return max(0.001, first_byte), max(0.001, min(target.idle_timeout, left))


@dataclass(frozen=True, slots=True)
class PathInputs:
    """What a path uses: the request (``call``), the ``response`` it writes to, the upstream ``client``, the
    attempt records (``log``), the request's ``deadlines``, its loop breaker (``loops``; None for a request
    without tools) and its ``trace``."""

    call: RelayCall
    response: ClientResponse
    client: UpstreamClient
    log: AttemptLog
    deadlines: Deadlines
    loops: LoopBreaker | None
    trace: RequestTrace


class _Path(abc.ABC):
    """What every path shares: the request, the response, the upstream client and the audit log."""

    def __init__(self, inputs: PathInputs) -> None:
        self.inputs = inputs
        self.call = inputs.call
        self.request = inputs.call.request
        self.response = inputs.response
        self.log = inputs.log
        self.client = inputs.client
        self._retry = False  # the attempt under way is a retry (its first-byte deadline: the retry deadline too)

    def open(self, target: UpstreamTarget, *, ask_usage: bool = False, request: ChatRequest | None = None) -> Any:
        """The upstream call for ``target`` (an async context manager yielding ``UpstreamResponse``), its
        deadlines shortened to what the request deadline and the retry deadline leave; ``request``: another
        body than the client's (a continuation's)."""
        first_byte, idle = self.inputs.deadlines.timeouts(target, retry=self._retry)
        return self.client.open(target, request or self.request, ask_usage=ask_usage, first_byte=first_byte,
                                idle=idle, max_output_tokens=self.call.plan.max_output_tokens)

    async def interrupted(self, target: UpstreamTarget, started: float, exc: Exception) -> Attempted:
        """The attempt under way was cut by the request deadline (``exc``): record it like a timeout."""
        return await self._broke(target, started, exc)

    async def attempt(self, number: int, target: UpstreamTarget) -> Attempted:
        """One upstream call (``number``: 0-based); transport failures become their decision."""
        self._retry = number > 0
        started = time.monotonic()
        try:
            return await self._call(number, target, started)
        except (UpstreamTimeout, UpstreamUnavailable) as exc:
            return await self._broke(target, started, exc)

    @abc.abstractmethod
    async def _call(self, number: int, target: UpstreamTarget, started: float) -> Attempted:
        """The path's upstream call ``number`` (0-based) to ``target``, started at ``started`` (monotonic)."""

    async def _broke(self, target: UpstreamTarget, started: float, exc: Exception) -> Attempted:
        return Failed(self.log.transport_failure(target, started, exc))

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
        received = self.received(turn)
        await self.response.end(self.call.emitter.close(turn))
        return Delivered(RequestOutcome.delivered(decision, number), received, decision=decision)

    def received(self, turn: Turn) -> Received:
        """The audit's note of the turn the client is sent (texts kept unless the policy keeps no content)."""
        return delivered_turn(turn, content=self.call.plan.policy.fragments != FragmentStorage.NONE)

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
            self.log.add(UpstreamCall.answered(target, started, decision, bytes_received=len(body), body=body))
            return Failed(decision)
        note = Finding(FindingKind.UPSTREAM_NOT_SSE, Severity.INFO, Action.NORMALIZED,
                       "a whole chat.completion instead of an event stream; sent as a stream")
        decision = self.log.scrub(await schema_pool.decision(completion_guard(body, self.request.spec,
                                                                              self.call.plan.policy)))
        outcome = Outcome.NORMALIZED if decision.outcome is Outcome.CLEAN else decision.outcome
        decision = dataclasses.replace(decision, outcome=outcome, findings=(note, *decision.findings))
        self.log.add(UpstreamCall.answered(target, started, decision, bytes_received=len(body), frames=1, body=body))
        if not decision.usable or decision.turn is None:
            return Failed(decision)
        for choice in decision.turn.choices:
            for channel, text in (("reasoning", choice.reasoning), ("content", choice.content),
                                  ("refusal", choice.refusal)):
                if text:
                    await self._release(TextDelta(choice.index, channel, text))  # type: ignore[arg-type]
        return await self._close(decision, number)

    async def looping(self, decision: Decision, number: int) -> Attempted | None:
        """When the loop breaker finds that ``decision``'s usable turn completes an agent loop: the stuck
        answer sent in its place and the attempt's result; else None (deliver the turn)."""
        loops = self.inputs.loops
        if loops is None or decision.turn is None:
            return None
        stuck = await loops.check_turn(decision.turn)
        if stuck is None:
            return None
        received = await self.stuck(stuck)
        return Delivered(RequestOutcome.delivered(decision, number), received, decision=decision)

    async def stuck(self, stuck: Stuck) -> Received:
        """The loop breaker's answer: a terminal assistant message saying the agent seems stuck and why
        (finish ``stop`` / ``end_turn``, ``response.completed``), in place of the turn or the exhaustion answer;
        returns what the client received."""
        message = stuck_message(stuck, request_id=str(self.response.request_id))
        self.inputs.trace.event(semconv.EVENT_LOOP_BROKEN, **{semconv.LOOP_RULE: stuck.rule})
        if self.call.plan.policy.exhaustion is Exhaustion.FAIL:
            return await self._fail(message, status=400, code="agent_loop_detected")
        return await self._exhausted(message)

    async def _exhausted(self, message: str) -> Received:
        """``message`` as the turn's assistant answer (finish ``stop``), streamed or whole."""
        received = delivered_exhaustion(message, scrub=self._scrub)
        if self.request.stream:
            await self.response.end(self.call.emitter.close_exhausted(self.separator() + message))
        else:
            await self.response.send_json(200, self.call.emitter.complete_exhausted(message))
        return received

    async def _fail(self, message: str, *, status: int, code: str) -> Received:
        """End the turn with ``message`` as the protocol's terminal error (the ``fail`` exhaustion
        policy): in-stream when streaming, else an HTTP ``status`` error with ``x-should-retry: false``."""
        received = delivered_exhaustion(message, as_error=True, scrub=self._scrub)
        if self.request.stream:
            await self.response.end(self.call.emitter.close_terminal(message))
        else:
            said = message.removesuffix(f" Request id: {self.response.request_id}.")  # error() adds the id
            await self.response.error(status, said, type="invalid_request_error", code=code, should_retry=False)
        return received

    async def give_up(self, answer: Answer, *, attempts: int) -> Received:
        """Render ``answer`` (``answer_for``, after ``attempts`` attempts) in the client's protocol; returns what
        the client received."""
        response, error, scrub = self.response, answer.error, self._scrub
        if answer.kind is AnswerKind.HTTP_ERROR and error is not None:
            received = delivered_error(error.status, error.message, scrub=scrub)
            await response.error(error.status, error.message, type=error.type, code=error.code,
                                 should_retry=answer.retryable, retry_after=error.retry_after)
            return received
        if answer.kind is AnswerKind.STREAM_ERROR and error is not None:
            received = delivered_exhaustion(error.message, as_error=True, scrub=scrub) \
                if answer.outcome is RequestOutcome.EXHAUSTED else delivered_error(error.status, error.message,
                                                                                   scrub=scrub)
            await response.end(self.call.emitter.close_error(error))
            return received
        message = exhaustion_message(attempts=attempts, reason=answer.reason, guarded=self.request.declares_tools,
                                     request_id=str(response.request_id))
        if answer.kind is AnswerKind.TERMINAL:
            return await self._fail(message, status=502, code="upstream_failed")
        return await self._exhausted(message)


class PassThrough(_Path):
    """A pass-through protocol's stream without tools: the upstream's bytes, unchanged, checked on the side.

    On a route with ``continue_text`` on, ``seam`` reads what the client was sent, and a stream the upstream
    cuts after text is continued in the same client stream where the upstream takes a prefix
    (``proxy.relay.continued``); otherwise a cut ends with the protocol's in-stream error."""

    def __init__(self, inputs: PathInputs) -> None:
        super().__init__(inputs)
        self.seam = PassSeam(self) if inputs.call.plan.continue_text else None

    async def interrupted(self, target: UpstreamTarget, started: float, exc: Exception) -> Attempted:
        self.seam = None  # the request deadline passed: no time for a continuation
        return await super().interrupted(target, started, exc)

    async def _call(self, number: int, target: UpstreamTarget, started: float) -> Attempted:
        async with self.open(target) as upstream:
            self.log.refusals(target, upstream)
            if upstream.status != 200:
                return Failed(await self.log.http_failure(target, started, upstream))
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
        outcome = Outcome.UPSTREAM_ERROR if fatal else (Outcome.NORMALIZED if findings else Outcome.CLEAN)
        reason = next((f.detail for f in findings if f.fatal), "")
        self.log.add(UpstreamCall(target, outcome, started, upstream_status=200, bytes_received=size,
                                  frames=check.frames, usage=check.usage, findings=findings, abort_reason=reason))
        if check.broken_off and self.seam is not None and self.seam.possible(target):
            request_outcome, error_text = await self.seam.run(target, reason or "the stream ended without a finish "
                                                                                  "reason")
            return Delivered(request_outcome, error=error_text)
        if check.broken_off:
            await self.end_with_error(UpstreamError(
                502, f"the upstream stream ended without a finish reason (request id: {self.response.request_id})",
                "upstream_error", code="upstream_truncated"))
        else:
            await self.response.end()
        if fatal:
            request_outcome = RequestOutcome.UPSTREAM_ERROR
        else:
            request_outcome = RequestOutcome.RECOVERED if number > 0 else RequestOutcome(outcome.value)
        return Delivered(request_outcome, error=reason)

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
            return Delivered(outcome, error=error_text, decision=decision)
        if decision.error is not None:
            message = f"the upstream stream broke off: {decision.reason} (request id: {self.response.request_id})"
            await self.end_with_error(dataclasses.replace(decision.error, message=message))
        return Delivered(RequestOutcome.UPSTREAM_ERROR, error=decision.reason, decision=decision)

    async def end_with_error(self, error: UpstreamError) -> None:
        """End the client's stream with the protocol's in-stream ``error`` (nothing when it already ended); the
        leading blank lines end an event whose complete data lines the client has, so the error stands alone."""
        if not self.response.ended:
            await self.response.end(b"\n\n" + self.call.emitter.close_error(error))


@dataclass(slots=True)
class _Streamed:
    """What a guarded attempt's stream read: ``size`` bytes, the first after ``ttfb`` ms, the guard's first
    ``abort`` and the body ``parts`` the audit keeps."""

    size: int = 0
    ttfb: float | None = None
    abort: Abort | None = None
    parts: list[bytes] = dataclasses.field(default_factory=list)


class Guarded(_Path):
    """Streaming through the guard: live text, held tool calls, early abort, one canonical stream."""

    def __init__(self, inputs: PathInputs) -> None:
        super().__init__(inputs)
        self.policy = inputs.call.plan.policy
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
        if isinstance(result, Failed):
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
        async with self.open(target, ask_usage=True, request=self.seam.request(target)) as upstream:
            self.log.refusals(target, upstream)
            if upstream.status != 200:
                return Failed(await self.log.http_failure(target, started, upstream))
            if not is_event_stream(upstream):
                return await self._not_sse(number, target, started, upstream)
            spec = dataclasses.replace(self.request.spec, usage_requested=upstream.asked_usage)
            guard = self._guard = AttemptGuard(spec, self.policy, max_line=settings.MAX_SSE_LINE_BYTES,
                                               max_bytes=settings.MAX_ATTEMPT_BYTES)
            read = await self._stream(upstream, guard, started)
        final = await schema_pool.finish(guard)  # calls over the inline budget: validated in the pool
        await self._handle([e for e in final if not isinstance(e, Done)])
        done = next((e for e in final if isinstance(e, Done)), None)
        decision = _UNDECIDED if done is None else self.log.scrub(done.decision)
        self.log.add(UpstreamCall.answered(
            target, started, decision, ttfb_ms=read.ttfb, bytes_received=read.size, frames=guard.frames,
            body=b"".join(read.parts), findings=(*self.seam.findings(target), *decision.findings),
            abort_reason=read.abort.finding.detail if read.abort is not None else None))
        if not decision.usable or decision.turn is None:
            return Failed(decision)
        return await self._close(decision, number)

    async def _stream(self, upstream: UpstreamResponse, guard: AttemptGuard, started: float) -> _Streamed:
        """Feed the upstream's chunks to ``guard`` and act on its events (until its first abort, under the
        early-abort policy); the body is kept for the audit when the policy stores whole attempts."""
        keep_body = self.policy.fragments == FragmentStorage.ATTEMPT
        read = _Streamed()
        async for chunk in upstream.chunks():
            if read.ttfb is None:
                read.ttfb = (time.monotonic() - started) * 1000
            read.size += len(chunk)
            if keep_body and read.size <= settings.AUDIT_BODY_CAP:
                read.parts.append(chunk)
            events = guard.feed(chunk)
            if guard.usage is not None and not self.response.committed:
                self.call.emitter.early_usage(guard.usage)
            read.abort = await self._handle(events) or read.abort
            if read.abort is not None and self.policy.early_abort:
                break
            await self.response.ready()  # a slow reader pauses the upstream read here
        return read

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
                return Failed(await self.log.http_failure(target, started, upstream))
            body = await upstream.read_capped(NON_STREAM_CAP + 1)
            content_type = upstream.headers.get("content-type", "application/json")
        if len(body) > NON_STREAM_CAP:  # bounded memory: an answer this large is no answer
            finding = Finding(FindingKind.UPSTREAM_BODY_TOO_LARGE, Severity.ERROR, Action.RETRY,
                              f"the upstream's answer is larger than {NON_STREAM_CAP} bytes")
            decision = Decision(Outcome.RETRY, None, (finding,), finding.detail)
            self.log.add(UpstreamCall.answered(target, started, decision, bytes_received=len(body)))
            return Failed(decision)
        if self.call.forwards_raw:
            return await self._forward(target, started, body, content_type)
        decision = self.log.scrub(await schema_pool.decision(completion_guard(body, self.request.spec,
                                                                              self.call.plan.policy)))
        self.log.add(UpstreamCall.answered(target, started, decision, bytes_received=len(body),
                                           frames=1 if body else 0, body=body))
        if not decision.usable or decision.turn is None:
            return Failed(decision)
        stopped = await self.looping(decision, number)
        if stopped is not None:
            return stopped
        turn = redact_turn(decision.turn, self.log.secrets)
        received = self.received(turn)
        await self.response.send_json(200, self.call.emitter.complete(turn))
        return Delivered(RequestOutcome.delivered(decision, number), received, decision=decision)

    async def _forward(self, target: UpstreamTarget, started: float, body: bytes, content_type: str) -> Attempted:
        """A tool-less answer of a pass-through protocol goes back unchanged, with the upstream's content type."""
        try:
            usage = json.loads(body).get("usage")
        except (ValueError, AttributeError):
            usage = None
        self.log.add(UpstreamCall(target, Outcome.CLEAN, started, upstream_status=200, usage=usage,
                                  bytes_received=len(body), frames=1 if body else 0))
        await self.response.start(200, [(b"content-type", content_type.encode("latin-1"))])
        await self.response.end(body)
        return Delivered(RequestOutcome.CLEAN)


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
