"""Number formats for the dashboard and the HTML report."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def percent(value: float | None) -> str:
    """0.1234 -> ``12.3%``."""
    return "–" if value is None else f"{float(value) * 100:.1f}%"


@register.filter
def thousands(value: float | int | None) -> str:
    """12345 -> ``12,345``; floats keep up to three decimals."""
    if value is None:
        return "–"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{float(value):,.3f}".rstrip("0").rstrip(".")


@register.filter
def duration(ms: float | None) -> str:
    """Milliseconds for people: ``12.3 ms`` (at most one decimal) below a second, then ``1.23 s``,
    ``12.3 s``, ``123 s``; ``–`` when unknown."""
    if ms is None:
        return "–"
    value = float(ms)
    if abs(value) < 1000:
        return f"{value:.1f}".rstrip("0").rstrip(".") + " ms"
    seconds = value / 1000
    if abs(seconds) < 10:
        return f"{seconds:.2f} s"
    return f"{seconds:.1f} s" if abs(seconds) < 100 else f"{seconds:.0f} s"


@register.simple_tag
def pill_styles() -> str:
    """The outcome / severity pills' colour classes (``audit.display.pill_css``), for a nonce'd ``<style>``."""
    from audit.display import pill_css

    return pill_css()
