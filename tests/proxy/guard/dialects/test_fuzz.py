"""Garbage through the scanner: it never raises, and text it does not turn into calls is never lost."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.dialects.registry import DIALECTS
from proxy.guard.findings import Action

from .test_families import TOOLS, scan

_PIECES = sorted({o for d in DIALECTS for o in d.openers} | {c for d in DIALECTS for c in (*d.closers, *d.trailers)}
                 | {"get_weather", "read_file", "(", ")", "{", "}", "[", "]", '"', "'", ":", "=", ",", "\n", " ",
                    '{"name": "get_weather", "arguments": {"city": "x"}}', "city=\"x\"", "<arg_key>", "<arg_value>",
                    "<parameter=city>", "</parameter>", "<|tool_sep|>", "✿ARGS✿", "\\", "｜", "▁", "é", "🙂"})


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES) | st.text(max_size=4), max_size=25), st.lists(st.integers(0, 400), max_size=6))
def test_it_never_raises_and_never_drops_text(pieces: list[str], cuts: list[int]) -> None:
    """Any text at any split: no exception; when nothing was recovered and nothing is retried,
    every character comes back as text, in order."""
    text = "".join(pieces)
    res = scan(text, TOOLS, sorted(c for c in cuts if c <= len(text)))
    if not res.calls and not any(f.action is Action.RETRY for f in res.findings):
        assert res.text == text
