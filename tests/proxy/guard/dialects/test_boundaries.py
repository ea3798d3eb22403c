"""Where markup recognition must stop: markerless families only as a whole segment, word markers
only on declared tools, unreadable blocks, unrecognised call syntax, and the stream boundaries."""

from __future__ import annotations

import json

import pytest

from proxy.guard.decisions.attempt import AttemptGuard
from proxy.guard.dialects import matcher
from proxy.guard.dialects.base import MarkupError
from proxy.guard.dialects.values import coerce, literal, py_calls
from proxy.guard.events import Done
from proxy.guard.findings import Action, FindingKind
from proxy.guard.stream.markup import MarkupScanner, extract_markup
from proxy.guard.turn import Outcome

from ..builders import POLICY, TOOLS, calls_of, choice, chunk, finish, kinds, released, run, sse, text
from .test_families import scan

K = FindingKind
T = TOOLS.tools


def names(res: object) -> list[str]:
    return [c.name for c in res.calls]


@pytest.mark.parametrize("whole", [
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '\n\n[get_weather(city="Paris"), read_file(path="a")]\n',
    'get_weather(city="Paris")',
    '```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n```',
    '{"name": "get_weather", "parameters": {"city": "Paris"}};\n{"name": "get_time", "parameters": {}}',
])
def test_it_reads_a_whole_segment_that_is_exactly_a_call_list(whole: str) -> None:
    """Llama / pythonic / xLAM: no marker, so the whole channel text must be the calls."""
    for i in range(len(whole) + 1):
        res = scan(whole, T, [i])
        assert res.text == whole[: len(whole) - len(whole.lstrip())] + whole[len(whole.rstrip()) :], i
        assert names(res)[0] == "get_weather", i
        assert [f.kind for f in res.findings] == [K.TOOL_CALL_MARKUP_IN_CONTENT]


@pytest.mark.parametrize("prose", [
    'Here it is: {"name": "get_weather", "parameters": {"city": "Paris"}}',
    '{"name": "get_weather", "parameters": {"city": "Paris"}} and then I waited.',
    '[1] A footnote, not a call.',
    '{"name": "Alice", "parameters": {"age": 3}}',
    '[get_weather(city="Paris")] is how you would call it.',
    'getting started: read the docs',
    '{"answer": 42}',
])
def test_it_leaves_call_like_text_that_is_not_the_whole_segment(prose: str) -> None:
    """Markerless syntax inside prose, naming an undeclared tool, or followed by text is text."""
    for i in range(len(prose) + 1):
        res = scan(prose, T, [i])
        assert res.text == prose and not res.calls, i
        assert all(f.kind is K.UNRECOGNIZED_MARKUP for f in res.findings)


def test_it_streams_prose_that_starts_like_a_call_quickly() -> None:
    """The markerless hold ends as soon as the start cannot be a call list."""
    scanner = MarkupScanner(0, T)
    assert scanner.feed("[").text == ""
    assert scanner.feed("1] Footnote").text == "[1] Footnote"
    scanner = MarkupScanner(0, T)
    assert scanner.feed("get").text == ""  # a declared name's prefix
    assert scanner.feed("ting there").text == "getting there"


@pytest.mark.parametrize("prose", [
    "Python's functools[1] is not a call.",
    "I will call: the function later.",
    "Send it to=someone else.",
    "Action: ```json\n{\"not\": \"a call\"}\n```",
    "```tool_code\nprint('hello')\n```",
    "functools[{\"name\": \"undeclared_tool\", \"arguments\": {}}]",
])
def test_it_keeps_word_markers_as_text_unless_they_call_a_declared_tool(prose: str) -> None:
    """Weak markers (ordinary words) need a readable call of a declared tool; else text, no retry."""
    for i in range(len(prose) + 1):
        res = scan(prose, T, [i])
        assert res.text == prose and not res.calls, i
        assert not any(f.action is Action.RETRY for f in res.findings)


def test_it_retries_an_unreadable_block_after_a_special_token() -> None:
    """A strong marker (a template token) with a body no recogniser reads: retry, never text."""
    for block in ("[TOOL_CALLS]not json at all",
                  "<|tool_calls_section_begin|><|tool_call_begin|>garbage<|tool_call_end|>",
                  "<|tools_prefix|>[{\"a\": 1, \"b\": 2}]<|tools_suffix|>", "<|START_ACTION|>oops<|END_ACTION|>"):
        res = extract_markup("x " + block + " y", T)
        assert not res.calls and [f.action for f in res.findings] == [Action.RETRY], block


def test_it_releases_implausible_bodies_after_shared_openers() -> None:
    """``<tool_call>`` in prose (a model explaining the format) is text, not a retry."""
    prose = "Wrap each call in <tool_call> tags like the docs say."
    res = extract_markup(prose, T)
    assert res.text == prose and not res.findings
    prose = "The <|channel|>analysis<|message|> header starts reasoning."
    assert extract_markup(prose, T).text == prose


def test_it_reports_unrecognized_markup_with_its_frames() -> None:
    """Call syntax naming a declared tool that no family reads: text plus a non-fatal finding."""
    body = sse(text("Calling "), text('<invoke_tool tool="get_weather">'), text('{"city": "Paris"}'),
               text("</invoke_tool>"), finish("stop"))
    d, events = run(body, step=7)
    assert d.usable and released(events) == 'Calling <invoke_tool tool="get_weather">{"city": "Paris"}</invoke_tool>'
    (f,) = [f for f in d.findings if f.kind is K.UNRECOGNIZED_MARKUP]
    assert f.action is Action.IGNORED and not f.fatal and f.frame == 1 and f.detail.endswith("frames 1")
    assert "get_weather" in f.fragment
    assert d.outcome is Outcome.NORMALIZED


def test_it_scans_reasoning_and_keeps_bytes_split_inside_multibyte_characters() -> None:
    """A Kimi K2 block in ``reasoning_content`` with non-ASCII around it, cut at every byte."""
    block = ("思考… <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
             '<|tool_call_argument_begin|>{"city": "Zürich 🌧"}<|tool_call_end|><|tool_calls_section_end|> ✓')
    body = sse(chunk(choice({"reasoning_content": block[:40]})), chunk(choice({"reasoning_content": block[40:]})),
               finish("stop"))
    for cut in range(len(body) + 1):
        guard = AttemptGuard(TOOLS, POLICY)
        events = guard.feed(body[:cut]) + guard.feed(body[cut:]) + guard.finish()
        done = events[-1]
        assert isinstance(done, Done)
        d = done.decision
        assert calls_of(d) == [("get_weather", {"city": "Zürich 🌧"})], cut
        assert released(events, 0, "reasoning") == "思考…  ✓"
        assert K.KIMI_SECTION_TOKENS_IN_CONTENT in kinds(d)


def test_it_reads_markup_in_non_stream_answers() -> None:
    """``extract_markup`` and the non-stream path see the same families (Mistral v11 here)."""
    res = extract_markup('[TOOL_CALLS]read_file[ARGS]{"path": "a"}', T)
    assert names(res) == ["read_file"] and res.text == ""


def test_the_opener_scan_is_one_pass_over_the_text() -> None:
    """``matcher.find`` skips text without an opener's first character in one search."""
    prose = "plain words and more plain words " * 50
    assert matcher.find(prose) is None
    assert matcher.find(prose + "<tool_c") == (len(prose), len(prose) + 7, None)
    hit = matcher.find(prose + "<｜tool▁calls▁begin｜>")
    assert hit is not None and hit[2] is not None and hit[2].family == "deepseek_v3"


def test_it_holds_a_trailing_word_only_at_a_word_start() -> None:
    """``functo`` may become ``functools[``; ``defuncto`` cannot."""
    assert matcher.find(" functo") == (1, 7, None)
    assert matcher.find(" defuncto") is None


def test_it_coerces_xml_values_by_the_declared_type() -> None:
    """Strings stay text; integer / number / boolean / object / array / null are parsed."""
    assert coerce("007", {"type": "string"}) == "007"
    assert coerce(" 42 ", {"type": "integer"}) == 42 and coerce("4.0", {"type": "integer"}) == 4
    assert coerce("2.5", {"type": "number"}) == 2.5 and coerce("True", {"type": "boolean"}) is True
    assert coerce('{"a": [1]}', {"type": "object"}) == {"a": [1]}
    assert coerce("{'a': None}", {"type": "object"}) == {"a": None}
    assert coerce("null", {"type": ["string", "null"]}) is None
    assert coerce("12", {"anyOf": [{"type": "integer"}, {"type": "string"}]}) == 12
    assert coerce("twelve", {"type": "integer"}) == "twelve"  # validation judges it
    assert coerce("x", None) == "x"


def test_it_reads_python_calls_without_evaluating_anything() -> None:
    """Literals only: names, attribute calls and expressions other than literals are refused."""
    assert py_calls('[f(a=1, b="x", c=[True, None], d={"k": -2.5})]') == [
        ("f", {"a": 1, "b": "x", "c": [True, None], "d": {"k": -2.5}})]
    for bad in ("[f(__import__('os').system('x'))]", "[f(a=b)]", "[f(1)]", "[f(**k)]", "[f(a=1+1)]"):
        with pytest.raises(MarkupError):
            py_calls(bad)
    assert literal("{'a': (1, 2)}") == {"a": [1, 2]}
    assert json.loads(json.dumps(literal("[true, null]"))) == [True, None]


def test_every_family_has_a_row_and_a_test_in_the_docs() -> None:
    """docs/dialects.md lists every registry family, and every tested syntax names its test."""
    from pathlib import Path

    from proxy.guard.dialects import FAMILIES

    from .render import RENDERERS

    doc = (Path(__file__).resolve().parents[4] / "docs" / "dialects.md").read_text(encoding="utf-8")
    rows = [line.split(" | ") for line in doc.splitlines() if line.startswith("| ") and line.count(" | ") >= 5]
    families = {r[0].removeprefix("| ").split(" ")[0] for r in rows}
    tests = {t.strip("` ").split(",")[0].strip("` ") for r in rows for t in [r[-1].removesuffix(" |")]}
    assert set(FAMILIES) <= families, set(FAMILIES) - families
    assert set(RENDERERS) <= tests, set(RENDERERS) - tests
