"""OpenAI Responses tools <-> chat.completions function tools (PROTOCOLS.md 3.3; openai-python
``src/openai/types/responses/tool_param.py``, ``custom_tool_param.py``, ``response_custom_tool_call.py``,
``response_output_item.py`` ``LocalShellCall``).

A chat upstream knows only function tools, so:

- ``function`` tools are declared as they are; ``namespace`` tools (Codex's ``multi_agent_v1``) are
  flattened to ``<namespace>__<name>``;
- ``custom`` (freeform) tools, which Codex uses for ``apply_patch`` with some models, become a
  function with one string parameter ``input`` (the format's grammar, when given, is added to the
  description so the model knows the syntax); the upstream's ``{"input": "..."}`` goes back to the
  client as a ``custom_tool_call`` item whose ``input`` is that raw string;
- ``local_shell`` becomes a function ``local_shell`` whose parameters are the fields of
  ``LocalShellCall.action`` (``command`` argv list, ``working_directory``, ``timeout_ms``, ``env``,
  ``user``); its calls go back as ``local_shell_call`` items with ``action.type: "exec"``;
- hosted tools (``web_search``, ``file_search``, ``code_interpreter``, ``computer_use_preview``,
  ``image_generation``, ``mcp``, ``shell``, ``apply_patch`` …) run on OpenAI's side or need item
  types a chat upstream cannot produce: left out and reported.

``ToolDeclarations`` translates ``tools`` / ``tool_choice`` and keeps ``tool_names``: upstream name
-> ``ClientTool(namespace, name, kind)`` for every tool whose name changed or whose kind is not
``function``. The emitter reads it to restore names, namespaces and item types.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from proxy.guard.protocols.translate import (
    TranslationError,
    optional_bool,
    require_dict,
    require_list,
    require_str,
    upstream_tool_name,
)

#: Separator between a namespace and a tool name in flattened names.
NAMESPACE_SEPARATOR = "__"
#: The one parameter of the function a custom tool is declared as.
CUSTOM_INPUT = "input"
#: The function ``local_shell`` is declared as.
LOCAL_SHELL = "local_shell"
LOCAL_SHELL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                    "description": 'The program and its arguments, e.g. ["bash", "-lc", "ls -la"].'},
        "working_directory": {"type": "string", "description": "Directory to run the command in."},
        "timeout_ms": {"type": "integer", "minimum": 1, "description": "Time limit in milliseconds."},
        "env": {"type": "object", "additionalProperties": {"type": "string"},
                "description": "Environment variables to set."},
        "user": {"type": "string", "description": "User to run the command as."},
    },
    "required": ["command"],
    "additionalProperties": False,
}
_ACTION_KEYS = ("command", "working_directory", "timeout_ms", "env", "user")


class ClientTool(NamedTuple):
    """What the client declared behind one upstream function name."""

    namespace: str | None
    name: str
    kind: str = "function"  # "function" | "custom" | "local_shell"


def client_tool(value: Any, upstream: str) -> ClientTool:
    """``tool_names[upstream]`` as a ``ClientTool`` (a plain ``(namespace, name)`` pair is a function)."""
    if isinstance(value, ClientTool):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return ClientTool(value[0], value[1])
    return ClientTool(None, upstream)


def flat_tool_name(namespace: str | None, name: str) -> str:
    """The upstream name of tool ``name`` (inside ``namespace`` when given)."""
    return upstream_tool_name(f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name)


def custom_arguments(text: str) -> str:
    """The function-call arguments that stand for a custom tool call's raw ``input``."""
    return json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)


def custom_input(arguments: str) -> str:
    """A custom tool call's raw ``input`` from the (validated) arguments of its function call."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return arguments
    text = value.get(CUSTOM_INPUT) if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments


def local_shell_arguments(action: dict[str, Any]) -> str:
    """The function-call arguments for a ``local_shell_call`` item's ``action``."""
    return json.dumps({k: action[k] for k in _ACTION_KEYS if action.get(k) is not None}, ensure_ascii=False)


def local_shell_action(arguments: str) -> dict[str, Any]:
    """The ``action`` of a ``local_shell_call`` item for the (validated) arguments of its function call."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        value = {}
    value = value if isinstance(value, dict) else {}
    command = value.get("command")
    action: dict[str, Any] = {"type": "exec", "command": command if isinstance(command, list) else [],
                              "env": value.get("env") if isinstance(value.get("env"), dict) else {}}
    for key in ("working_directory", "timeout_ms", "user"):
        action[key] = value.get(key)
    return action


class ToolDeclarations:
    """``tools`` and ``tool_choice`` of one request; collects dropped entries and ``tool_names``."""

    def __init__(self, dropped: list[str]) -> None:
        self.dropped = dropped
        self.tool_names: dict[str, ClientTool] = {}

    def name(self, namespace: str | None, name: str, kind: str = "function") -> str:
        """The upstream name for tool ``name`` of ``kind`` in ``namespace``, remembering any change."""
        upstream = LOCAL_SHELL if kind == "local_shell" else flat_tool_name(namespace, name)
        if upstream != name or namespace or kind != "function":
            self.tool_names[upstream] = ClientTool(namespace, name, kind)
        return upstream

    def tools(self, body: dict[str, Any]) -> dict[str, Any]:
        """``tools``, ``tool_choice`` and ``parallel_tool_calls`` (omitted when no tool is left)."""
        tools: list[dict[str, Any]] = []
        for i, tool in enumerate(require_list(body.get("tools") or [], "tools")):
            tools.extend(self.tool(require_dict(tool, f"tools[{i}]"), f"tools[{i}]"))
        choice = self.tool_choice(body.get("tool_choice"))
        parallel = optional_bool(body, "parallel_tool_calls")
        if not tools:
            return {}
        out: dict[str, Any] = {"tools": tools}
        if choice is not None:
            out["tool_choice"] = choice
        if parallel is not None:
            out["parallel_tool_calls"] = parallel
        return out

    def tool(self, tool: dict[str, Any], where: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """One declared tool as chat function tools (a namespace yields one per member)."""
        kind = tool.get("type")
        if kind == "function":
            return [self.function_tool(tool, where, namespace)]
        if kind == "custom":
            return [self.custom_tool(tool, where, namespace)]
        if kind == "local_shell" and namespace is None:
            return [{"type": "function", "function": {
                "name": self.name(None, LOCAL_SHELL, "local_shell"), "parameters": LOCAL_SHELL_PARAMETERS,
                "description": "Run a command on the user's machine and get its output."}}]
        if kind == "namespace" and namespace is None:
            inner = require_str(tool.get("name"), f"{where}.name")
            members = require_list(tool.get("tools") or [], f"{where}.tools")
            return [t for j, member in enumerate(members)
                    for t in self.tool(require_dict(member, f"{where}.tools[{j}]"), f"{where}.tools[{j}]", inner)]
        self.dropped.append(f"{where} ({kind})")
        return []

    def function_tool(self, tool: dict[str, Any], where: str, namespace: str | None) -> dict[str, Any]:
        """A ``function`` tool (flat in Responses) as a chat function tool."""
        name = require_str(tool.get("name"), f"{where}.name")
        parameters = tool.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        function: dict[str, Any] = {"name": self.name(namespace, name),
                                    "parameters": require_dict(parameters, f"{where}.parameters")}
        description = tool.get("description")
        if isinstance(description, str) and description:
            function["description"] = description
        return {"type": "function", "function": function}

    def custom_tool(self, tool: dict[str, Any], where: str, namespace: str | None) -> dict[str, Any]:
        """A ``custom`` (freeform) tool as a function with one string parameter ``input``."""
        name = require_str(tool.get("name"), f"{where}.name")
        description = tool.get("description") if isinstance(tool.get("description"), str) else ""
        fmt = tool.get("format")
        if fmt is not None:
            fmt = require_dict(fmt, f"{where}.format")
            if fmt.get("type") == "grammar":
                syntax = fmt.get("syntax") if isinstance(fmt.get("syntax"), str) else "lark"
                definition = require_str(fmt.get("definition"), f"{where}.format.definition")
                description = (f"{description}\n\n" if description else "") + (
                    f"The `{CUSTOM_INPUT}` text must follow this {syntax} grammar:\n{definition}")
            elif fmt.get("type") != "text":
                raise TranslationError(f"`{where}.format.type` must be text or grammar", param=f"{where}.format.type")
        parameters = {"type": "object", "properties": {CUSTOM_INPUT: {
            "type": "string", "description": "The raw input of the tool (free-form text, not JSON)."}},
            "required": [CUSTOM_INPUT], "additionalProperties": False}
        function: dict[str, Any] = {"name": self.name(namespace, name, "custom"), "parameters": parameters}
        if description:
            function["description"] = description
        return {"type": "function", "function": function}

    def tool_choice(self, choice: Any) -> Any:
        """The chat ``tool_choice`` for a Responses ``tool_choice`` (None: leave the default)."""
        if choice is None or choice in ("auto", "none", "required"):
            return choice
        if isinstance(choice, str):
            raise TranslationError("`tool_choice` must be auto, none, required or an object", param="tool_choice")
        choice = require_dict(choice, "tool_choice")
        kind = choice.get("type")
        if kind in ("function", "custom"):
            name = require_str(choice.get("name"), "tool_choice.name")
            namespace = choice.get("namespace") if isinstance(choice.get("namespace"), str) else None
            return {"type": "function", "function": {"name": self.name(namespace, name, str(kind))}}
        if kind == "local_shell":
            return {"type": "function", "function": {"name": self.name(None, LOCAL_SHELL, "local_shell")}}
        if kind == "allowed_tools" and choice.get("mode") in ("auto", "required"):
            self.dropped.append("tool_choice.tools")
            return choice["mode"]
        self.dropped.append(f"tool_choice ({kind})")
        return None
