"""A request's page parts: its attempts as a timeline, and what the client received at the end.

Attempts run one after another (``Attempt.number`` in call order), so each bar starts where the
previous one ended; the space between bars and the request's total is backoff and toolrelay's own
time. Everything is escaped through ``format_html``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from audit.delivered import TEXT_CAP
from audit.display import attempt_ordinal, duration, frames, pill, tokens, usage_missing
from audit.models import Attempt, ProxyRequest
from proxy.guard.decisions.loops import STUCK_PREFIX

#: Bar fill per attempt outcome (strong colours: the pills' backgrounds are too pale for a bar).
BAR_COLOURS = {"clean": "#16a34a", "normalized": "#0d9488", "repaired": "#2563eb", "retry": "#d97706",
               "upstream-error": "#dc2626"}
# The bar is an SVG rect: position, size and colour are attributes, not inline styles (the admin's
# CSP allows none).
_ROW = ('<div class="tr-tl-row"><div class="tr-tl-label">{}</div>'
        '<svg class="tr-tl-track" viewBox="0 0 100 14" preserveAspectRatio="none" role="img">'
        '<rect x="{}" width="{}" height="14" rx="1" fill="{}"><title>{}</title></rect></svg>'
        '<div class="tr-tl-facts">{}</div></div>')


def _facts(attempt: Attempt, body_url: str | None) -> SafeString:
    known = not usage_missing(attempt)
    parts = [
        format_html("HTTP {}", attempt.upstream_status if attempt.upstream_status is not None else "–"),
        format_html("{} (first byte {})", duration(attempt.duration_ms), duration(attempt.ttfb_ms)),
        format_html("{} frames · {} bytes", frames(attempt), f"{attempt.bytes_received:,}"),
        format_html("tokens {} in / {} out", tokens(attempt.prompt_tokens, known=known),
                    tokens(attempt.completion_tokens, known=known)),
    ]
    if body_url:
        parts.append(format_html('<a href="{}">raw body</a>', body_url))
    facts = format_html_join(" · ", "{}", ((p,) for p in parts))
    if attempt.abort_reason:
        return format_html('{}<div class="tr-tl-why">{}</div>', facts, attempt.abort_reason)
    return facts


def render_timeline(request: ProxyRequest, attempts: Sequence[Attempt], bodies: Mapping[int, int]) -> SafeString:
    """One row per attempt: label, a bar placed on the request's time axis, the facts.

    ``bodies`` maps attempt ids to the id of their stored raw body (``Fragment``), if any.
    """
    if not attempts:
        return mark_safe('<p class="tr-muted">No upstream attempt (refused before any upstream call).</p>')
    spent = sum(a.duration_ms or 0.0 for a in attempts)
    total = max(request.total_ms or 0.0, spent, 1.0)
    rows, start = [], 0.0
    for attempt in attempts:
        length = attempt.duration_ms or 0.0
        colour = BAR_COLOURS.get(attempt.outcome, "#9ca3af")
        upstream = attempt.upstream.name if attempt.upstream is not None else "–"
        label = format_html("#{} {} {}", attempt_ordinal(attempt.number), upstream, pill(attempt.outcome))
        body = bodies.get(attempt.pk)
        url = reverse("admin:audit_fragment_change", args=[body]) if body is not None else None
        left, width = f"{100 * start / total:.2f}", f"{max(100 * length / total, 0.4):.2f}"
        rows.append(format_html(_ROW, label, left, width, colour,
                                f"attempt {attempt_ordinal(attempt.number)}: {duration(length)}", _facts(attempt, url)))
        start += length
    axis = format_html('<div class="tr-tl-axis">0 – {} total · time to first byte to the client {}</div>',
                       duration(request.total_ms), duration(request.ttft_ms))
    return format_html('<div class="tr-tl">{}{}</div>', mark_safe("".join(rows)), axis)  # noqa: S308 - escaped rows


def _pre(text: str | None, chars: int) -> SafeString:
    if text is None:
        return format_html('<span class="tr-muted">not kept ({} characters; tenant policy keeps no content)</span>',
                           chars)
    more = f"(capped: {chars:,} characters in all)" if chars > TEXT_CAP else ""
    return format_html('<pre class="tr-pre">{}</pre>{}', text, more)


def _choice(choice: Mapping[str, Any]) -> SafeString:
    calls = format_html_join("", "<li><code>{}</code> {}</li>", (
        (c.get("name", ""), _pre(c.get("arguments"), int(c.get("arguments_chars") or 0)))
        for c in choice.get("tool_calls") or []))
    text = _pre(choice.get("text"), int(choice.get("text_chars") or 0)) if choice.get("text_chars") else \
        mark_safe('<span class="tr-muted">no text</span>')
    reasoning = f" · {choice['reasoning_chars']:,} reasoning characters" if choice.get("reasoning_chars") else ""
    return format_html('<div class="tr-delivered"><div>choice {} · finish reason <code>{}</code>'
                       "{}</div>{}<ul>{}</ul></div>", choice.get("index", 0), choice.get("finish_reason") or "none",
                       reasoning, text, calls)


def render_delivered(request: ProxyRequest) -> SafeString:
    """What the client got at the end: the turn, the exhaustion answer or the error (``ProxyRequest.delivered``)."""
    value = request.delivered
    if not isinstance(value, dict):
        note = f" The request's recorded error: {request.error}" if request.error else ""
        return format_html('<p class="tr-muted">Not recorded for this request.{}</p>', note)
    if value.get("kind") == "exhausted":
        what = "an in-stream error" if value.get("as_error") else "a terminal assistant message"
        message = str(value.get("message") or "")
        # The loop breaker's answer is delivered the way an exhaustion answer is (proxy/policy/loop_breaker.py).
        why = ("The loop breaker stopped the agent (see the agent-loop finding)"
               if message.startswith(STUCK_PREFIX) else "Retries ran out")
        return format_html("<p>{}; the client got {}:</p>{}", why, what, _pre(message, len(message)))
    if value.get("kind") == "error":
        return format_html("<p>An error, HTTP {}:</p>{}", value.get("status", "–"),
                           _pre(value.get("message"), len(value.get("message") or "")))
    return format_html_join("", "{}", ((_choice(c),) for c in value.get("choices") or []))
