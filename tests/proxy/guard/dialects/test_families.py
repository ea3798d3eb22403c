"""Every dialect family, through ``MarkupScanner``: template-shaped text at every split, and
Hypothesis-generated calls of random tools with random schemas that must come back exactly."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.guard.findings import Action, FindingKind
from proxy.guard.stream.markup import MarkupScanner, ScanResult
from proxy.guard.turn import ToolSpec

from .render import RENDERERS, Calls

K = FindingKind
FAMILIES = sorted(RENDERERS)
#: The corpus kinds keep their own finding kind; the rest report the generic one.
OWN_KIND = {"hermes": K.HERMES_TOOL_CALL_TAGS_IN_CONTENT, "hermes_tools_tag": K.HERMES_TOOL_CALL_TAGS_IN_CONTENT,
            "deepseek_v3": K.DEEPSEEK_SPECIAL_TOKENS_IN_CONTENT, "deepseek_v31": K.DEEPSEEK_SPECIAL_TOKENS_IN_CONTENT,
            "deepseek_dsml": K.DEEPSEEK_SPECIAL_TOKENS_IN_CONTENT, "deepseek_v4": K.DEEPSEEK_SPECIAL_TOKENS_IN_CONTENT,
            "kimi_k2": K.KIMI_SECTION_TOKENS_IN_CONTENT, "minimax": K.MINIMAX_XML_IN_CONTENT,
            "qwen3_coder": K.FUNCTION_TAG_MARKUP_IN_CONTENT, "function_json": K.FUNCTION_TAG_MARKUP_IN_CONTENT}

WEATHER = ToolSpec("get_weather", {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "hot": {"type": "boolean"},
    "opts": {"type": "object"}, "tags": {"type": "array"}}})
READ = ToolSpec("read_file", {"type": "object", "properties": {"path": {"type": "string"}}})
TOOLS = (WEATHER, READ)
CALLS: Calls = [
    ("get_weather", {"city": "Zürich 🌧 \"old town\"", "days": 3, "hot": False,
                     "opts": {"unit": "c", "nested": {"a": [1, 2.5, None]}}, "tags": ["x", "y"]}),
    ("read_file", {"path": "docs/读我.md"}),
]
BEFORE, AFTER = "Let me check — ça va? ", " Done ✓."


def scan(text: str, tools: tuple[ToolSpec, ...], cuts: list[int]) -> ScanResult:
    """Feed ``text`` cut at ``cuts`` (sorted offsets); the merged result, finish included."""
    scanner = MarkupScanner(0, tools)
    total = ScanResult()
    bounds = [0, *cuts, len(text)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        r = scanner.feed(text[a:b])
        total.text += r.text
        total.calls += r.calls
        total.findings += r.findings
    end = scanner.finish()
    return ScanResult(total.text + end.text, total.calls + end.calls, total.findings + end.findings)


def same(a: Any, b: Any) -> bool:
    """Equal values of equal JSON types (``1`` is not ``1.0``, ``True`` is not ``1``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def got(res: ScanResult) -> Calls:
    return [(c.name, json.loads(c.arguments)) for c in res.calls]


#: Text a family always leaves behind: MiniMax-M3's opener is matched from its ``<``.
RESIDUE = {"minimax_m3": "]"}


def check(res: ScanResult, calls: Calls, text: str, family: str) -> None:
    assert res.text == text, res.text
    pairs = zip(got(res), calls, strict=False)
    assert len(res.calls) == len(calls) and all(n == m and same(a, b) for (n, a), (m, b) in pairs), got(res)
    kinds = {f.kind for f in res.findings}
    assert kinds == {OWN_KIND.get(family, K.TOOL_CALL_MARKUP_IN_CONTENT)}, res.findings
    assert all(f.action is Action.REPAIRED for f in res.findings)
    assert len({c.id for c in res.calls}) == len(res.calls)


@pytest.mark.parametrize("family", FAMILIES)
def test_it_recovers_template_shaped_calls_at_every_split(family: str) -> None:
    """Two calls (unicode, quotes, nested JSON) with text around them: same text and calls at every
    two-piece split and at a three-piece split through the middle."""
    render, around, _ = RENDERERS[family]
    before, after = (BEFORE, AFTER) if around else ("", "")
    text = before + render(CALLS) + after
    for i in range(len(text) + 1):
        check(scan(text, TOOLS, [i]), CALLS, before + RESIDUE.get(family, "") + after, family)
    for i in range(0, len(text), 7):
        check(scan(text, TOOLS, sorted({i, (i + len(text)) // 2})), CALLS, before + RESIDUE.get(family, "") + after,
              family)


def test_it_releases_text_before_a_call_live() -> None:
    """Text before a block goes out before the block closes; only the block is held."""
    scanner = MarkupScanner(0, TOOLS)
    assert scanner.feed("Checking the forecast. <tool_call>\n{").text == "Checking the forecast. "
    assert scanner.feed('"name": "read_file", "arguments": {"path": "a"}}').text == ""
    res = scanner.feed("\n</tool_call> and more")
    assert res.text == " and more" and [c.name for c in res.calls] == ["read_file"]


# -- generated calls ----------------------------------------------------------------------------

_IDENT = st.from_regex(r"\A[a-z][a-z0-9_]{2,10}\Z", fullmatch=True).filter(
    lambda s: s not in {"functools", "call", "to", "true", "false", "null", "none", "name", "type"})
_SAFE = st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="<>[]{}|`✿:=()")
_TEXT = st.text(alphabet=st.sampled_from(list(string.ascii_letters + string.digits + " .,!?'-") + list("éüß中文🙂")),
                max_size=20)
_TYPES = ("string", "integer", "number", "boolean", "object", "array")


def _scalar() -> st.SearchStrategy[Any]:
    return st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.text(_SAFE, max_size=8),
                     st.floats(allow_nan=False, allow_infinity=False, width=32))


def _value(kind: str, edges: bool) -> st.SearchStrategy[Any]:
    string_value = st.text(_SAFE, max_size=30)
    if not edges:
        string_value = string_value.filter(lambda s: s == s.strip("\r\n") and "\r" not in s)
    return {
        "string": string_value,
        "integer": st.integers(-10**9, 10**9),
        "number": st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False)),
        "boolean": st.booleans(),
        "object": st.dictionaries(_IDENT, _scalar(), max_size=3),
        "array": st.lists(_scalar(), max_size=4),
    }[kind]


@st.composite
def scenario(draw: st.DrawFn, family: str) -> tuple[tuple[ToolSpec, ...], Calls, str, str, list[int]]:
    """Random tools (names, schemas), calls of them with args of the declared types, text, cuts."""
    render, around, edges = RENDERERS[family]
    names = draw(st.lists(_IDENT, min_size=1, max_size=3, unique=True))
    schemas = {n: draw(st.dictionaries(_IDENT, st.sampled_from(_TYPES), max_size=4)) for n in names}
    tools = tuple(ToolSpec(n, {"type": "object", "properties": {k: {"type": t} for k, t in s.items()}})
                  for n, s in schemas.items())
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(names))
        calls.append((name, {k: draw(_value(t, edges)) for k, t in schemas[name].items()}))
    before = draw(_TEXT).lstrip() if around else ""
    after = (" " + draw(_TEXT)) if around else ""
    body = before + render(calls) + after
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=5)))
    return tools, calls, before, after, cuts


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_it_round_trips_generated_calls(family: str, data: st.DataObject) -> None:
    """Calls rendered in the family's syntax come back with the same names and argument values, and
    the text around them comes back unchanged, wherever the stream is cut."""
    tools, calls, before, after, cuts = data.draw(scenario(family))
    render = RENDERERS[family][0]
    res = scan(before + render(calls) + after, tools, cuts)
    check(res, calls, before + RESIDUE.get(family, "") + after, family)
