"""The simulator's scripted multi-step task mode (``task:steps=N:rate=P``): pure parts and the planner."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from proxy.simulator import task
from proxy.simulator.cases import CaseLibrary
from proxy.simulator.planner import PlanContext, SimConfig, plan
from proxy.simulator.scenario import ScenarioError, parse_scenario


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


CLAUDE_BASH = _tool("Bash", {"command": {"type": "string"}, "description": {"type": "string"},
                             "timeout": {"type": "number"}}, ["command"])  # fmt: skip
CODEX_SHELL = _tool("shell", {"command": {"type": "array", "items": {"type": "string"}},
                              "workdir": {"type": "string"}}, ["command"])  # fmt: skip
CODEX_EXEC = _tool("exec_command", {"cmd": {"type": "string"}, "yield_time_ms": {"type": "number"}}, ["cmd"])
QWEN_SHELL = _tool("run_shell_command", {"command": {"type": "string"}, "is_background": {"type": "boolean"},
                                         "description": {"type": "string"}}, ["command", "is_background"])  # fmt: skip
OPENCODE_BASH = _tool("bash", {"command": {"type": "string"}, "description": {"type": "string"}},
                      ["command", "description"])  # fmt: skip
READ = _tool("Read", {"file_path": {"type": "string"}}, ["file_path"])


def _body(tools: list[dict[str, Any]], history: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Do the task."}]
    return {"model": "task", "stream": True, "messages": messages + (history or []), "tools": tools, **extra}


def _round(step: int, result: str = "", name: str = "Bash", arguments: str | None = None) -> list[dict[str, Any]]:
    """One answered tool round of step ``step``."""
    call_id = f"call_{step}"
    raw = arguments if arguments is not None else json.dumps({"command": task.step_command(step)})
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": result}]  # fmt: skip


@pytest.mark.parametrize(
    ("tools", "name", "arguments"),
    [
        ([READ, CLAUDE_BASH], "Bash", {"command": "echo step-1 > step-1.txt"}),
        ([CODEX_SHELL], "shell", {"command": ["bash", "-lc", "echo step-1 > step-1.txt"]}),
        ([CODEX_EXEC], "exec_command", {"cmd": "echo step-1 > step-1.txt"}),
        ([QWEN_SHELL], "run_shell_command", {"command": "echo step-1 > step-1.txt", "is_background": False}),
        ([OPENCODE_BASH], "bash", {"command": "echo step-1 > step-1.txt", "description": "Write step-1.txt"}),
    ],
)
def test_the_first_turn_calls_the_declared_shell_tool_with_its_schema(tools: Any, name: str, arguments: Any) -> None:
    turn = task.task_turn(_body(tools), 10, random.Random(1))
    assert [(c.name, c.arguments) for c in turn.calls] == [(name, arguments)]
    assert json.loads(turn.calls[0].wire) == arguments
    assert turn.finish_reason == "tool_calls"


def test_each_answered_step_moves_the_task_on_and_the_last_ends_with_done() -> None:
    history: list[dict[str, Any]] = []
    for step in range(1, 4):
        turn = task.task_turn(_body([CLAUDE_BASH], history), 3, random.Random(step))
        assert turn.calls[0].arguments == {"command": task.step_command(step)}
        history += _round(step)
    final = task.task_turn(_body([CLAUDE_BASH], history), 3, random.Random(9))
    assert (final.calls, "".join(final.content), final.finish_reason) == ([], "done", "stop")


@pytest.mark.parametrize(
    "broken",
    [
        _round(1, arguments='{"command": "echo step-1 > st'),  # cut arguments
        _round(1, result="Error: tool Bash failed"),  # the agent reported an error
        _round(1, result="invalid arguments"),
        _round(1, result="<tool_use_error>InputValidationError: command is missing</tool_use_error>"),
    ],
)
def test_a_failed_or_unparseable_step_is_asked_for_again(broken: list[dict[str, Any]]) -> None:
    turn = task.task_turn(_body([CLAUDE_BASH], broken), 3, random.Random(2))
    assert turn.calls[0].arguments == {"command": task.step_command(1)}


def test_a_call_without_a_result_is_not_done() -> None:
    history = _round(1)[:1]
    assert task.steps_done(_body([CLAUDE_BASH], history)) == set()
    assert task.next_step(_body([CLAUDE_BASH], _round(2)), 3) == 1


def test_side_requests_without_a_shell_tool_get_short_text() -> None:
    for body in (_body([]), _body([READ]), _body([CLAUDE_BASH], tool_choice="none")):
        turn = task.task_turn(body, 10, random.Random(3))
        assert not turn.calls
        assert "".join(turn.content) == "Multi-step task."


def test_the_scenario_parses_and_rejects_unknown_options() -> None:
    scenario = parse_scenario("task:steps=10:rate=0.3:seed=1:kinds=truncated-arguments-length")
    assert scenario is not None
    assert (scenario.mode, scenario.get_int("steps", 0), scenario.get_float("rate", 0)) == ("task", 10, 0.3)
    with pytest.raises(ScenarioError):
        parse_scenario("task:steps=10:corrupt=1")


def _plan(model: str, body: dict[str, Any], attempt: int = 1) -> Any:
    scenario = parse_scenario(model)
    assert scenario is not None
    digest = json.dumps(body["messages"])
    return plan(PlanContext(body, scenario, attempt, digest, SimConfig(), CaseLibrary(Path("/nonexistent"))))


def test_the_planner_corrupts_tool_turns_at_the_rate_deterministically_and_never_text() -> None:
    faults = []
    for attempt in range(1, 201):
        reply = _plan("task:steps=10:rate=0.3:seed=1", _body([CLAUDE_BASH]), attempt)
        again = _plan("task:steps=10:rate=0.3:seed=1", _body([CLAUDE_BASH]), attempt)
        assert (reply.fault, reply.pieces == again.pieces) == (again.fault, True)
        faults.append(reply.fault)
    corrupted = [f for f in faults if f]
    assert 30 < len(corrupted) < 90
    assert set(corrupted) <= set(task.TASK_KINDS)
    assert len(set(corrupted)) >= 4
    for attempt in range(1, 30):
        assert _plan("task:rate=1", _body([READ]), attempt).fault is None
        assert _plan("task:steps=1:rate=1", _body([CLAUDE_BASH], _round(1)), attempt).fault is None


def test_rate_one_with_kinds_breaks_every_attempt_with_that_kind() -> None:
    for attempt in range(1, 6):
        reply = _plan("task:rate=1:kinds=undeclared-or-prefixed-tool-name", _body([CLAUDE_BASH]), attempt)
        assert reply.fault == "undeclared-or-prefixed-tool-name"
    with pytest.raises(ScenarioError):
        _plan("task:rate=1:kinds=no-such-kind", _body([CLAUDE_BASH]))
