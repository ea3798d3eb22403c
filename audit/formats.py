"""Number formats for people (the dashboard, the admin lists, the HTML report): pure functions of a value."""

from __future__ import annotations


def percent(value: float | None) -> str:
    """0.1234 -> ``12.3%``."""
    return "–" if value is None else f"{float(value) * 100:.1f}%"


def thousands(value: float | int | None) -> str:
    """12345 -> ``12,345``; floats keep up to three decimals."""
    if value is None:
        return "–"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{float(value):,.3f}".rstrip("0").rstrip(".")


def usd(value: float | int | None) -> str:
    """USD for people: ``$12.34`` from a cent up, ``$0.000025`` below (six decimals), ``–`` when unknown."""
    if value is None:
        return "–"
    amount = float(value)
    if amount >= 0.01 or amount == 0:
        return f"${amount:,.2f}"
    return f"${amount:.6f}".rstrip("0").rstrip(".") if amount >= 0.000001 else "<$0.000001"


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
