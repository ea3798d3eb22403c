"""How audit rows read in the admin: coloured outcomes and severities, durations, token counts that
say "unknown" when the upstream reported no usage, frame counts that say when they were not counted.

Everything returned is escaped markup (``format_html``) or plain text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import models
from django.db.models import Case, Exists, OuterRef, Q, When
from django.utils.html import format_html
from django.utils.safestring import SafeString

from audit.formats import duration
from audit.models import Attempt, ProxyRequest

Outcome = ProxyRequest.Outcome
#: Outcomes the "problems only" list shows: the guard repaired or retried, or the client got no
#: usable answer. ``normalized`` (upstream quirks absorbed) and cancellations by the client are routine.
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


def wasted_usage_unknown() -> Case:
    """The one rule for a request's wasted tokens (``ProxyRequest.wasted_completion_tokens``): True when one of
    its wasted attempts (every attempt but the answer's) answered 200 without reporting usage, so the figure
    counts only the others. A boolean expression on ``ProxyRequest`` rows (``filter``, ``annotate``, an
    aggregate's ``filter``): one EXISTS per row. The request page, the lists, the dashboard, the usage page
    and the CSVs all use it, through :func:`wasted_tokens`."""
    missing = Attempt.objects.filter(Q(usage_estimated=True) | Q(prompt_tokens=0, completion_tokens=0),
                                     request=OuterRef("pk"), upstream_status=200)  # estimated: not reported
    before_answer = Exists(missing.filter(number__lt=OuterRef("attempts") - 1))
    return Case(When(outcome__in=USABLE_OUTCOMES, then=before_answer), default=Exists(missing),
                output_field=models.BooleanField())


def wasted_tokens(count: int, gaps: int, *, grouped: bool = True) -> str:
    """Wasted completion tokens given ``gaps``, the requests among them whose wasted usage is unknown
    (:func:`wasted_usage_unknown`): the number when every one is known, ``≥ N`` when only ``N`` of it is,
    ``unknown`` when none is. ``grouped``: thousands separators (pages); off for CSV cells."""
    number = f"{count:,}" if grouped else str(count)
    if not gaps:
        return number
    return f"≥ {number}" if count else "unknown"


def wasted_figure(row: Mapping[str, Any], column: str = "wasted_completion_tokens", *, grouped: bool = True) -> str:
    """:func:`wasted_tokens` of a figures row (dashboard, usage page, CSVs): its ``column`` (the wasted output
    tokens, or ``wasted_prompt_tokens``) and ``wasted_unknown_requests`` (0 when the row has none)."""
    return wasted_tokens(int(row.get(column) or 0), int(row.get("wasted_unknown_requests") or 0), grouped=grouped)


def attempt_ordinal(number: int) -> int:
    """The 1-based attempt number shown everywhere (timeline, live feed, findings, fragments, CSV) from
    ``Attempt.number``, which is 0-based in call order."""
    return number + 1


def frames(attempt: Attempt) -> str:
    """The attempt's SSE frame count; ``not counted`` for bytes without a count (rows written before
    the relay counted frames)."""
    if attempt.frames == 0 and attempt.bytes_received > 0:
        return "not counted"
    return f"{attempt.frames:,}"


__all__ = ["COLOURS", "PROBLEM_OUTCOMES", "USABLE_OUTCOMES", "attempt_ordinal", "duration", "frames", "pill", "tokens",
           "usage_missing", "wasted_figure", "wasted_tokens", "wasted_usage_unknown"]
