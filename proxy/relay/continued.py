"""A cut pass-through text stream continued in the same client stream (docs/routing.md, "Cut text
streams continued").

``PassSeam`` belongs to one ``PassThrough`` request on a route with ``continue_text`` on. It reads what
the client was sent (``proxy.guard.stream.seam.Transcript``); when the upstream cuts the stream (a
transport error, an idle timeout, an end without finish reason or ``[DONE]``) after text reached the
client and the upstream takes a prefix (``UpstreamTarget.continuation``), ``run`` asks the same upstream
for the continuation of exactly that text (``proxy.guard.decisions.continuation``) and forwards it
through a ``Stitcher``, so the client reads one stream: one completion id, one role chunk, the rest of
the text. At most ``TEXT_CONTINUATIONS_MAX`` continuations per request, none past
``TEXT_CONTINUATION_CAP_CHARS`` characters delivered; when no continuation is possible or the last one
fails, the stream ends with the protocol's in-stream error, as without the feature. Each continuation
is an attempt of the audit; the one that ends the stream carries a ``text-continued`` finding (the seam:
characters delivered before it, the shape, the cause of the cut).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from django.conf import settings

from proxy.guard.checks.passcheck import PassCheck
from proxy.guard.checks.request import ChatRequest
from proxy.guard.decisions.answer import RequestOutcome, broken_off
from proxy.guard.decisions.continuation import Shape, continuation_body, may_continue
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from proxy.guard.stream.seam import Stitcher, Transcript
from proxy.guard.turn import Decision, Outcome, UpstreamError
from proxy.relay.attempts import UpstreamCall
from proxy.upstreams.client import UpstreamResponse, UpstreamTimeout, UpstreamUnavailable
from tenants.principal import UpstreamTarget

if TYPE_CHECKING:
    from proxy.relay.paths import Guarded, PassThrough


@dataclasses.dataclass(slots=True)
class _Leg:
    """How one continuation ended: ``done`` (finish reason or ``[DONE]``), else ``cause`` of its cut;
    ``error``: an answer that is no continuation (an HTTP error, not an event stream)."""

    done: bool = False
    cause: str = ""
    error: UpstreamError | None = None


class PassSeam:
    """The continuation state of one pass-through request (``PassThrough.seam``)."""

    def __init__(self, path: PassThrough) -> None:
        self.path = path
        self.transcript = Transcript(cap=settings.TEXT_CONTINUATION_CAP_CHARS, max_line=settings.MAX_SSE_LINE_BYTES)
        self.count = 0

    def possible(self, target: UpstreamTarget) -> bool:
        """True when the stream the client has can be continued on ``target``."""
        transcript = self.transcript
        return transcript.continuable and may_continue(
            opted_in=True, shape=Shape.of(target.continuation), continued=self.count,
            limit=settings.TEXT_CONTINUATIONS_MAX, delivered=len(transcript.text), cap=transcript.cap)

    async def run(self, target: UpstreamTarget, cause: str) -> tuple[RequestOutcome, str]:
        """Continue until the stream ends or no continuation is left (``cause``: why the stream was cut);
        returns the request's outcome and the audit's error text."""
        while True:
            self.count += 1
            delivered = len(self.transcript.text)
            started = time.monotonic()
            try:
                leg = await self._leg(target, started, cause, delivered)
            except (UpstreamTimeout, UpstreamUnavailable) as exc:
                decision = self.path.log.transport_failure(target, started, exc, upstream_status=200)
                leg = _Leg(cause=decision.reason)
            if leg.done:
                await self.path.response.end()
                return RequestOutcome.RECOVERED, ""
            if leg.error is not None or not self.possible(target):
                return await self._fail(leg.error, leg.cause or cause)
            cause = leg.cause

    async def _leg(self, target: UpstreamTarget, started: float, cause: str, delivered: int) -> _Leg:
        """One continuation call, forwarded as it arrives; recorded as an attempt."""
        path, transcript = self.path, self.transcript
        shape = Shape.of(target.continuation)
        body = continuation_body(path.request.body, transcript.text, shape)
        request = dataclasses.replace(path.request, body=body, raw=None)
        async with path.open(target, request=request) as upstream:
            path.log.refusals(target, upstream)
            if upstream.status != 200:
                decision = await path.log.http_failure(target, started, upstream)
                return _Leg(error=decision.error, cause=decision.reason)
            if not _event_stream(upstream):
                reason = "the continuation's answer is not an event stream"
                path.log.add(UpstreamCall(target, Outcome.UPSTREAM_ERROR, started, upstream_status=200,
                                          abort_reason=reason))
                return _Leg(cause=reason)
            check = PassCheck(max_line=settings.MAX_SSE_LINE_BYTES, secrets=path.log.secrets)
            stitch = Stitcher(transcript.identity, max_event=settings.MAX_SSE_LINE_BYTES)
            if transcript.open:  # the client has data lines of an event: a blank line dispatches it
                transcript.feed(b"\n")
                await path.response.send(b"\n")
            size = await self._forward(upstream, check, stitch)
        findings = [*check.finish()]
        done = (check.done or check.finished) and not stitch.overflowed
        if done:
            tail = stitch.flush()
            if tail:
                transcript.feed(tail)
                await path.response.send(tail)
            findings.insert(0, Finding(
                FindingKind.TEXT_CONTINUED, Severity.INFO, Action.NORMALIZED,
                f"the stream was cut after {delivered} characters of text ({cause[:200]}); continued from exactly "
                f"that text ({shape.value}), continuation {self.count} of at most {settings.TEXT_CONTINUATIONS_MAX}"))
        cut = "" if done else next((f.detail for f in findings if f.fatal), "") or "the continuation was cut too"
        path.log.add(UpstreamCall(target, Outcome.NORMALIZED if done else Outcome.UPSTREAM_ERROR, started,
                                  upstream_status=200, bytes_received=size, frames=check.frames, usage=check.usage,
                                  findings=tuple(findings), abort_reason=cut))
        return _Leg(done=done, cause=cut)

    async def _forward(self, upstream: UpstreamResponse, check: PassCheck, stitch: Stitcher) -> int:
        """Forward the continuation event by event, stitched; return the bytes received."""
        size, response, transcript = 0, self.path.response, self.transcript
        async for chunk in upstream.chunks():
            size += len(chunk)
            data = stitch.feed(check.feed(chunk))
            if data:
                transcript.feed(data)
                await response.send(data)
            if stitch.overflowed:
                break
            await response.ready()
        return size

    async def _fail(self, error: UpstreamError | None, cause: str) -> tuple[RequestOutcome, str]:
        """No continuation left: the protocol's in-stream error ends the stream (as without continuations)."""
        path = self.path
        message = f"the upstream stream broke off: {cause} (request id: {path.response.request_id})"
        await path.end_with_error(UpstreamError(502, message, "upstream_error", code="upstream_truncated")
                                  if error is None else dataclasses.replace(error, message=message))
        return RequestOutcome.UPSTREAM_ERROR, cause


def _event_stream(upstream: UpstreamResponse) -> bool:
    content_type = upstream.headers.get("content-type", "")
    return not content_type or "event-stream" in content_type



class GuardedSeam:
    """The continuation state of one guarded request (``Guarded.seam``): the relay's next attempt asks for
    the continuation of the text the client has, and its text streams live after it (``Delivery.begin``)
    instead of being held and cut by the common prefix.

    ``ended`` looks at an attempt that was not delivered: cut (a transport error or idle timeout once text
    was sent, or an end without finish reason) with only choice 0's content sent and no tool call begun,
    on a route that opted in and an upstream that takes a prefix: the delivered text is kept for the next
    attempt. ``start`` says whether the attempt under way continues it (its target takes a prefix too: a
    fallback that does not gets a fresh attempt, today's rule), ``request`` is its body.
    """

    def __init__(self, path: Guarded) -> None:
        self.path = path
        self.count = 0
        self.asking: str | None = None  # the delivered text the attempt under way continues
        self._next: str | None = None
        self._cause = ""

    def start(self, target: UpstreamTarget) -> bool:
        """An attempt to ``target`` starts: True when it continues the delivered text."""
        self.asking = self._next if Shape.of(target.continuation) is not Shape.NONE else None
        self._next = None
        self.count += self.asking is not None
        return self.asking is not None

    def request(self, target: UpstreamTarget) -> ChatRequest | None:
        """The continuation request of the attempt under way (None: the client's own)."""
        if self.asking is None:
            return None
        body = continuation_body(self.path.request.body, self.asking, Shape.of(target.continuation))
        return dataclasses.replace(self.path.request, body=body, raw=None)

    def findings(self, target: UpstreamTarget) -> tuple[Finding, ...]:
        """The seam finding of a continuing attempt (none for the others)."""
        if self.asking is None:
            return ()
        return (Finding(FindingKind.TEXT_CONTINUED, Severity.INFO, Action.NORMALIZED,
                        f"the stream was cut after {len(self.asking)} characters of text ({self._cause[:200]}); "
                        f"asked to continue from exactly that text ({target.continuation}), continuation "
                        f"{self.count} of at most {settings.TEXT_CONTINUATIONS_MAX}"),)

    def ended(self, decision: Decision, target: UpstreamTarget, *, cut: bool, calls: bool) -> None:
        """After an undelivered attempt to ``target``: keep the delivered text when the next attempt may continue
        it (``cut``: the attempt ended in a transport error or without finish reason and ``[DONE]``;
        ``calls``: a tool call had begun)."""
        delivery = self.path.delivery
        cut = cut or broken_off(decision)
        if not cut or calls or delivery.channels != {(0, "content")}:
            return
        text = delivery.sent(0, "content")
        if may_continue(opted_in=self.path.call.plan.continue_text, shape=Shape.of(target.continuation),
                        continued=self.count, limit=settings.TEXT_CONTINUATIONS_MAX, delivered=len(text),
                        cap=settings.TEXT_CONTINUATION_CAP_CHARS):
            self._next, self._cause = text, decision.reason
