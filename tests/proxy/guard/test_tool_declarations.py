"""Tool declarations that no upstream answer could satisfy are refused before any upstream call."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.guard.checks.validate import tool_declaration_problem
from proxy.guard.turn import RequestSpec


def _tool(name: str, required: str = "a") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {required: {"type": "string"}}, "required": [required]}}}


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [_tool("x", "a"), _tool("x", "b")]}, "tools"),
    ({"tools": [_tool("x")], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_it_names_the_unsatisfiable_declaration(body: dict[str, Any], param: str) -> None:
    problem = tool_declaration_problem(RequestSpec.from_openai(body))
    assert problem is not None and problem[1] == param


@pytest.mark.parametrize("body", [
    {},
    {"tools": [_tool("x"), _tool("y")], "tool_choice": "required"},
    {"tools": [_tool("x")], "tool_choice": {"type": "function", "function": {"name": "x"}}},
    {"tools": [_tool("x")], "tool_choice": "none"},
])
def test_it_accepts_satisfiable_declarations(body: dict[str, Any]) -> None:
    assert tool_declaration_problem(RequestSpec.from_openai(body)) is None
