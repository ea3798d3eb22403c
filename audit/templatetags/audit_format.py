"""Template filters and tags of the audit pages: the number formats of ``audit.formats`` and the pills' styles."""

from __future__ import annotations

from typing import Any

from django import template

from audit import formats
from audit.display import pill_css, wasted_figure

register = template.Library()


register.filter("percent", formats.percent)
register.filter("thousands", formats.thousands)
register.filter("duration", formats.duration)
register.filter("usd", formats.usd)


@register.filter
def wasted(row: Any, column: str = "wasted_completion_tokens") -> str:
    """``{{ row|wasted }}`` / ``{{ row|wasted:"wasted_prompt_tokens" }}``: the row's wasted tokens as the
    request page reads them (``audit.display.wasted_figure``: a number, ``≥ N`` or ``unknown``)."""
    return wasted_figure(row, column)


@register.simple_tag
def pill_styles() -> str:
    """The outcome / severity pills' colour classes (``audit.display.pill_css``), for a nonce'd ``<style>``."""
    return pill_css()
