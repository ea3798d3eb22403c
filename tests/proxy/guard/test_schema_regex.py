"""Client schema patterns are matched in linear time (a catastrophic pattern cannot hold the loop)."""

from __future__ import annotations

import time

from proxy.guard.checks.validate import check_turn
from proxy.guard.policy import GuardPolicy
from proxy.guard.turn import ChoiceTurn, RequestSpec, ToolCall, ToolSpec, Turn

EVIL = "^(a+)+$"


def _check(parameters: dict, arguments: str) -> list[str]:
    spec = RequestSpec(tools=(ToolSpec("x", parameters),))
    turn = Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("call_1", "x", arguments)], finish_reason="tool_calls")])
    _, findings = check_turn(turn, spec, GuardPolicy())
    return [f.kind.value for f in findings if f.fatal]


def test_it_matches_a_catastrophic_pattern_in_linear_time() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": EVIL}}}
    started = time.perf_counter()
    kinds = _check(schema, '{"a": "' + "a" * 5000 + '!"}')
    assert time.perf_counter() - started < 0.5
    assert kinds == ["schema-violation"]


def test_it_matches_catastrophic_pattern_properties_in_linear_time() -> None:
    schema = {"type": "object", "patternProperties": {EVIL: {"type": "integer"}}, "additionalProperties": False}
    started = time.perf_counter()
    kinds = _check(schema, '{"' + "a" * 5000 + '!": 1}')
    assert time.perf_counter() - started < 0.5
    assert kinds == ["schema-violation"], "the key matches no pattern, so it is an additional property"


def test_it_still_enforces_ordinary_patterns() -> None:
    schema = {"type": "object", "properties": {"path": {"type": "string", "pattern": "^[a-z/]+\\.py$"}},
              "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False}
    assert _check(schema, '{"path": "src/app.py", "x-note": "ok"}') == []
    assert _check(schema, '{"path": "src/app.js"}') == ["schema-violation"]
    assert _check(schema, '{"path": "a.py", "x-note": 1}') == ["schema-violation"]
    assert _check(schema, '{"path": "a.py", "other": "no"}') == ["schema-violation"]


def test_it_does_not_enforce_patterns_outside_re2_syntax() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a)\\1$"}}}
    assert _check(schema, '{"a": "ab"}') == []
