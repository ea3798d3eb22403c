"""Upstream error classification: in-band error objects and non-200 HTTP answers.

Pure functions over dicts and bytes; they never raise, whatever the upstream sent. The retry rules
follow openai-python's own (PROTOCOLS.md 1.6: retry 408, 409, 429, >=500) plus one exception from
the fault corpus: a 400 that reports a failed model generation (Groq ``tool_use_failed``, C47) is a
model-output failure, so asking again can succeed.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from proxy.guard.findings import Action, Finding, FindingKind, Severity, cap_fragment
from proxy.guard.stream.overflow import read_overflow
from proxy.guard.turn import Decision, Outcome, UpstreamError

#: Error ``type`` / ``code`` strings that mean "the request itself is wrong": retrying cannot help.
_REQUEST_ERROR_MARKERS = (
    "invalid_request",
    "context_length",
    "context_window",
    "content_policy",
    "content_filter",
    "authentication",
    "permission",
    "not_found",
    "invalid_api_key",
    "insufficient_quota",
    "billing",
)
#: Message phrases of request errors that arrive with no usable type (llama.cpp context overflow, C43).
_REQUEST_ERROR_PHRASES = ("context size", "context length", "maximum context", "too many tokens")
#: Codes / keys that mark a failed model generation reported as a request error (C47).
_GENERATION_FAILED_CODES = frozenset({"tool_use_failed", "json_validate_failed", "output_parse_failed"})
_RETRYABLE_STATUSES = frozenset({408, 409, 429})
_MESSAGE_CAP = 1000
_NEST_LIMIT = 4
#: Retry-After values above this many seconds are ignored (openai-python stops honouring them at 120 s).
_RETRY_AFTER_CAP = 24 * 3600.0


def classify_inband_error(obj: Any) -> UpstreamError:
    """Classify an in-band upstream error object into an ``UpstreamError``.

    ``obj`` is the value of a chunk's top-level ``"error"`` key (OpenRouter, C41) or the parsed
    payload of a non-standard ``error:`` SSE field (llama.cpp, C43). Any shape is tolerated: a string
    (JSON text or a plain message), a dict with ``message``/``type``/``code`` (int or str), or one
    wrapped in further ``error`` keys (Anthropic's ``{"type":"error","error":{…}}``).

    ``retryable`` is False for request errors (``invalid_request_error``, context length, content
    policy, auth, quota) and True otherwise (server, overload, rate limit, unknown). ``status`` is
    ``code`` when that is an HTTP status int, else 502 (retryable) or 400 (request error).
    """
    err = _unwrap(obj)
    message = _message_of(err) + _window_figures(err)
    type_ = _str_field(err, "type") or "upstream_error"
    raw_code = err.get("code")
    http = _http_status(raw_code) or _http_status(err.get("status"))
    retryable = _inband_retryable(err, message, http) and not _overflow(err, message)
    if not retryable and http is not None and http >= 500:
        http = 400
    status = http if http is not None else (502 if retryable else 400)
    return UpstreamError(status=status, message=message, type=type_, code=_code_text(raw_code),
                         retryable=retryable)


def http_error_decision(status: int, body: bytes, headers: Mapping[str, str], *,
                        now: float | None = None) -> Decision:
    """Decide what a non-200 upstream HTTP answer means for the attempt.

    Retryable: 408, 409, 429, 5xx, and 4xx bodies reporting a failed model generation
    (``code: tool_use_failed`` or a ``failed_generation`` field, Groq, C47; finding kind
    ``PRE_STREAM_TOOL_USE_FAILED``). Other statuses are request errors for the client (finding kind
    ``UPSTREAM_HTTP_ERROR``, action ``ERROR``). ``Retry-After`` (seconds or HTTP date, RFC 9110
    10.2.3) and ``retry-after-ms`` (OpenAI) go to ``UpstreamError.retry_after`` in seconds; ``now``
    (unix seconds, default the clock) resolves HTTP dates. Never raises on garbage bodies.
    """
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes | bytearray) else ""
    err = _body_error(text)
    generation_failed = _generation_failed(err)
    message = _message_of(err) + _window_figures(err) if err else _text_message(text, status)
    overflow = _overflow(err, message)
    retryable = (status in _RETRYABLE_STATUSES or status >= 500 or generation_failed) and not overflow
    error = UpstreamError(
        status=400 if overflow else status if 400 <= status <= 599 else 502,
        message=message,
        type=_str_field(err, "type") or _default_type(status),
        code=_code_text(err.get("code")),
        retryable=retryable,
        retry_after=retry_after_seconds(headers, now=now),
    )
    finding = _http_finding(status, error, generation_failed, text)
    return Decision(outcome=Outcome.UPSTREAM_ERROR, turn=None, findings=(finding,),
                    reason=finding.detail, error=error)


def retry_after_seconds(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (case-insensitive names), or None.

    ``retry-after-ms`` wins (openai-python reads it first, ``_base_client.py``); ``Retry-After`` is
    delta-seconds or an HTTP date. Negative, non-finite or absurd (> one day) values are ignored.
    """
    lowered = {str(k).lower(): v for k, v in _items(headers)}
    ms = _number(lowered.get("retry-after-ms"))
    if ms is not None:
        return _sane(ms / 1000.0)
    raw = lowered.get("retry-after")
    seconds = _number(raw)
    if seconds is None and isinstance(raw, str):
        seconds = _date_delay(raw, time.time() if now is None else now)
    return _sane(seconds)


def _items(headers: Any) -> list[tuple[Any, Any]]:
    """The header pairs of a mapping, or nothing for anything else."""
    try:
        return list(headers.items())
    except (AttributeError, TypeError):
        return []


def _number(raw: Any) -> float | None:
    """``raw`` as a float when it is a plain decimal number text, else None."""
    if not isinstance(raw, str):
        return None
    try:
        return float(raw.strip())
    except ValueError:
        return None


def _date_delay(raw: str, now: float) -> float | None:
    """Seconds from ``now`` until the HTTP date ``raw`` (0 when past), or None if it is not a date."""
    try:
        when = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; parsedate gives naive for "-0000"
        return None
    return max(0.0, when.timestamp() - now)


def _sane(seconds: float | None) -> float | None:
    """``seconds`` when finite and within ``[0, _RETRY_AFTER_CAP]``, else None."""
    if seconds is None or not math.isfinite(seconds) or not 0 <= seconds <= _RETRY_AFTER_CAP:
        return None
    return seconds


def _unwrap(obj: Any) -> dict[str, Any]:
    """Peel ``{"error": …}`` wrappers and JSON text down to the innermost error dict."""
    for _ in range(_NEST_LIMIT):
        if isinstance(obj, str | bytes):
            obj = _loads(obj) if _looks_like_json(obj) else {"message": _as_text(obj)}
        if not isinstance(obj, dict):
            return {"message": _as_text(obj)} if obj is not None else {}
        inner = obj.get("error")
        if isinstance(inner, dict) or (isinstance(inner, str) and _looks_like_json(inner)):
            obj = inner
            continue
        return obj
    return obj if isinstance(obj, dict) else {}


def _looks_like_json(raw: str | bytes) -> bool:
    """True when ``raw`` starts like a JSON object."""
    return raw.strip()[:1] in ("{", b"{")


def _loads(raw: str | bytes) -> Any:
    """Parse JSON, returning the text itself as the message when it does not parse."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return {"message": _as_text(raw)}


def _as_text(value: Any) -> str:
    """A short printable text for any value."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = value if isinstance(value, str) else repr(value)
    return text[:_MESSAGE_CAP]


def _message_of(err: dict[str, Any]) -> str:
    """The human message of an error dict (``message``/``detail``/``msg``/``error`` text)."""
    for key in ("message", "detail", "msg", "error", "error_message"):
        value = err.get(key)
        if isinstance(value, str) and value.strip():
            return value[:_MESSAGE_CAP]
    return "upstream error" if not err else _as_text(json.dumps(err, default=str)[:_MESSAGE_CAP])


def _str_field(err: dict[str, Any], key: str) -> str | None:
    """``err[key]`` when it is a non-empty string."""
    value = err.get(key)
    return value if isinstance(value, str) and value else None


def _code_text(code: Any) -> str | None:
    """The error code as text (ints included); None when absent or blank."""
    if isinstance(code, bool) or code is None:
        return None
    if isinstance(code, int | str):
        return str(code) or None
    return None


def _http_status(value: Any) -> int | None:
    """``value`` as an HTTP error status (400-599) when it is one (int or digit string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isdigit() and len(value) == 3:
        value = int(value)
    return value if isinstance(value, int) and 400 <= value <= 599 else None


def _inband_retryable(err: dict[str, Any], message: str, http: int | None) -> bool:
    """True unless the error is a request error (see ``classify_inband_error``)."""
    if _generation_failed(err):
        return True
    if http is not None:
        return http in _RETRYABLE_STATUSES or http >= 500
    markers = " ".join(str(err.get(k) or "") for k in ("type", "code")).lower()
    if any(m in markers for m in _REQUEST_ERROR_MARKERS):
        return False
    return not any(p in message.lower() for p in _REQUEST_ERROR_PHRASES)


def _overflow(err: dict[str, Any], message: str) -> bool:
    """True when the error reports a context-window overflow, whatever its status: llama.cpp's server
    answers one with HTTP 500 and ``type: exceed_context_size_error`` (ggml-org/llama.cpp#15780), and
    asking again with the same request cannot succeed."""
    markers = f"{err.get('type') or ''} {err.get('code') or ''}".lower()
    return "exceed_context_size" in markers or "context_length_exceeded" in markers \
        or read_overflow(message) is not None


def _window_figures(err: dict[str, Any]) -> str:
    """llama.cpp's figures of an overflow, ``n_prompt_tokens`` and ``n_ctx`` (ints beside its message,
    ggml-org/llama.cpp#15780), said in the message so ``read_overflow`` reads them; else empty."""
    prompt, window = err.get("n_prompt_tokens"), err.get("n_ctx")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 10**12 for v in (prompt, window)):
        return ""
    return f" (n_prompt_tokens={prompt}, n_ctx={window})"


def _generation_failed(err: dict[str, Any]) -> bool:
    """True when the error reports a failed model generation (Groq ``tool_use_failed``, C47)."""
    return "failed_generation" in err or str(err.get("code") or "") in _GENERATION_FAILED_CODES


def _body_error(text: str) -> dict[str, Any]:
    """The error dict of an HTTP error body, or {} for non-JSON (HTML, empty, plain text)."""
    if not _looks_like_json(text):
        return {}
    parsed = _loads(text)
    if not isinstance(parsed, dict) or ("error" not in parsed and "message" not in parsed):
        return {}
    return _unwrap(parsed)


def _text_message(text: str, status: int) -> str:
    """A message for a non-JSON body: its first line, or the bare status."""
    first = text.strip().splitlines()[0].strip() if text.strip() else ""
    return f"upstream HTTP {status}" + (f": {first[:200]}" if first else "")


def _default_type(status: int) -> str:
    """An OpenAI-style error type for a status without a typed body."""
    if status == 429:
        return "rate_limit_error"
    return "upstream_error" if status >= 500 or status < 400 else "invalid_request_error"


def _http_finding(status: int, error: UpstreamError, generation_failed: bool, text: str) -> Finding:
    """The one finding of an HTTP error answer."""
    kind = FindingKind.PRE_STREAM_TOOL_USE_FAILED if generation_failed else FindingKind.UPSTREAM_HTTP_ERROR
    return Finding(
        kind=kind,
        severity=Severity.ERROR,
        action=Action.RETRY if error.retryable else Action.ERROR,
        detail=_http_detail(status, error.message),
        fragment=cap_fragment(text),
    )


def _http_detail(status: int, message: str) -> str:
    """The finding sentence: the message, prefixed with the status unless it already says it."""
    prefix = f"upstream HTTP {status}"
    return message if message.startswith(prefix) else f"{prefix}: {message}"
