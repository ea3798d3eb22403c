"""Template filters and tags of the audit pages: the number formats of ``audit.formats`` and the pills' styles."""

from __future__ import annotations

from django import template

from audit import formats
from audit.display import pill_css

register = template.Library()


register.filter("percent", formats.percent)
register.filter("thousands", formats.thousands)
register.filter("duration", formats.duration)


@register.simple_tag
def pill_styles() -> str:
    """The outcome / severity pills' colour classes (``audit.display.pill_css``), for a nonce'd ``<style>``."""
    return pill_css()
