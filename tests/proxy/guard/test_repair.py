"""Deterministic repairs (``proxy.guard.checks.repair``): names, argument text, double encoding."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.guard.checks.repair import (
    drop_stray_escapes,
    parse_arguments,
    resolve_name,
    strip_code_fence,
    unwrap_double_encoded,
)
from proxy.guard.policy import GuardPolicy, Repair

POLICY = GuardPolicy()
NO_REPAIRS = GuardPolicy(repairs=frozenset())
NAMES = frozenset({"run_shell", "get_weather"})


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("run_shell", "run_shell"),
        ("functions.run_shell", "run_shell"),  # C46
        ("default_api.get_weather", "get_weather"),
        ("tools.run_shell", "run_shell"),
        ("tool.run_shell", "run_shell"),
        ("functions.get_weather:0", "get_weather"),  # Kimi id shape in the name
        ("get_weather:12", "get_weather"),
        (" run_shell ", "run_shell"),
        ("toolbox.web.answer", None),  # C46: invented tool
        ("functions.unknown", None),
        ("functions.functions.run_shell", None),  # one prefix only
        ("Run_Shell", None),  # no case folding
        ("", None),
    ],
)
def test_it_resolves_template_prefixed_names(name: str, expected: str | None) -> None:
    """Exact names pass; one well-known prefix / Kimi suffix is stripped when the rest is declared."""
    assert resolve_name(name, NAMES, POLICY) == expected


def test_it_resolves_prefixes_only_when_the_policy_allows() -> None:
    """Without Repair.NAME_PREFIX only exact names resolve."""
    assert resolve_name("functions.run_shell", NAMES, NO_REPAIRS) is None
    assert resolve_name("run_shell", NAMES, NO_REPAIRS) == "run_shell"


def test_it_prefers_an_exact_declared_prefixed_name() -> None:
    """A client that really declared ``tools.search`` gets it, not ``search``."""
    assert resolve_name("tools.search", frozenset({"tools.search", "search"}), POLICY) == "tools.search"


def test_it_parses_valid_arguments_without_repairs() -> None:
    """Valid JSON needs no repair, whatever escapes its strings hold."""
    parsed = parse_arguments('{"a": "x\\n\\"y\\"", "b": [1, 2.5]}', POLICY)
    assert parsed.ok and parsed.repairs == ()
    assert parsed.value == {"a": 'x\n"y"', "b": [1, 2.5]}


def test_it_escapes_raw_control_characters_c21() -> None:
    """C21: a literal newline inside a string parses leniently and is reported."""
    parsed = parse_arguments('{"command": "git commit -m \\"feat: add parser\n\nadds a module\\""}', POLICY)
    assert parsed.ok
    assert parsed.value == {"command": 'git commit -m "feat: add parser\n\nadds a module"'}
    assert [a.repair for a in parsed.repairs] == [Repair.CONTROL_CHARACTERS]


def test_it_leaves_control_characters_alone_when_not_allowed() -> None:
    """Without Repair.CONTROL_CHARACTERS the text is not JSON."""
    assert not parse_arguments('{"a": "x\ty"}', NO_REPAIRS).ok


@pytest.mark.parametrize("text", ['json\n{"city":"Paris"}', '```json\n{"city":"Paris"}\n```',
                                  '```\n{"city":"Paris"}```', '```JSON {"city":"Paris"}',
                                  '{"city":"Paris"}\n```'])
def test_it_strips_code_fence_residue_c23(text: str) -> None:
    """C23: leading fence / bare ``json`` tag and a trailing fence are dropped and reported."""
    parsed = parse_arguments(text, POLICY)
    assert parsed.ok and parsed.value == {"city": "Paris"}
    assert [a.repair for a in parsed.repairs] == [Repair.CODE_FENCE]


def test_it_only_strips_fences_around_json() -> None:
    """A fence in front of something else is left, and fences inside strings are never touched."""
    assert strip_code_fence("```python\nprint(1)\n```") == "```python\nprint(1)\n```"
    assert strip_code_fence('{"code":"```"}') == '{"code":"```"}'


def test_it_drops_stray_escapes_outside_strings() -> None:
    """Literal ``\\n`` between tokens is whitespace; escapes inside strings stay."""
    parsed = parse_arguments('{\\n  "a": "x\\ty",\\n  "b": 1\\n}', POLICY)
    assert parsed.ok and parsed.value == {"a": "x\ty", "b": 1}
    assert [a.repair for a in parsed.repairs] == [Repair.STRAY_ESCAPES]


def test_it_unescapes_fully_escaped_arguments() -> None:
    """An object whose quotes are all escaped (no bare quote) is unescaped exactly."""
    assert drop_stray_escapes('{\\"city\\": \\"Par\\\\\\"is\\"}') == '{"city": "Par\\"is"}'
    parsed = parse_arguments('{\\"city\\": \\"Paris\\"}', POLICY)
    assert parsed.ok and parsed.value == {"city": "Paris"}


def test_it_unwraps_an_object_sent_as_a_json_string() -> None:
    """Arguments that are a JSON string holding an object become the object (reported as double encoding)."""
    parsed = parse_arguments(json.dumps('{"city":"Paris"}'), POLICY)
    assert parsed.ok and parsed.value == {"city": "Paris"}
    assert [a.repair for a in parsed.repairs] == [Repair.DOUBLE_ENCODED]
    assert parse_arguments(json.dumps('"Paris"'), POLICY).value == '"Paris"'


@pytest.mark.parametrize("text", ['{"path":"docs/out.txt","content":"line1', '{"a": [1, 2', '{"a": "x"',
                                  '```json\n{"a": "x\n', '{"a": 1,', "{"])
def test_it_never_completes_truncated_json_c24(text: str) -> None:
    """C24: no repair turns a truncated prefix into JSON."""
    parsed = parse_arguments(text, POLICY)
    assert not parsed.ok and parsed.error


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": 1e999}'])
def test_it_rejects_non_standard_numbers(text: str) -> None:
    """NaN / Infinity and numbers beyond a double cannot be re-serialised as strict JSON."""
    assert not parse_arguments(text, POLICY).ok


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=15))
def test_it_parses_any_strict_json_unchanged(value: object) -> None:
    """Every strict JSON text parses to its value with no repair (top-level strings aside)."""
    parsed = parse_arguments(json.dumps(value), POLICY)
    assert parsed.ok
    if not isinstance(value, str):
        assert parsed.value == value and parsed.repairs == ()


@given(st.text())
def test_it_never_raises_on_any_text(text: str) -> None:
    """Arbitrary text yields a result, never an exception."""
    parse_arguments(text, POLICY)


@given(st.dictionaries(st.text(max_size=5), st.text(max_size=5), min_size=1, max_size=3))
def test_it_never_makes_a_truncated_object_parse(value: dict[str, str]) -> None:
    """Every proper prefix of an object's JSON text stays unparseable after repairs."""
    text = json.dumps(value)
    for cut in range(1, len(text)):
        assert not parse_arguments(text[:cut], POLICY).ok


TODO_SCHEMA = {"type": "object", "properties": {"todos": {"type": "array", "items": {"type": "string"}}},
               "required": ["todos"]}


def test_it_unwraps_a_double_encoded_array_c20() -> None:
    """C20: a string where the schema wants an array is parsed when it parses to an array."""
    value, paths = unwrap_double_encoded({"todos": '["write tests", "update docs"]'}, TODO_SCHEMA)
    assert value == {"todos": ["write tests", "update docs"]}
    assert paths == ["$.todos"]


def test_it_unwraps_nested_double_encoding() -> None:
    """Objects in arrays in objects, additionalProperties and anyOf branches are followed."""
    schema = {"type": "object", "properties": {"steps": {"type": "array", "items": {
        "type": "object", "properties": {"args": {"type": "object"}}}}},
        "additionalProperties": {"anyOf": [{"type": "array"}, {"type": "null"}]}}
    value = {"steps": [{"args": '{"x": 1}'}, {"args": {"y": 2}}], "other": "[1]"}
    new, paths = unwrap_double_encoded(value, schema)
    assert new == {"steps": [{"args": {"x": 1}}, {"args": {"y": 2}}], "other": [1]}
    assert sorted(paths) == ["$.other", "$.steps[0].args"]
    assert value["steps"][0]["args"] == '{"x": 1}'  # input not mutated


@pytest.mark.parametrize(
    ("schema", "raw"),
    [
        ({"type": "array"}, '{"a": 1}'),  # parses, but to the wrong type
        ({"type": "array"}, "[1, 2"),  # does not parse
        ({"type": ["array", "string"]}, "[1]"),  # a string is allowed here
        ({}, "[1]"),  # no type asked
        ({"type": "object"}, "not json"),
    ],
)
def test_it_leaves_strings_the_schema_does_not_want_unwrapped(schema: dict[str, object], raw: str) -> None:
    """Unwrapping happens only when the schema asks for that type and the string parses to it."""
    value, paths = unwrap_double_encoded({"v": raw}, {"type": "object", "properties": {"v": schema}})
    assert value == {"v": raw} and paths == []
