"""The scripted multi-step task (``task:steps=N:rate=P:seed=S[:kinds=...]``): a model that drives a real
agent through N shell steps, then says "done".

Every turn looks at the request's history (chat completions, PROTOCOLS.md 1.5): step ``j`` is done
when an assistant message called the shell tool with a command that writes ``step-j.txt`` (arguments
that parse as JSON) and a ``role: "tool"`` message answered that call id without an error. The next
turn asks for the first step not done, as one call to whatever shell tool the client declared
(Claude Code ``Bash``, Codex ``shell`` / ``exec_command``, OpenCode ``bash``, Qwen Code
``run_shell_command``), filling the command-like property of its schema (an array property gets
``["bash", "-lc", CMD]``). After N steps the turn is the text ``done``. A request without a shell
tool (title generation and other side requests) gets a short plain text answer.

Pure functions: the planner (``planner._plan_task``) adds the seeded corruption of tool turns.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from proxy.simulator.turns import Turn, declared_tools, finish, make_call, new_turn

#: The six realistic shapes drawn by default: cut arguments, a call leaked into text, cumulative
#: snapshots, an empty first name with the id repeated, a stream cut before its end, an undeclared name.
TASK_KINDS = (
    "truncated-arguments-length",
    "hermes-tool-call-tags-in-content",
    "cumulative-arguments-snapshots",
    "name-arrives-late",
    "mid-stream-error-chunk",
    "undeclared-or-prefixed-tool-name",
)
#: Shell tool names, most specific first (compared case-insensitively).
_SHELL_NAMES = ("bash", "shell", "exec_command", "run_shell_command", "shell_command", "run_command",
                "execute_command", "terminal", "run")  # fmt: skip
#: Command-like property names, in order of preference.
_COMMAND_PROPS = ("command", "cmd", "commands", "script", "code")
#: Values of other required properties, by JSON type (strings get a short description).
_DEFAULTS: dict[str | None, Any] = {"boolean": False, "integer": 60000, "number": 60000, "array": [], "object": {}}
_STEP = re.compile(r"step-(\d+)\.txt")
_ERROR = re.compile(r"^\W*(error|invalid|failed|tool .* not found|unknown tool)|<tool_use_error>", re.IGNORECASE)


@dataclass(frozen=True)
class ShellTool:
    """A declared shell tool: its ``name``, the ``prop`` that takes the command, whether that property
    is an ``array`` (argv) or a string, and the tool's ``parameters`` schema."""

    name: str
    prop: str
    array: bool
    parameters: dict[str, Any]


def find_shell_tool(body: dict[str, Any]) -> ShellTool | None:
    """The request's shell tool (by name, see ``_SHELL_NAMES``) with its command property, or None."""
    tools = {t["name"].lower(): t for t in declared_tools(body)}
    candidates = [tools[n] for n in _SHELL_NAMES if n in tools]
    candidates += [t for n, t in tools.items() if ("shell" in n or "bash" in n) and t not in candidates]
    for tool in candidates:
        parameters = tool["parameters"] if isinstance(tool["parameters"], dict) else {}
        props = _props(parameters)
        prop = next((p for p in _COMMAND_PROPS if p in props), None)
        if prop is None:
            required = [p for p in parameters.get("required") or [] if isinstance(p, str)]
            prop = next((p for p in required if _type(props.get(p)) == "string"), None)
        if prop is not None:
            return ShellTool(tool["name"], prop, _type(props.get(prop)) == "array", parameters)
    return None


def _props(parameters: dict[str, Any]) -> dict[str, Any]:
    props = parameters.get("properties")
    return props if isinstance(props, dict) else {}


def _type(schema: Any) -> str | None:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return kind if isinstance(kind, str) else None


def step_command(step: int) -> str:
    """The shell command of step ``step`` (1-based)."""
    return f"echo step-{step} > step-{step}.txt"


def step_arguments(tool: ShellTool, step: int) -> dict[str, Any]:
    """Arguments for ``tool`` running step ``step``: the command, plus every other required property
    (strings get a short description, booleans false, numbers a generous timeout)."""
    command = step_command(step)
    arguments: dict[str, Any] = {tool.prop: ["bash", "-lc", command] if tool.array else command}
    props = _props(tool.parameters)
    for name in tool.parameters.get("required") or []:
        if not isinstance(name, str) or name in arguments:
            continue
        kind = _type(props.get(name))
        arguments[name] = _DEFAULTS.get(kind, f"Write step-{step}.txt")
    return arguments


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_text(part.get("text") if isinstance(part, dict) else part) for part in content)
    return "" if content is None else json.dumps(content, default=str)


def steps_done(body: dict[str, Any]) -> set[int]:
    """Step numbers the history shows done (see the module docstring)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    answered: dict[str, str] = {}
    for message in messages:
        if message.get("role") == "tool" and isinstance(message.get("tool_call_id"), str):
            answered[message["tool_call_id"]] = _text(message.get("content"))
    done: set[int] = set()
    for message in messages:
        if message.get("role") != "assistant" or not isinstance(message.get("tool_calls"), list):
            continue
        for call in message["tool_calls"]:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or call.get("id") not in answered:
                continue
            raw = function.get("arguments")
            try:
                arguments = json.loads(raw) if isinstance(raw, str) else raw
            except json.JSONDecodeError:
                continue
            if not isinstance(arguments, dict) or _ERROR.search(answered[call["id"]]):
                continue
            done.update(int(n) for n in _STEP.findall(json.dumps(arguments)))
    return done


def next_step(body: dict[str, Any], steps: int) -> int | None:
    """The first step in 1..``steps`` not done, or None when all are."""
    done = steps_done(body)
    return next((n for n in range(1, steps + 1) if n not in done), None)


def task_turn(body: dict[str, Any], steps: int, rng: random.Random) -> Turn:
    """The clean turn: one shell call for the next step, ``done`` after the last, or a short text
    answer to a request without a shell tool."""
    turn = new_turn(body, rng)
    tool = find_shell_tool(body) if body.get("tool_choice") != "none" else None
    step = next_step(body, steps) if tool else None
    if tool is None:
        turn.content = ["Multi-step", " task."]
    elif step is None:
        turn.content = ["done"]
    else:
        turn.content = [f"Step {step}", f" of {steps}."]
        turn.calls = [make_call(tool.name, step_arguments(tool, step), rng, number=0)]
    finish(turn, body)
    return turn
