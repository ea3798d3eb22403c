"""Upstream error classification (``proxy.guard.stream.errors``): in-band objects and HTTP answers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.guard.findings import Action, FindingKind, Severity
from proxy.guard.stream.errors import classify_inband_error, http_error_decision, retry_after_seconds
from proxy.guard.turn import Outcome


def test_it_retries_a_mid_stream_server_error_c41() -> None:
    """C41: OpenRouter's ``{"code":"server_error",…}`` after a provider disconnect is transient, 502."""
    err = classify_inband_error({"code": "server_error", "message": "Provider disconnected unexpectedly"})
    assert err.retryable is True
    assert err.status == 502
    assert err.code == "server_error"
    assert err.message == "Provider disconnected unexpectedly"


def test_it_passes_a_context_overflow_to_the_client_c43() -> None:
    """C43: llama.cpp's ``error:`` field with code 400 / invalid_request_error is not retryable."""
    err = classify_inband_error({"code": 400, "message": "the request exceeds the available context size",
                                 "type": "invalid_request_error"})
    assert err.retryable is False
    assert err.status == 400
    assert err.type == "invalid_request_error"
    assert err.code == "400"


@pytest.mark.parametrize(
    ("obj", "retryable", "status"),
    [
        ({"type": "overloaded_error", "message": "Overloaded"}, True, 502),
        ({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, True, 502),
        ({"type": "rate_limit_exceeded", "message": "slow down"}, True, 502),
        ({"code": 429, "message": "too many"}, True, 429),
        ({"code": 503, "message": "unavailable"}, True, 503),
        ({"code": "503", "message": "unavailable"}, True, 503),
        ({"code": "context_length_exceeded", "message": "too long"}, False, 400),
        ({"type": "content_policy_violation", "message": "no"}, False, 400),
        ({"type": "authentication_error", "message": "bad key"}, False, 400),
        ({"code": 401, "message": "bad key"}, False, 401),
        ({"message": "maximum context length is 8192 tokens"}, False, 400),
        ({"code": "tool_use_failed", "type": "invalid_request_error", "message": "x"}, True, 502),
        ({"error": {"error": {"message": "deep", "code": 500}}}, True, 500),
        ({}, True, 502),
    ],
)
def test_it_classifies_inband_error_shapes(obj: dict[str, object], retryable: bool, status: int) -> None:
    """Server, overload and rate-limit errors retry; request errors do not; HTTP codes are the status."""
    err = classify_inband_error(obj)
    assert (err.retryable, err.status) == (retryable, status)


def test_it_reads_a_plain_string_or_json_text_error() -> None:
    """A bare string is the message (unknown, so transient); JSON text is parsed first."""
    assert classify_inband_error("Provider returned error").message == "Provider returned error"
    assert classify_inband_error("Provider returned error").retryable is True
    nested = classify_inband_error('{"message":"ctx","type":"invalid_request_error"}')
    assert (nested.message, nested.retryable) == ("ctx", False)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20))
def test_it_never_raises_on_any_inband_shape(obj: object) -> None:
    """Any JSON-like value yields an UpstreamError with a status in the HTTP error range."""
    err = classify_inband_error(obj)
    assert 400 <= err.status <= 599
    assert isinstance(err.message, str)


_TOOL_USE_FAILED = json.dumps({"error": {
    "message": "Failed to call a function. See 'failed_generation' for more details.",
    "type": "invalid_request_error", "code": "tool_use_failed",
    "failed_generation": '<function=get_weather{"city": "Paris"}</function>'}}).encode()


def test_it_retries_a_400_tool_use_failed_c47() -> None:
    """C47: Groq's 400 ``tool_use_failed`` is a failed generation: retry (PRE_STREAM_TOOL_USE_FAILED)."""
    decision = http_error_decision(400, _TOOL_USE_FAILED, {"content-type": "application/json"})
    assert decision.outcome is Outcome.UPSTREAM_ERROR
    assert decision.turn is None
    assert decision.error is not None and decision.error.retryable is True
    assert decision.error.status == 400
    assert decision.error.code == "tool_use_failed"
    (finding,) = decision.findings
    assert finding.kind is FindingKind.PRE_STREAM_TOOL_USE_FAILED
    assert finding.action is Action.RETRY
    assert finding.severity is Severity.ERROR
    assert "failed_generation" in finding.fragment


@pytest.mark.parametrize(("status", "retryable"),
                         [(408, True), (409, True), (429, True), (500, True), (502, True), (529, True),
                          (400, False), (401, False), (403, False), (404, False), (422, False)])
def test_it_decides_retry_by_status(status: int, retryable: bool) -> None:
    """408, 409, 429 and 5xx retry (as openai-python does); other 4xx are UPSTREAM_HTTP_ERROR errors."""
    body = json.dumps({"error": {"message": "nope", "type": "invalid_request_error"}}).encode()
    decision = http_error_decision(status, body, {})
    assert decision.error is not None
    assert decision.error.retryable is retryable
    assert decision.error.message == "nope"
    (finding,) = decision.findings
    assert finding.kind is FindingKind.UPSTREAM_HTTP_ERROR
    assert finding.action is (Action.RETRY if retryable else Action.ERROR)
    assert decision.reason == finding.detail


@pytest.mark.parametrize("body", [b"", b"<html><body>502 Bad Gateway</body></html>", b"\xff\xfe\x00garbage",
                                  b"{not json", b"[1,2]", b'"just a string"', b"null", b'{"error": 5}'])
def test_it_never_raises_on_garbage_bodies(body: bytes) -> None:
    """HTML, empty, invalid UTF-8 and odd JSON bodies still give a well-formed error decision."""
    decision = http_error_decision(503, body, {})
    assert decision.error is not None
    assert decision.error.retryable is True
    assert decision.error.status == 503
    assert decision.error.message


def test_it_keeps_the_first_line_of_an_html_body_as_message() -> None:
    """A gateway's HTML page becomes a short message that names the status."""
    decision = http_error_decision(502, b"<html>Bad Gateway</html>\n<p>x</p>", {})
    assert decision.error is not None
    assert decision.error.message == "upstream HTTP 502: <html>Bad Gateway</html>"
    assert decision.error.type == "upstream_error"


def test_it_reads_retry_after_seconds_and_ms() -> None:
    """``retry-after-ms`` wins over ``Retry-After``; names are case-insensitive."""
    assert retry_after_seconds({"Retry-After": "7"}) == 7.0
    assert retry_after_seconds({"retry-after": "1.5"}) == 1.5
    assert retry_after_seconds({"Retry-After": "7", "Retry-After-Ms": "250"}) == 0.25
    decision = http_error_decision(429, b"{}", {"Retry-After": "3"})
    assert decision.error is not None and decision.error.retry_after == 3.0


def test_it_reads_retry_after_as_an_http_date() -> None:
    """An HTTP date gives the seconds until then from ``now`` (0 when past)."""
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert retry_after_seconds({"Retry-After": "Wed, 21 Oct 2015 07:28:30 GMT"}, now=now) == 30.0
    assert retry_after_seconds({"Retry-After": "Wed, 21 Oct 2015 07:00:00 GMT"}, now=now) == 0.0


@pytest.mark.parametrize("value", ["soon", "-5", "nan", "inf", "", "99999999"])
def test_it_ignores_unusable_retry_after_values(value: str) -> None:
    """Garbage, negative, non-finite and absurd values give no retry_after."""
    assert retry_after_seconds({"Retry-After": value}) is None
