"""Argument values that arrive as text or as Python literals, typed by the declared JSON Schema.

XML-ish dialects (Qwen3-Coder ``<parameter=k>``, MiniMax / DSML ``<parameter name=k>``, GLM
``<arg_value>``, Step3, Seed-OSS, Kimi K3, MiniCPM) write every value as raw text: a string stays
exactly the text, ``integer`` / ``number`` / ``boolean`` / ``null`` / ``object`` / ``array`` are
parsed (JSON first, then Python literals). This follows the coercion the servers themselves do
(vLLM ``qwen3coder_tool_parser._convert_param_value``, ``hy_v3_tool_parser._parse_value``): with a
union type the non-string members are tried in order boolean, integer, number, container, and the
text is kept when none fits (validation then judges it). Python-call dialects (pythonic, LFM2,
Olmo 3, Gemma ``tool_code``) are read with ``ast``: literals only, never evaluated.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from proxy.guard.dialects.base import MarkupError

_INT = re.compile(r"\A[+-]?\d+\Z")
_MAX_LITERAL = 1_000_000  # characters: larger texts are not handed to ast


def schema_types(prop: Any) -> set[str]:
    """The JSON types a property schema admits (``type``, ``anyOf`` / ``oneOf`` members, ``enum``)."""
    if not isinstance(prop, dict):
        return set()
    t = prop.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    out: set[str] = set()
    for key in ("anyOf", "oneOf"):
        members = prop.get(key)
        if isinstance(members, list):
            for m in members:
                out |= schema_types(m)
    if not out and isinstance(prop.get("enum"), list):
        out = {_json_type(v) for v in prop["enum"]}
    return out


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}.get(type(value), "string")


def coerce(text: str, prop: Any, *, as_string: bool | None = None) -> Any:
    """``text`` typed by the property schema ``prop``; ``as_string`` is an explicit marker (DSML).

    Undeclared properties keep their text. Never raises.
    """
    if as_string:
        return text
    types = schema_types(prop)
    if not types:
        return _loose(text) if as_string is False else text
    stripped = text.strip()
    if "null" in types and stripped.lower() in ("null", "none"):
        return None
    for kind in ("boolean", "integer", "number", "object", "array"):
        if kind in types:
            ok, value = _as(kind, stripped)
            if ok:
                return value
    return text if "string" in types or not stripped else _loose(text)


def _as(kind: str, text: str) -> tuple[bool, Any]:
    if kind == "boolean":
        low = text.lower()
        return (low in ("true", "false")), low == "true"
    if kind == "integer":
        if _INT.match(text):
            return True, int(text)
        ok, value = _as("number", text)
        if ok and float(value).is_integer():
            return True, int(value)
        return False, None
    if kind == "number":
        try:
            value = float(text)
        except ValueError:
            return False, None
        if not math.isfinite(value):
            return False, None
        return True, int(value) if _INT.match(text) else value
    value = _loose(text)
    wanted = dict if kind == "object" else list
    return isinstance(value, wanted), value


def _loose(text: str) -> Any:
    """JSON, else a Python literal (``{'a': 1}``, ``True``), else the text."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return literal(text.strip())
    except MarkupError:
        return text


def literal(text: str) -> Any:
    """A Python literal (or JSON's ``true`` / ``false`` / ``null``) without evaluating code."""
    if len(text) > _MAX_LITERAL:
        raise MarkupError("literal too large")
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise MarkupError(f"not a literal ({type(exc).__name__})") from None
    return from_node(node)


_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def from_node(node: ast.AST) -> Any:
    """The value of a literal AST node; raises ``MarkupError`` for anything that would run code."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [from_node(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise MarkupError("dict unpacking is not a literal")
        return {_key(from_node(k)): from_node(v) for k, v in zip(node.keys, node.values, strict=True) if k}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = from_node(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    raise MarkupError(f"not a literal: {type(node).__name__}")


def _key(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def call_name(node: ast.AST) -> str:
    """The dotted name of a call target (``get_weather``, ``functions.get_weather``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{call_name(node.value)}.{node.attr}"
    raise MarkupError("a call target must be a name")


def py_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``[f(a=1), g(b="x")]``, ``f(a=1)`` or newline / ``;`` separated calls -> (name, kwargs).

    Only keyword arguments with literal values are accepted (the pythonic templates' syntax,
    vLLM ``pythonic_tool_parser``); anything else raises ``MarkupError``.
    """
    text = text.strip()
    if len(text) > _MAX_LITERAL:
        raise MarkupError("call list too large")
    try:
        tree = ast.parse(text, mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = _parse_lines(text)
    nodes: list[ast.AST] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            raise MarkupError("not a call list")
        value = stmt.value
        nodes.extend(value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value])
    if not nodes:
        raise MarkupError("empty call list")
    return [_one_call(n) for n in nodes]


def _parse_lines(text: str) -> ast.Module:
    """Olmo 3 writes one call per line inside ``<function_calls>``: join them as a list."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    try:
        return ast.parse("[" + ", ".join(lines) + "]", mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise MarkupError(f"not Python call syntax ({type(exc).__name__})") from None


def _one_call(node: ast.AST) -> tuple[str, dict[str, Any]]:
    if not isinstance(node, ast.Call):
        raise MarkupError("a list element is not a call")
    if node.args:
        raise MarkupError("positional arguments in a tool call")
    kwargs: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise MarkupError("**kwargs in a tool call")
        kwargs[kw.arg] = from_node(kw.value)
    return call_name(node.func), kwargs
