"""Turn validation (``proxy.guard.checks.validate.check_turn``): names, arguments, schemas, tool_choice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.guard.checks.validate import check_turn
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from proxy.guard.policy import GuardPolicy, Repair
from proxy.guard.turn import ChoiceTurn, RequestSpec, ToolCall, ToolSpec, Turn

POLICY = GuardPolicy()
WEATHER = ToolSpec("get_weather", {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
    "additionalProperties": False,
})
SHELL = ToolSpec("run_shell", {"type": "object", "properties": {"command": {"type": "string"}},
                               "required": ["command"]})
TODOS = ToolSpec("set_todos", {"type": "object", "properties": {
    "todos": {"type": "array", "items": {"type": "string"}},
    "meta": {"type": "object", "properties": {"tags": {"type": "array"}}}}, "required": ["todos"]})
NOARGS = ToolSpec("list_files", None)
REQUEST = RequestSpec(tools=(WEATHER, SHELL, TODOS, NOARGS))


def turn_of(*calls: ToolCall, finish: str = "tool_calls", content: str | None = None) -> Turn:
    """A one-choice turn with ``calls``."""
    return Turn(id="chatcmpl-1", model="m", created=1,
                choices=[ChoiceTurn(content=content, tool_calls=list(calls), finish_reason=finish)])


def call(name: str, arguments: str, call_id: str = "call_1") -> ToolCall:
    """A tool call."""
    return ToolCall(call_id, name, arguments)


def check(turn: Turn, request: RequestSpec = REQUEST, policy: GuardPolicy = POLICY
          ) -> tuple[Turn, list[Finding]]:
    """Run check_turn."""
    return check_turn(turn, request, policy)


def kinds(findings: list[Finding]) -> list[tuple[FindingKind, Action]]:
    """(kind, action) of each finding."""
    return [(f.kind, f.action) for f in findings]


def test_it_passes_a_valid_call_untouched_but_compact() -> None:
    """A valid call yields no finding; arguments come back as compact strict JSON."""
    out, findings = check(turn_of(call("get_weather", '{ "city" : "Paris", "unit": "celsius" }')))
    assert findings == []
    assert out.choices[0].tool_calls[0].arguments == '{"city":"Paris","unit":"celsius"}'


def test_it_keeps_non_ascii_text_in_arguments() -> None:
    """Argument text is serialised with ensure_ascii=False (the SSE envelope escapes it)."""
    out, _ = check(turn_of(call("get_weather", '{"city": "M\\u00fcnchen"}')))
    assert out.choices[0].tool_calls[0].arguments == '{"city":"München"}'


def test_it_does_not_mutate_the_input_turn() -> None:
    """The returned turn is a new value."""
    turn = turn_of(call("functions.get_weather", '{"city": "Paris"}'))
    out, _ = check(turn)
    assert turn.choices[0].tool_calls[0].name == "functions.get_weather"
    assert out.choices[0].tool_calls[0].name == "get_weather"


def test_it_repairs_a_prefixed_name_c46() -> None:
    """C46: ``functions.run_shell`` is repaired to ``run_shell`` with a warning finding."""
    out, findings = check(turn_of(call("functions.run_shell", '{"command":"ls"}')))
    assert out.choices[0].tool_calls[0].name == "run_shell"
    (finding,) = findings
    assert (finding.kind, finding.action, finding.severity) == (
        FindingKind.UNDECLARED_OR_PREFIXED_TOOL_NAME, Action.REPAIRED, Severity.WARNING)
    assert (finding.choice, finding.slot) == (0, 0)


def test_it_retries_an_undeclared_name_c46() -> None:
    """C46: an invented tool cannot be resolved: retry."""
    _, findings = check(turn_of(call("toolbox.web.answer", '{"q":"x"}')))
    assert kinds(findings) == [(FindingKind.UNDECLARED_OR_PREFIXED_TOOL_NAME, Action.RETRY)]
    assert findings[0].severity is Severity.ERROR


def test_it_retries_any_call_when_no_tools_were_declared() -> None:
    """A call with an empty tool list is undeclared."""
    _, findings = check(turn_of(call("get_weather", "{}")), RequestSpec())
    assert (FindingKind.UNDECLARED_OR_PREFIXED_TOOL_NAME, Action.RETRY) in kinds(findings)


@pytest.mark.parametrize(
    ("arguments", "kind", "expected"),
    [
        ('{"command": "a\nb"}', FindingKind.RAW_CONTROL_CHARACTERS_IN_ARGUMENTS, {"command": "a\nb"}),  # C21
        ('json\n{"command":"ls"}', FindingKind.CODE_FENCE_PREFIX_IN_ARGUMENTS, {"command": "ls"}),  # C23
        ('{\\n"command": "ls"\\n}', FindingKind.STRAY_ESCAPE_IN_ARGUMENTS, {"command": "ls"}),
    ],
)
def test_it_repairs_argument_text(arguments: str, kind: FindingKind, expected: dict[str, Any]) -> None:
    """Each allowed text repair yields the intended object and one REPAIRED warning of its kind."""
    out, findings = check(turn_of(call("run_shell", arguments)))
    assert json.loads(out.choices[0].tool_calls[0].arguments) == expected
    assert kinds(findings) == [(kind, Action.REPAIRED)]
    assert findings[0].severity is Severity.WARNING


def test_it_unwraps_double_encoded_values_c20() -> None:
    """C20 and a nested case: each unwrapped path is its own finding."""
    args = json.dumps({"todos": '["write tests", "update docs"]', "meta": {"tags": '["a"]'}})
    out, findings = check(turn_of(call("set_todos", args)))
    assert json.loads(out.choices[0].tool_calls[0].arguments) == {
        "todos": ["write tests", "update docs"], "meta": {"tags": ["a"]}}
    assert kinds(findings) == [(FindingKind.NESTED_VALUES_DOUBLE_ENCODED, Action.REPAIRED)] * 2
    assert {f.detail for f in findings} == {"unwrapped JSON string at $.todos",
                                            "unwrapped JSON string at $.meta.tags"}


def test_it_retries_double_encoding_when_the_repair_is_not_allowed() -> None:
    """Without Repair.DOUBLE_ENCODED the string fails the schema."""
    policy = GuardPolicy(repairs=frozenset())
    _, findings = check(turn_of(call("set_todos", json.dumps({"todos": '["a"]'}))), policy=policy)
    assert kinds(findings) == [(FindingKind.SCHEMA_VIOLATION, Action.RETRY)]


def test_it_retries_repairs_the_policy_forbids() -> None:
    """Without repairs, fence residue is simply not JSON."""
    fenced = turn_of(call("run_shell", 'json\n{"command":"ls"}'))
    _, findings = check(fenced, policy=GuardPolicy(repairs=frozenset()))
    assert kinds(findings) == [(FindingKind.ARGUMENTS_NOT_JSON, Action.RETRY)]


def test_it_retries_arguments_that_are_not_json() -> None:
    """Unparseable arguments under a normal finish: ARGUMENTS_NOT_JSON."""
    out, findings = check(turn_of(call("run_shell", "ls -la")))
    assert kinds(findings) == [(FindingKind.ARGUMENTS_NOT_JSON, Action.RETRY)]
    assert out.choices[0].tool_calls[0].arguments == "ls -la"  # a failed call keeps its raw text


@pytest.mark.parametrize("arguments", ["[1, 2]", '"ls"', "42", "null", "true"])
def test_it_retries_arguments_that_are_not_an_object(arguments: str) -> None:
    """JSON that is not an object: ARGUMENTS_NOT_OBJECT."""
    _, findings = check(turn_of(call("run_shell", arguments)))
    assert kinds(findings) == [(FindingKind.ARGUMENTS_NOT_OBJECT, Action.RETRY)]


def test_it_retries_truncated_arguments_under_length_c24() -> None:
    """C24: a ``length`` finish with cut-off arguments is truncation, never a repaired call."""
    out, findings = check(turn_of(call("run_shell", '{"command":"echo line1'), finish="length"))
    assert kinds(findings) == [(FindingKind.TRUNCATED_ARGUMENTS_LENGTH, Action.RETRY)]
    assert out.choices[0].tool_calls[0].arguments == '{"command":"echo line1'


def test_it_accepts_complete_arguments_under_length() -> None:
    """A ``length`` finish whose arguments are complete JSON is not truncation."""
    _, findings = check(turn_of(call("run_shell", '{"command":"ls"}'), finish="length"))
    assert findings == []


@pytest.mark.parametrize("arguments", ["", "  ", "\n"])
def test_it_reads_blank_arguments_as_an_empty_object(arguments: str) -> None:
    """C19: blank arguments of a no-parameter tool become ``{}`` (an info finding)."""
    out, findings = check(turn_of(call("list_files", arguments)))
    assert out.choices[0].tool_calls[0].arguments == "{}"
    assert kinds(findings) == [(FindingKind.EMPTY_ARGUMENTS_FOR_NO_ARG_TOOL, Action.NORMALIZED)]


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ('{"unit": "celsius"}', "'city' is a required property"),
        ('{"city": 3}', "3 is not of type 'string'"),
        ('{"city": "Paris", "unit": "kelvin"}', "'kelvin' is not one of"),
        ('{"city": "Paris", "country": "FR"}', "Additional properties are not allowed"),
    ],
)
def test_it_reports_schema_violations(arguments: str, needle: str) -> None:
    """required, type, enum and additionalProperties:false failures: SCHEMA_VIOLATION with the message."""
    _, findings = check(turn_of(call("get_weather", arguments)))
    assert kinds(findings) == [(FindingKind.SCHEMA_VIOLATION, Action.RETRY)]
    assert needle in findings[0].detail


def test_it_reports_the_path_of_a_nested_violation() -> None:
    """The finding names where in the object the violation is."""
    _, findings = check(turn_of(call("set_todos", '{"todos": ["a", 2]}')))
    assert "$.todos[1]" in findings[0].detail


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "objekt"},
        {"type": "object", "properties": {"a": {"pattern": "("}}},
        {"type": "object", "required": "city"},
        {"$schema": ["not", "a", "uri"], "type": "object"},
    ],
)
def test_it_survives_a_broken_client_schema(schema: dict[str, Any]) -> None:
    """A schema the validator cannot use counts as no schema, with one info finding."""
    request = RequestSpec(tools=(ToolSpec("f", schema),))
    turn = turn_of(call("f", '{"a": 1}'), call("f", '{"a": 2}', "call_2"))
    out, findings = check(turn, request)
    assert kinds(findings) == [(FindingKind.TOOL_SCHEMA_INVALID, Action.IGNORED)]
    assert findings[0].severity is Severity.INFO
    assert [c.arguments for c in out.choices[0].tool_calls] == ['{"a":1}', '{"a":2}']


def test_it_survives_an_unresolvable_ref() -> None:
    """A remote ``$ref`` is never fetched: the schema counts as unusable (info), nothing crashes."""
    schema = {"type": "object", "properties": {"a": {"$ref": "https://example.invalid/s.json"}}}
    _, findings = check(turn_of(call("f", '{"a": 1}')), RequestSpec(tools=(ToolSpec("f", schema),)))
    assert kinds(findings) == [(FindingKind.TOOL_SCHEMA_INVALID, Action.IGNORED)]


def test_it_accepts_draft7_tuple_items() -> None:
    """A draft-7 tuple ``items`` schema is valid (draft 7 fallback) and enforced."""
    schema = {"type": "object", "properties": {"p": {"type": "array", "items": [{"type": "number"}]}}}
    request = RequestSpec(tools=(ToolSpec("f", schema),))
    assert check(turn_of(call("f", '{"p": [1]}')), request)[1] == []
    assert kinds(check(turn_of(call("f", '{"p": ["x"]}')), request)[1]) == [
        (FindingKind.SCHEMA_VIOLATION, Action.RETRY)]


def test_it_enforces_tool_choice_required() -> None:
    """``required``: a choice without a call is a violation; with one it passes."""
    request = RequestSpec(tools=REQUEST.tools, tool_choice="required")
    _, findings = check(turn_of(finish="stop", content="hi"), request)
    assert kinds(findings) == [(FindingKind.TOOL_CHOICE_VIOLATION, Action.RETRY)]
    assert check(turn_of(call("list_files", "{}")), request)[1] == []


def test_it_enforces_tool_choice_none() -> None:
    """``none``: any call is a violation."""
    request = RequestSpec(tools=REQUEST.tools, tool_choice="none")
    _, findings = check(turn_of(call("list_files", "{}")), request)
    assert kinds(findings) == [(FindingKind.TOOL_CHOICE_VIOLATION, Action.RETRY)]
    assert check(turn_of(finish="stop", content="hi"), request)[1] == []


def test_it_enforces_a_named_tool_choice_after_name_repair() -> None:
    """A forced function must be called; a repaired prefixed name counts as that function."""
    request = RequestSpec(tools=REQUEST.tools, tool_choice="run_shell")
    _, findings = check(turn_of(call("list_files", "{}")), request)
    assert kinds(findings) == [(FindingKind.TOOL_CHOICE_VIOLATION, Action.RETRY)]
    _, findings = check(turn_of(call("functions.run_shell", '{"command":"ls"}')), request)
    assert kinds(findings) == [(FindingKind.UNDECLARED_OR_PREFIXED_TOOL_NAME, Action.REPAIRED)]


def test_it_enforces_parallel_tool_calls_false() -> None:
    """``parallel_tool_calls: false`` without the repair: two calls in one choice is a violation at slot 1."""
    request = RequestSpec(tools=REQUEST.tools, parallel_tool_calls=False)
    two = turn_of(call("list_files", "{}"), call("list_files", "{}", "call_2"))
    no_repair = GuardPolicy(repairs=POLICY.repairs - {Repair.EXTRA_PARALLEL_CALLS})
    _, findings = check(two, request, no_repair)
    assert kinds(findings) == [(FindingKind.PARALLEL_TOOL_CALLS_VIOLATION, Action.RETRY)]
    assert (findings[0].choice, findings[0].slot) == (0, 1)
    assert check(turn_of(call("list_files", "{}")), request)[1] == []


def test_it_keeps_one_call_when_parallel_calls_are_off() -> None:
    """With the repair (default), the first call stays, or the one a named tool_choice forces."""
    request = RequestSpec(tools=REQUEST.tools, parallel_tool_calls=False)
    two = turn_of(call("list_files", "{}"), call("get_weather", '{"city":"Paris"}', "call_2"))
    out, findings = check(two, request)
    assert [c.name for c in out.choices[0].tool_calls] == ["list_files"]
    assert kinds(findings) == [(FindingKind.PARALLEL_TOOL_CALLS_VIOLATION, Action.REPAIRED)]
    forced = RequestSpec(tools=REQUEST.tools, parallel_tool_calls=False, tool_choice="get_weather")
    out, findings = check(two, forced)
    assert [c.name for c in out.choices[0].tool_calls] == ["get_weather"]
    assert not any(f.fatal for f in findings)


def test_it_checks_every_choice_of_n_greater_than_one() -> None:
    """n=2: findings carry their choice and slot; each choice is checked on its own."""
    turn = Turn(choices=[
        ChoiceTurn(index=0, tool_calls=[call("get_weather", '{"city":"Paris"}')], finish_reason="tool_calls"),
        ChoiceTurn(index=1, tool_calls=[call("get_weather", '{"city":"Paris"}'),
                                        call("functions.get_weather", '{"city":1}', "call_2")],
                   finish_reason="tool_calls"),
    ])
    out, findings = check(turn, RequestSpec(tools=REQUEST.tools, tool_choice="required", n=2))
    assert [(f.kind, f.action, f.choice, f.slot) for f in findings] == [
        (FindingKind.UNDECLARED_OR_PREFIXED_TOOL_NAME, Action.REPAIRED, 1, 1),
        (FindingKind.SCHEMA_VIOLATION, Action.RETRY, 1, 1),
    ]
    assert out.choices[1].tool_calls[0].arguments == '{"city":"Paris"}'


def test_it_keeps_provider_extra_fields() -> None:
    """``extra`` (e.g. Gemini's ``extra_content``) survives the re-serialisation."""
    extra = {"extra_content": {"google": {"thought_signature": "sig"}}}
    out, _ = check(turn_of(ToolCall("call_1", "list_files", "{}", extra)))
    assert out.choices[0].tool_calls[0].extra == extra
