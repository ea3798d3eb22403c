"""``answer_for``: the one rule for what a client gets when a request ends without a usable turn."""

from __future__ import annotations

import pytest

from proxy.guard.decisions.answer import Answer, AnswerKind, RequestOutcome, answer_for, model_failure
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from proxy.guard.policy import Exhaustion, GuardPolicy
from proxy.guard.turn import Decision, Outcome, UpstreamError

BROKEN = Decision(Outcome.RETRY, None, (Finding(FindingKind.ARGUMENTS_NOT_JSON, Severity.ERROR, Action.RETRY,
                                                 "arguments can no longer become valid JSON"),),
                  reason="arguments can no longer become valid JSON")
TIMEOUT = Decision(Outcome.UPSTREAM_ERROR, None, reason="no data",
                   error=UpstreamError(504, "no data", "upstream_timeout"))
REFUSED = Decision(Outcome.UPSTREAM_ERROR, None, reason="messages.0.content: field required",
                   error=UpstreamError(400, "messages.0.content: field required", "invalid_request_error",
                                       retryable=False))
AUTH = Decision(Outcome.UPSTREAM_ERROR, None, reason="bad key", error=UpstreamError(401, "bad key", retryable=False))
MESSAGE, ERROR = GuardPolicy(exhaustion=Exhaustion.MESSAGE), GuardPolicy(exhaustion=Exhaustion.ERROR)
FAIL = GuardPolicy()


def answer(decision: Decision, *, committed: bool = False, stream: bool = True, checked: bool = True,
           policy: GuardPolicy = MESSAGE) -> Answer:
    return answer_for(decision, committed=committed, stream=stream, checked=checked, policy=policy, attempts=3,
                      request_id="rid")


def error_of(a: Answer) -> UpstreamError:
    assert a.error is not None
    return a.error


@pytest.mark.parametrize("committed", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_it_answers_broken_model_output_with_the_terminal_message(committed: bool, stream: bool) -> None:
    """Broken output of a checked request: the exhaustion message, before or after the commit."""
    a = answer(BROKEN, committed=committed and stream, stream=stream)
    assert a.kind is AnswerKind.EXHAUSTED and a.outcome is RequestOutcome.EXHAUSTED
    assert a.reason == BROKEN.reason


def test_it_answers_a_pass_through_only_with_errors() -> None:
    """A byte-exact pass-through never gets a made-up assistant message."""
    a = answer(BROKEN, checked=False)
    assert a.kind is AnswerKind.HTTP_ERROR and error_of(a).code == "upstream_failed"
    assert a.outcome is RequestOutcome.EXHAUSTED


@pytest.mark.parametrize(("error", "status", "code"), [
    (UpstreamError(504, "no data", "upstream_timeout"), 504, "upstream_timeout"),
    (UpstreamError(429, "slow down", retry_after=7.0), 429, "upstream_rate_limited"),
    (UpstreamError(503, "busy"), 503, "upstream_overloaded"),
    (UpstreamError(500, "boom"), 502, "upstream_unavailable"),
    (UpstreamError(502, "refused", "upstream_unavailable"), 502, "upstream_unavailable"),
])
def test_it_answers_an_unreachable_or_slow_upstream_with_a_retryable_error(error: UpstreamError, status: int,
                                                                          code: str) -> None:
    """Retries spent on transport failures, 5xx, 429 or timeouts: a retryable error with the right status and
    the upstream's Retry-After, before the commit as HTTP, after it in-stream (with the request id)."""
    decision = Decision(Outcome.UPSTREAM_ERROR, None, reason=error.message, error=error)
    before = answer(decision)
    assert (before.kind, error_of(before).status, error_of(before).code) == (AnswerKind.HTTP_ERROR, status, code)
    assert before.retryable and error_of(before).retry_after == error.retry_after
    assert before.outcome is RequestOutcome.UPSTREAM_ERROR
    assert error_of(before).message == f"the upstream failed 3 time(s): {error.message}; try again later"
    after = answer(decision, committed=True)
    assert after.kind is AnswerKind.STREAM_ERROR and after.retryable and "request id: rid" in error_of(after).message
    assert answer(decision, checked=False).kind is AnswerKind.HTTP_ERROR


def test_it_passes_a_request_error_on_with_its_status() -> None:
    """A non-retryable upstream error is the client's to fix: its status and type, before or after commit."""
    before = answer(REFUSED)
    assert (before.kind, error_of(before).status, error_of(before).type) == (
        AnswerKind.HTTP_ERROR, 400, "invalid_request_error")
    after = answer(REFUSED, committed=True)
    assert after.kind is AnswerKind.STREAM_ERROR and after.error is REFUSED.error
    assert after.audit_error == "messages.0.content: field required"


def test_it_never_blames_the_clients_key_for_the_upstreams_credential() -> None:
    """An upstream 401/403/407 becomes a 502 about toolrelay's own credential."""
    a = answer(AUTH)
    assert (error_of(a).status, error_of(a).code) == (502, "upstream_auth_failed")


def test_it_follows_the_error_exhaustion_policy() -> None:
    """Exhaustion policy ``error``: an HTTP error before the commit, an in-stream error (with the request id)
    after it; non-stream requests always get the HTTP error."""
    assert answer(BROKEN, policy=ERROR).kind is AnswerKind.HTTP_ERROR
    after = answer(BROKEN, committed=True, policy=ERROR)
    assert after.kind is AnswerKind.STREAM_ERROR and "request id: rid" in error_of(after).message
    assert answer(BROKEN, stream=False, policy=ERROR).kind is AnswerKind.HTTP_ERROR


def test_it_keeps_the_terminal_message_for_broken_output_reported_in_band() -> None:
    """An in-band error chunk (C41) is broken model output, not an unreachable upstream: the message."""
    inband = Decision(Outcome.UPSTREAM_ERROR, None, (Finding(FindingKind.MID_STREAM_ERROR_CHUNK, Severity.ERROR,
                                                             Action.RETRY),), error=UpstreamError(502, "overloaded"))
    assert answer(inband, committed=True).kind is AnswerKind.EXHAUSTED
    assert answer(inband).kind is AnswerKind.EXHAUSTED


def test_it_tells_model_failures_from_transport_failures() -> None:
    """In-band upstream errors (C41) and failed generations (C47) are model failures; timeouts are not."""
    inband = Decision(Outcome.UPSTREAM_ERROR, None, (Finding(FindingKind.MID_STREAM_ERROR_CHUNK, Severity.ERROR,
                                                             Action.RETRY),), error=UpstreamError(502, "x"))
    assert model_failure(BROKEN) and model_failure(inband) and not model_failure(TIMEOUT)
    assert RequestOutcome.delivered(Decision(Outcome.REPAIRED, None), 0) is RequestOutcome.REPAIRED
    assert RequestOutcome.delivered(Decision(Outcome.CLEAN, None), 2) is RequestOutcome.RECOVERED


CUT = Decision(Outcome.RETRY, None, (Finding(FindingKind.MISSING_FINISH_REASON, Severity.ERROR, Action.RETRY,
                                              "stream ended without finish_reason and without [DONE]"),),
               reason="stream ended without finish_reason and without [DONE]")


@pytest.mark.parametrize("policy", [MESSAGE, ERROR])
@pytest.mark.parametrize(("committed", "stream", "checked"), [
    (False, True, True), (True, True, True), (False, False, True), (False, True, False), (True, True, False)])
def test_a_stream_broken_off_to_the_end_is_a_retryable_error_never_a_success(policy: GuardPolicy, committed: bool,
                                                                              stream: bool, checked: bool) -> None:
    """Retries spent on streams that ended with neither a finish reason nor [DONE]: on every path and with
    either exhaustion policy, the retryable ``upstream_truncated`` error (HTTP before the commit, in-stream
    after it), never the terminal message; the request is audited as exhausted."""
    a = answer(CUT, committed=committed, stream=stream, checked=checked, policy=policy)
    assert a.kind is (AnswerKind.STREAM_ERROR if committed else AnswerKind.HTTP_ERROR)
    assert error_of(a).code == "upstream_truncated" and error_of(a).status == 502
    assert a.retryable and error_of(a).retryable
    assert a.outcome is RequestOutcome.EXHAUSTED


def test_a_finish_decided_at_the_end_is_not_broken_off() -> None:
    """``[DONE]`` without a finish reason is normalised, not cut: broken model output keeps its answer."""
    done = Decision(Outcome.RETRY, None, (Finding(FindingKind.MISSING_FINISH_REASON, Severity.INFO,
                                                  Action.NORMALIZED, "no finish_reason; decided at the end"),
                                          *BROKEN.findings), reason=BROKEN.reason)
    assert answer(done).kind is AnswerKind.EXHAUSTED


@pytest.mark.parametrize("committed", [False, True])
def test_by_default_broken_model_output_on_a_stream_ends_in_the_terminal_error(committed: bool) -> None:
    """The default ``fail``: the protocol's non-retryable in-stream error, before the commit as after it,
    so a headless agent run fails (issue 23 item 1); the request is exhausted, not an upstream error."""
    a = answer(BROKEN, committed=committed, policy=FAIL)
    assert (a.kind, a.outcome, a.retryable) == (AnswerKind.TERMINAL, RequestOutcome.EXHAUSTED, False)
    assert a.reason == BROKEN.reason


def test_by_default_a_non_stream_request_gets_an_http_error_that_says_not_to_retry() -> None:
    a = answer(BROKEN, stream=False, policy=FAIL)
    assert a.kind is AnswerKind.HTTP_ERROR and not a.retryable
    assert error_of(a).code == "upstream_failed" and error_of(a).status == 502


def test_the_terminal_error_never_hides_an_unreachable_upstream_or_a_cut_stream() -> None:
    """``fail`` is only for broken model output: an upstream that is down stays retryable."""
    down = Decision(Outcome.UPSTREAM_ERROR, None, (), reason="connect failed",
                    error=UpstreamError(503, "overloaded", "upstream_error", retryable=True))
    a = answer(down, committed=True, policy=FAIL)
    assert a.kind is AnswerKind.STREAM_ERROR and a.retryable
