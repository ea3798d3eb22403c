"""Recognisers whose calls are Python call syntax: ``[get_weather(city="Paris"), get_time()]``.

Used by Llama 3.2 / 4 (vLLM ``pythonic``, ``llama4_pythonic``: optional ``<|python_start|>``),
LFM2 (``<|tool_call_start|>[…]<|tool_call_end|>``), Olmo 3 (one call per line inside
``<function_calls>``, JSON ``true`` / ``null`` allowed), Gemma 3 (a ```` ```tool_code ```` fence)
and ToolACE-style fine-tunes. Values must be literals; ``ast`` reads them, nothing is evaluated.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.guard.dialects.base import Ctx, Parsed, make_call, unfence
from proxy.guard.dialects.values import py_calls
from proxy.guard.turn import ToolCall


def calls_of(text: str) -> list[ToolCall]:
    """The calls in a Python call list (raises ``MarkupError`` when it is not one)."""
    return [make_call(name, args) for name, args in py_calls(unfence(text.strip()))]


def pythonic(family: str) -> Callable[[str, Ctx], Parsed]:
    """A recogniser for blocks whose body is a Python call list."""

    def parse(body: str, ctx: Ctx) -> Parsed:
        return Parsed(family, calls_of(body))

    return parse
