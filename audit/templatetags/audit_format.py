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
