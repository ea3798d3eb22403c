"""What a client gets when a request ends without a usable turn, and the request outcome enum.

``answer_for`` is the one rule (ARCHITECTURE.md, "The request, as data", step 6), pure:

- Broken model output (the upstream answered, no usable turn) on a checked streaming request, when
  the policy's exhaustion answer is ``fail`` (the default): the protocol's terminal error that agents
  show once and never retry (``TERMINAL``, committed or not), so a headless agent run fails instead
  of reporting success (issue 23 item 1; the measured table is in docs/clients.md).
- Broken model output on a checked request, when the
  policy's exhaustion answer is the terminal message: that message, also before the commit
  (non-stream: a 200 JSON turn). Agents do not retry it; the loop goes on.
- Before the commit otherwise: an HTTP error with ``x-should-retry: false`` (toolrelay already
  retried): 502 ``upstream_auth_failed`` when the upstream refused toolrelay's own credential
  (401/403/407: never the client's key); a non-retryable upstream error passed on with its status;
  else ``upstream_failed`` with 429/504 kept and 502 for the rest.
- After the commit: a non-retryable upstream error in-stream as itself; broken model output with
  the exhaustion policy ``error`` as an in-stream ``upstream_failed``; broken model output otherwise
  as the terminal message.
- A last attempt whose stream was broken off (it ended with neither a finish reason nor ``[DONE]``,
  and what it assembled was not a complete turn): the same retryable error, code
  ``upstream_truncated``, never the terminal message or a success (issue: fault tolerance, item 6:
  one rule for every path and dialect; the byte-exact pass-through appends the same error).
- Retries that ended because the upstream is unreachable or too slow (transport errors, 5xx, 429,
  timeouts, the request deadline) rather than because its output was broken: a *retryable* error,
  so agents back off and try again (issue: fault tolerance, item 3): before the commit HTTP 429 /
  502 / 503 / 504 with ``x-should-retry: true`` and ``Retry-After`` where the upstream gave one;
  after it the protocol's in-stream error (OpenAI error chunk, Anthropic ``error`` event,
  Responses ``response.failed``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from proxy.guard.findings import Action, FindingKind
from proxy.guard.policy import Exhaustion, GuardPolicy
from proxy.guard.stream.overflow import CODE as OVERFLOW_CODE
from proxy.guard.stream.overflow import anthropic_wording, read_overflow
from proxy.guard.turn import Decision, Outcome, UpstreamError


class RequestOutcome(enum.StrEnum):
    """How a client request ended (``audit.models.ProxyRequest.Outcome`` values, set once per request)."""

    CLEAN = "clean"
    NORMALIZED = "normalized"
    REPAIRED = "repaired"
    RECOVERED = "recovered-by-retry"
    EXHAUSTED = "exhausted"
    UPSTREAM_ERROR = "upstream-error"
    CLIENT_CANCELLED = "client-cancelled"

    @classmethod
    def delivered(cls, decision: Decision, attempt: int) -> RequestOutcome:
        """The outcome of a request whose ``attempt`` (0-based) delivered ``decision``'s turn."""
        return cls.RECOVERED if attempt > 0 else cls(decision.outcome.value)


class AnswerKind(enum.Enum):
    """How the answer reaches the client."""

    HTTP_ERROR = "http-error"  # before the commit: status + error body, x-should-retry false
    STREAM_ERROR = "stream-error"  # after the commit: the protocol's in-stream error, ending the stream
    EXHAUSTED = "exhausted"  # the terminal assistant message (stream) or JSON turn (non-stream)
    TERMINAL = "terminal"  # the protocol's non-retryable in-stream error (``Emitter.close_terminal``)


#: Upstream statuses that mean toolrelay's own credential was refused (never the client's key).
UPSTREAM_AUTH_STATUSES = frozenset({401, 403, 407})
#: Findings that mean the model's output failed, not the transport (C41, C47).
_MODEL_FAILURE_KINDS = frozenset({FindingKind.MID_STREAM_ERROR_CHUNK, FindingKind.PRE_STREAM_TOOL_USE_FAILED})


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to give: ``kind``, the request ``outcome``, and for errors the ``error`` to render
    (status, message without the request id, type, code). ``reason`` is the last problem, for the
    exhaustion message and the audit."""

    kind: AnswerKind
    outcome: RequestOutcome
    reason: str
    error: UpstreamError | None = None
    retryable: bool = False  # the client may ask again (x-should-retry: true, Retry-After)

    @property
    def audit_error(self) -> str:
        """The request's error text for the audit: the HTTP error's message, else the last problem."""
        return self.error.message if self.kind == AnswerKind.HTTP_ERROR and self.error is not None else self.reason


def model_failure(decision: Decision) -> bool:
    """True when ``decision`` is about broken model output rather than an unreachable or failing upstream."""
    return decision.outcome == Outcome.RETRY or any(f.kind in _MODEL_FAILURE_KINDS for f in decision.findings)


def broken_off(decision: Decision) -> bool:
    """True when ``decision``'s stream was cut: no finish reason, no ``[DONE]``, and the guard could not
    take what arrived as a complete turn (a ``missing-finish-reason`` finding that asked for a retry)."""
    return any(f.kind == FindingKind.MISSING_FINISH_REASON and f.action == Action.RETRY for f in decision.findings)


def answer_for(decision: Decision, *, committed: bool, stream: bool, checked: bool, policy: GuardPolicy,
               attempts: int, request_id: str, prompt_tokens: int = 0, budget: int | None = None,
               overflow_in_stream: bool = False) -> Answer:
    """The answer for a request whose last attempt ended with ``decision`` after ``attempts`` calls.

    ``committed``: the client already has a 200 and stream headers; ``checked``: the answer goes
    through the guard and an emitter (every path but the byte-exact OpenAI Chat pass-through, which
    only ever gets errors); ``stream``: a streaming request. HTTP error messages leave the request
    id to the response (it appends it to every error); in-stream ones carry it where the client
    would otherwise not see it. An upstream's context-window refusal is said in the words clients
    parse (``proxy.guard.stream.overflow``), with ``prompt_tokens`` (toolrelay's count of the request)
    and ``budget`` (the request's output budget) where the upstream gave no figures; in the stream
    when the protocol reads it only there (``overflow_in_stream``, ``Emitter.overflow_in_stream``).
    """
    error = decision.error
    if error is not None and not error.retryable:
        error = _overflowed(error, prompt_tokens=prompt_tokens, budget=budget) or error
        decision = dataclasses.replace(decision, error=error)
    retryable = error is None or error.retryable
    reason = error.message if error is not None else decision.reason
    if error is not None and retryable and not model_failure(decision):
        return _unavailable(error, committed=committed, attempts=attempts, request_id=request_id)
    if error is None and broken_off(decision):
        cut = UpstreamError(502, "the upstream stream ended without a finish reason", "upstream_error",
                            code="upstream_truncated")
        return _unavailable(cut, committed=committed, attempts=attempts, request_id=request_id,
                            outcome=RequestOutcome.EXHAUSTED)
    model_broke = checked and retryable and model_failure(decision)
    if model_broke and stream and policy.exhaustion == Exhaustion.FAIL:
        return Answer(AnswerKind.TERMINAL, RequestOutcome.EXHAUSTED, reason)
    message_ok = model_broke and policy.exhaustion == Exhaustion.MESSAGE
    if not committed and not message_ok:
        return _http_error(decision, attempts, overflow_in_stream=stream and overflow_in_stream)
    if error is not None and not error.retryable:
        return Answer(AnswerKind.STREAM_ERROR, RequestOutcome.UPSTREAM_ERROR, error.message, error)
    if stream and policy.exhaustion == Exhaustion.ERROR:
        failed = UpstreamError(502, f"the upstream failed {attempts} time(s): {reason} (request id: {request_id})",
                               "upstream_error", code="upstream_failed")
        return Answer(AnswerKind.STREAM_ERROR, RequestOutcome.EXHAUSTED, reason, failed)
    return Answer(AnswerKind.EXHAUSTED, RequestOutcome.EXHAUSTED, reason)


def _overflowed(error: UpstreamError, *, prompt_tokens: int, budget: int | None) -> UpstreamError | None:
    """``error`` as a context overflow in the Anthropic API's wording, code ``context_length_exceeded``
    (OpenAI's; every protocol's emitter renders it in its own error shape), or None when it is none."""
    overflow = read_overflow(error.message)
    if overflow is None:
        return None
    said = anthropic_wording(overflow, prompt_estimate=prompt_tokens, budget=budget)
    upstream = error.message[:300]
    return UpstreamError(400, f"{said} (the upstream said: {upstream})", "invalid_request_error",
                         code=OVERFLOW_CODE, retryable=False)


def _unavailable(error: UpstreamError, *, committed: bool, attempts: int, request_id: str,
                 outcome: RequestOutcome = RequestOutcome.UPSTREAM_ERROR) -> Answer:
    """The retryable answer when the upstream could not be reached, was too slow, or broke its stream off."""
    if error.code == "upstream_truncated":
        status, code = 502, error.code
    elif error.status == 429:
        status, code = 429, "upstream_rate_limited"
    elif error.status == 504 or error.type == "upstream_timeout":
        status, code = 504, "upstream_timeout"
    elif error.status in (503, 529):
        status, code = 503, "upstream_overloaded"
    else:
        status, code = 502, "upstream_unavailable"
    message = f"the upstream failed {attempts} time(s): {error.message}; try again later"
    if committed:
        message += f" (request id: {request_id})"
    unavailable = UpstreamError(status, message, "upstream_error", code=code, retryable=True,
                                retry_after=error.retry_after)
    kind = AnswerKind.STREAM_ERROR if committed else AnswerKind.HTTP_ERROR
    return Answer(kind, outcome, error.message, unavailable, retryable=True)


def _http_error(decision: Decision, attempts: int, *, overflow_in_stream: bool = False) -> Answer:
    error = decision.error
    if error is not None and error.status in UPSTREAM_AUTH_STATUSES:
        # Not the client's key: the upstream refused toolrelay's credential. A 401 here would send
        # the user after the wrong key (and make some clients retry).
        auth = UpstreamError(502, f"the upstream refused toolrelay's credential (HTTP {error.status}): "
                             f"{error.message}; an operator must fix the upstream's credential",
                             "upstream_error", code="upstream_auth_failed", retryable=False)
        return Answer(AnswerKind.HTTP_ERROR, RequestOutcome.UPSTREAM_ERROR, error.message, auth)
    if error is not None and error.code == OVERFLOW_CODE and error.type == "invalid_request_error":
        kind = AnswerKind.STREAM_ERROR if overflow_in_stream else AnswerKind.HTTP_ERROR
        return Answer(kind, RequestOutcome.UPSTREAM_ERROR, error.message, error)
    if error is not None and not error.retryable:
        passed = UpstreamError(error.status, f"upstream error: {error.message}", error.type, code=error.code,
                               retryable=False)
        return Answer(AnswerKind.HTTP_ERROR, RequestOutcome.UPSTREAM_ERROR, error.message, passed)
    outcome = RequestOutcome.EXHAUSTED if decision.outcome == Outcome.RETRY else RequestOutcome.UPSTREAM_ERROR
    status = error.status if error is not None and error.status in (429, 504) else 502
    reason = error.message if error is not None else decision.reason
    failed = UpstreamError(status, f"the upstream failed {attempts} time(s): {reason}", "upstream_error",
                           code="upstream_failed", retryable=False)
    return Answer(AnswerKind.HTTP_ERROR, outcome, reason, failed)


def exhaustion_message(*, attempts: int, reason: str, guarded: bool, request_id: str) -> str:
    """The text of the terminal assistant message sent when retries run out (agents do not retry it)."""
    tools = " No tool was run." if guarded else ""
    return (f"[toolrelay] The upstream model could not produce a valid answer: {attempts} attempt(s) failed "
            f"(last problem: {reason}).{tools} Please try again or rephrase. Request id: {request_id}.")
