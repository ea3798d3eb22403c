"""Tool calls leaked into text as model markup (fault family C, C26-C31, and ``<function=…>``)."""

from __future__ import annotations

import json

import pytest

from proxy.guard.events import Abort
from proxy.guard.findings import Action, FindingKind
from proxy.guard.policy import GuardPolicy, Repair
from proxy.guard.stream.markup import MarkupScanner, ScanResult, extract_markup
from proxy.guard.turn import Outcome, RequestSpec, ToolSpec

from .builders import TOOLS, calls_of, choice, chunk, finish, kinds, released, run, sse, text

K = FindingKind
HERMES = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def scan_pieces(pieces: list[str], tools: tuple[ToolSpec, ...] = TOOLS.tools,
                allow: bool = True) -> tuple[list[str], ScanResult]:
    """Feed ``pieces``; return what each feed released and the merged result (finish included)."""
    scanner = MarkupScanner(0, tools, allow=allow)
    total = ScanResult()
    releases = []
    for p in pieces:
        r = scanner.feed(p)
        releases.append(r.text)
        total.text += r.text
        total.calls += r.calls
        total.findings += r.findings
    end = scanner.finish()
    releases.append(end.text)
    return releases, ScanResult(total.text + end.text, total.calls + end.calls, total.findings + end.findings)


def parsed(result: ScanResult) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in result.calls]


def test_it_extracts_hermes_blocks_at_every_split() -> None:
    """C26 with text around the block: same text and call wherever the text is cut."""
    whole = "Checking. " + HERMES + " Done."
    for i in range(len(whole) + 1):
        _, res = scan_pieces([whole[:i], whole[i:]])
        assert res.text == "Checking.  Done."
        assert parsed(res) == [("get_weather", {"city": "Paris"})], i
        assert [f.kind for f in res.findings] == [K.HERMES_TOOL_CALL_TAGS_IN_CONTENT]
        assert res.findings[0].action is Action.REPAIRED


def test_it_holds_only_a_possible_marker_start() -> None:
    """Plain text goes out at once; ``<`` waits only while it can still start a marker."""
    releases, res = scan_pieces(["a < b", " <t", "ool", "box> x", "<", "p>"])
    assert releases == ["a < b", " ", "", "<toolbox> x", "", "<p>", ""]
    assert res.text == "a < b <toolbox> x<p>" and not res.calls


def test_it_releases_a_held_tail_at_the_end() -> None:
    """A dangling possible marker start is text when the channel ends."""
    releases, res = scan_pieces(["see <minimax:tool"])
    assert releases == ["see ", "<minimax:tool"] and not res.findings


def test_it_streams_plain_text_with_a_bounded_delay() -> None:
    """Per-character feeding of prose with many ``<`` holds back a few characters at most."""
    prose = "if a<b and c <= d then <x> <tool or <|x| done " * 3
    scanner = MarkupScanner(0, TOOLS.tools)
    out = ""
    for i, ch in enumerate(prose):
        out += scanner.feed(ch).text
        assert len(prose[: i + 1]) - len(out) <= 30
    assert out + scanner.finish().text == prose


@pytest.mark.parametrize("bar,space", [("｜", "▁"), ("|", "_"), ("｜", "_"), ("|", "▁")])
def test_it_extracts_deepseek_tokens_in_every_spelling(bar: str, space: str) -> None:
    """C27: ``｜``/``|`` and ``▁``/``_`` variants; two calls, fenced and V3.1 unfenced shapes."""
    def tok(name: str) -> str:
        return f"<{bar}{name.replace('_', space)}{bar}>"

    block = (tok("tool_calls_begin") + tok("tool_call_begin") + "function" + tok("tool_sep") + "get_weather\n"
             + '```json\n{"city":"Oslo"}\n```' + tok("tool_call_end") + tok("tool_call_begin") + "read_file"
             + tok("tool_sep") + '{"path":"a▁b"}' + tok("tool_call_end") + tok("tool_calls_end"))
    _, res = scan_pieces([block[:17], block[17:60], block[60:]])
    assert parsed(res) == [("get_weather", {"city": "Oslo"}), ("read_file", {"path": "a▁b"})]
    assert res.text == "" and res.findings[0].kind is K.DEEPSEEK_SPECIAL_TOKENS_IN_CONTENT


def test_it_extracts_deepseek_dsml_residue() -> None:
    """C27 family: DeepSeek DSML ``<｜DSML｜invoke>`` with ``string`` attributes."""
    block = ('<｜DSML｜function_calls>\n<｜DSML｜invoke name="write_file">\n'
             '<｜DSML｜parameter name="path" string="true">007</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="n" string="false">7</｜DSML｜parameter>\n'
             '</｜DSML｜invoke>\n</｜DSML｜function_calls>')
    _, res = scan_pieces(["x", block])
    assert res.text == "x" and parsed(res) == [("write_file", {"path": "007", "n": 7})]


def test_it_extracts_kimi_sections_and_bare_calls() -> None:
    """C29: two calls in a section (``functions.<name>:<n>`` ids), and a bare call without section."""
    section = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               '<|tool_call_argument_begin|>{"city": "Rome"}<|tool_call_end|>'
               "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
               "<|tool_calls_section_end|>")
    _, res = scan_pieces([section[i : i + 5] for i in range(0, len(section), 5)])
    assert parsed(res) == [("get_weather", {"city": "Rome"}), ("get_time", {})]
    assert res.findings[0].kind is K.KIMI_SECTION_TOKENS_IN_CONTENT
    bare = '<|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{}<|tool_call_end|>'
    res = extract_markup("a" + bare + "b", TOOLS.tools)
    assert res.text == "ab" and parsed(res) == [("get_time", {})]
    assert res.findings[0].kind is K.KIMI_SECTION_TOKENS_IN_CONTENT


def test_it_types_minimax_parameters_by_schema() -> None:
    """C31: integer parameters parsed, string parameters kept as text even when they look numeric."""
    block = ('<minimax:tool_call>\n<invoke name="write_file">\n<parameter name="path">42</parameter>\n'
             '<parameter name="n">3</parameter>\n<parameter name="content">\nline\n</parameter>\n</invoke>\n'
             '<invoke name="get_time">\n</invoke>\n</minimax:tool_call>')
    res = extract_markup(block, TOOLS.tools)
    assert parsed(res) == [("write_file", {"path": "42", "n": 3, "content": "line"}), ("get_time", {})]


def test_it_extracts_function_tag_forms() -> None:
    """``<function=name>{…}</function>``, Groq's ``<function=name{…}</function>``, parameter tags."""
    forms = [
        '<function=get_weather>{"city": "Paris"}</function>',
        '<function=get_weather{"city": "Paris"}</function>',
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    ]
    for form in forms:
        res = extract_markup(form, TOOLS.tools)
        assert parsed(res) == [("get_weather", {"city": "Paris"})], form
    assert extract_markup(forms[0], TOOLS.tools).findings[0].kind is K.FUNCTION_TAG_MARKUP_IN_CONTENT


def test_it_reports_unparseable_blocks_as_retries() -> None:
    """An unreadable block is a retry finding (and no call); prose after it is still released."""
    res = extract_markup("<tool_call>{not json</tool_call> after", TOOLS.tools)
    assert not res.calls and res.text == " after"
    assert [(f.kind, f.action) for f in res.findings] == [(K.LEAKED_MARKUP_UNPARSEABLE, Action.RETRY)]


def test_it_reads_an_unclosed_block_at_the_end_only_when_complete() -> None:
    """A closer eaten by the stop token: a complete block is recovered, a cut one is a retry."""
    res = extract_markup('<tool_call>{"name":"get_time","arguments":{}}', TOOLS.tools)
    assert parsed(res) == [("get_time", {})]
    res = extract_markup('<tool_call>{"name":"get_time","argu', TOOLS.tools)
    assert not res.calls and res.findings[0].action is Action.RETRY


def test_it_retries_leaked_markup_when_the_repair_is_not_allowed() -> None:
    """Without ``Repair.LEAKED_MARKUP`` a recognised block is a retry, not a repair."""
    policy = GuardPolicy(repairs=frozenset(Repair) - {Repair.LEAKED_MARKUP})
    d, events = run(sse(text(HERMES), finish("stop")), policy=policy)
    assert d.outcome is Outcome.RETRY and K.HERMES_TOOL_CALL_TAGS_IN_CONTENT in kinds(d)
    assert any(isinstance(e, Abort) for e in events)


def test_it_recovers_markup_from_reasoning_and_per_choice() -> None:
    """Markup in ``reasoning_content`` and in choice 1 of two interleaved choices."""
    body = sse(
        chunk(choice({"reasoning_content": "think "}), choice({"content": HERMES[:20]}, index=1)),
        chunk(choice({"reasoning_content": HERMES}), choice({"content": HERMES[20:]}, index=1)),
        finish("stop"), finish("stop", 1),
    )
    d, events = run(body, RequestSpec(tools=TOOLS.tools, n=2), step=3)
    assert calls_of(d, 0) == calls_of(d, 1) == [("get_weather", {"city": "Paris"})]
    assert released(events, 0, "reasoning") == "think " and released(events, 1) == ""
    assert d.turn is not None and [c.finish_reason for c in d.turn.choices] == ["tool_calls", "tool_calls"]
    assert d.outcome is Outcome.REPAIRED


def test_it_keeps_markup_as_text_when_tool_choice_is_none() -> None:
    """``tool_choice: none``: no calls are wanted, so nothing is extracted."""
    request = RequestSpec(tools=TOOLS.tools, tool_choice="none")
    d, events = run(sse(text(HERMES), finish("stop")), request)
    assert d.usable and released(events) == HERMES


def test_it_combines_structured_and_leaked_calls() -> None:
    """Structured calls first, then calls recovered from text, in one choice."""
    from .builders import call, tools

    body = sse(text("x"), tools(call(0, "a", "get_time", "{}")), text(HERMES), finish("stop"))
    d, _ = run(body, step=4)
    assert calls_of(d) == [("get_time", {}), ("get_weather", {"city": "Paris"})]
