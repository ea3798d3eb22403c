"""How audit rows read in the admin: coloured outcomes and severities, durations, token counts that
say "unknown" when the upstream reported no usage, frame counts that say when they were not counted.

Everything returned is escaped markup (``format_html``) or plain text.
"""

from __future__ import annotations

from django.utils.html import format_html
from django.utils.safestring import SafeString

from audit.formats import duration
from audit.models import Attempt, ProxyRequest

Outcome = ProxyRequest.Outcome
#: Outcomes the "problems only" list shows: the guard repaired or retried, or the client got no
#: usable answer. ``normalized`` (dialect quirks absorbed) and cancellations by the client are routine.
PROBLEM_OUTCOMES = (Outcome.REPAIRED, Outcome.RECOVERED, Outcome.EXHAUSTED, Outcome.UPSTREAM_ERROR, Outcome.REJECTED)
#: Outcomes whose last attempt was the answer the client got (the others wasted every attempt).
USABLE_OUTCOMES = (Outcome.CLEAN, Outcome.NORMALIZED, Outcome.REPAIRED, Outcome.RECOVERED)

#: (text, background) per outcome; attempt outcomes use the guard's names (``retry`` ...).
COLOURS = {
    "clean": ("#14532d", "#dcfce7"), "normalized": ("#134e4a", "#ccfbf1"), "repaired": ("#1e3a8a", "#dbeafe"),
    "recovered-by-retry": ("#78350f", "#fef3c7"), "retry": ("#78350f", "#fef3c7"),
    "exhausted": ("#ffffff", "#b91c1c"), "upstream-error": ("#7f1d1d", "#fee2e2"),
    "client-cancelled": ("#374151", "#e5e7eb"),
    "interrupted": ("#374151", "#fde68a"), "rejected": ("#581c87", "#f3e8ff"), "pending": ("#374151", "#f3f4f6"),
    "error": ("#ffffff", "#b91c1c"), "warning": ("#78350f", "#fef3c7"), "info": ("#374151", "#e5e7eb"),
    "delivered": ("#14532d", "#dcfce7"), "failed": ("#7f1d1d", "#fee2e2"),
}


def _slug(value: str) -> str:
    return "".join(c if c.isalnum() or c == "-" else "-" for c in value)


def pill(value: str) -> SafeString:
    """``value`` as a small coloured label (outcomes, severities). Colours come from classes
    (``pill_css``), not inline styles: the admin's CSP allows no inline style attribute."""
    css = f"tr-pill tr-pill-{_slug(value)}" if value in COLOURS else "tr-pill"
    return format_html('<span class="{}">{}</span>', css, value)


def pill_css() -> str:
    """The pills' colour rules, one class per known value (for the admin's nonce'd stylesheet)."""
    return "\n".join(f".tr-pill-{_slug(v)} {{ color: {fg}; background: {bg}; }}" for v, (fg, bg) in COLOURS.items())


def usage_missing(attempt: Attempt) -> bool:
    """True when the upstream answered (HTTP 200) but reported no usage: its token counts are unknown,
    not zero (a real usage report always counts at least one prompt token)."""
    return attempt.upstream_status == 200 and attempt.prompt_tokens == 0 and attempt.completion_tokens == 0


def tokens(count: int, *, known: bool) -> str:
    """A token count, or ``unknown`` when the upstream did not report usage."""
    return f"{count:,}" if known else "unknown"


def wasted_tokens(count: int, gaps: int) -> str:
    """A request's wasted completion tokens given ``gaps`` wasted attempts without usage:
    ``120``, ``≥ 120`` (some unknown) or ``unknown`` (none known)."""
    if not gaps:
        return f"{count:,}"
    return f"≥ {count:,}" if count else "unknown"


def frames(attempt: Attempt) -> str:
    """The attempt's SSE frame count; ``not counted`` for bytes without a count (rows written before
    the relay counted frames)."""
    if attempt.frames == 0 and attempt.bytes_received > 0:
        return "not counted"
    return f"{attempt.frames:,}"


__all__ = ["COLOURS", "PROBLEM_OUTCOMES", "USABLE_OUTCOMES", "duration", "frames", "pill", "tokens",
           "usage_missing", "wasted_tokens"]
