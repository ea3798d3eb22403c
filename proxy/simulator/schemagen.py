"""Plausible tool-call arguments generated from a tool's JSON Schema.

The generator covers what coding-agent tools declare in practice: objects with required and
optional properties, strings (enums, ``const``, ``format``, length bounds), integers and numbers
with bounds, booleans, arrays (``items``, ``minItems``/``maxItems``, ``uniqueItems``), nested
objects, ``anyOf``/``oneOf``/``allOf`` (first usable branch) and local ``$ref`` (``#/$defs/...``,
``#/definitions/...``). ``pattern`` is not honoured. Output is deterministic for a given
``random.Random`` state.
"""

from __future__ import annotations

import random
from typing import Any

#: Values that read like real agent arguments, chosen by property name.
_BY_NAME: dict[str, tuple[str, ...]] = {
    "path": ("src/app.py", "README.md", "docs/notes.txt", "tests/test_app.py", "pyproject.toml"),
    "file": ("src/app.py", "README.md", "config/settings.py"),
    "command": ("ls -la", "git status", "pytest -q", "cat README.md", "grep -rn TODO src"),
    "cmd": ("ls -la", "git diff --stat", "make test"),
    "city": ("Paris", "Berlin", "Tokyo", "Lima", "Nairobi"),
    "location": ("Paris, France", "Berlin, Germany", "Tokyo, Japan"),
    "url": ("https://example.com/docs", "https://example.org/api/v1/items"),
    "query": ("retry policy", "stream parser", "tool call schema"),
    "pattern": ("TODO", "def main", "import json"),
    "content": ("print('hello')\n", "# Notes\n\nFirst draft.\n", "value = 42\n"),
    "text": ("Looks good to me.", "Fixed the failing test.", "Updated the docs."),
    "message": ("fix: handle empty input", "docs: explain retries", "feat: add parser"),
}
_WORDS = ("alpha", "bravo", "delta", "parser", "stream", "retry", "config", "module", "value", "report")
_FORMATS = {
    "date": "2026-01-15",
    "date-time": "2026-01-15T10:00:00Z",
    "time": "10:00:00",
    "email": "dev@example.com",
    "uri": "https://example.com/resource",
    "uuid": "123e4567-e89b-42d3-a456-426614174000",
    "hostname": "example.com",
    "ipv4": "192.0.2.10",
}
_MAX_DEPTH = 6


def generate_arguments(parameters: dict[str, Any] | None, rng: random.Random) -> dict[str, Any]:
    """Return an arguments object for a tool whose ``function.parameters`` is ``parameters``.

    A missing or empty schema means a tool without parameters: ``{}``.
    """
    if not parameters:
        return {}
    value = generate_value(parameters, rng, root=parameters)
    return value if isinstance(value, dict) else {}


def generate_value(schema: Any, rng: random.Random, *, name: str = "", root: Any = None, depth: int = 0) -> Any:
    """Return one value that satisfies ``schema`` (best effort; see the module docstring)."""
    if not isinstance(schema, dict):
        return _string(name, {}, rng)
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for combinator in ("anyOf", "oneOf"):
        branches = [b for b in schema.get(combinator) or [] if _resolve(b, root).get("type") != "null"]
        if branches:
            return generate_value(branches[0], rng, name=name, root=root, depth=depth)
    if schema.get("allOf"):
        return generate_value(_merge_all_of(schema, root), rng, name=name, root=root, depth=depth)
    return _by_type(_pick_type(schema), schema, rng, name=name, root=root, depth=depth)


def _by_type(kind: str, schema: dict[str, Any], rng: random.Random, **ctx: Any) -> Any:
    if kind == "object":
        return _object(schema, rng, root=ctx["root"], depth=ctx["depth"])
    if kind == "array":
        return _array(schema, rng, name=ctx["name"], root=ctx["root"], depth=ctx["depth"])
    if kind == "integer":
        return int(_number(schema, rng, integer=True))
    if kind == "number":
        return _number(schema, rng, integer=False)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(ctx["name"], schema, rng)


def _pick_type(schema: dict[str, Any]) -> str:
    declared = schema.get("type")
    if isinstance(declared, list):
        declared = next((t for t in declared if t != "null"), "null")
    if isinstance(declared, str):
        return declared
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _resolve(schema: Any, root: Any) -> dict[str, Any]:
    """Follow local ``$ref`` pointers (JSON Pointer into the root schema)."""
    seen = 0
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and seen < 16:
        ref = schema["$ref"]
        target: Any = root
        if not ref.startswith("#"):
            return {}
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, dict) else None
        schema, seen = target if isinstance(target, dict) else {}, seen + 1
    return schema if isinstance(schema, dict) else {}


def _merge_all_of(schema: dict[str, Any], root: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        part = _resolve(part, root)
        merged.setdefault("type", part.get("type"))
        merged["properties"] = {**merged.get("properties", {}), **part.get("properties", {})}
        merged["required"] = [*merged.get("required", []), *part.get("required", [])]
    return merged


def _object(schema: dict[str, Any], rng: random.Random, *, root: Any, depth: int) -> dict[str, Any]:
    properties = schema.get("properties")
    if not isinstance(properties, dict) or depth >= _MAX_DEPTH:
        return {}
    required = set(schema.get("required") or [])
    out: dict[str, Any] = {}
    for key, sub in properties.items():
        # Optional properties appear about half the time, as models do with them.
        if key in required or rng.random() < 0.5:
            out[key] = generate_value(sub, rng, name=key, root=root, depth=depth + 1)
    return out


def _array(schema: dict[str, Any], rng: random.Random, *, name: str, root: Any, depth: int) -> list[Any]:
    low = int(schema.get("minItems", 1))
    high = int(schema.get("maxItems", max(low, 3)))
    count = rng.randint(low, max(low, min(high, low + 2)))
    items = schema.get("items", {})
    if depth >= _MAX_DEPTH:
        return []
    out: list[Any] = []
    for _ in range(count * 4 if schema.get("uniqueItems") else count):
        value = generate_value(items, rng, name=name.rstrip("s"), root=root, depth=depth + 1)
        if schema.get("uniqueItems") and value in out:
            continue
        out.append(value)
        if len(out) == count:
            break
    return out


def _number(schema: dict[str, Any], rng: random.Random, *, integer: bool) -> float:
    low = schema.get("minimum", schema.get("exclusiveMinimum", 0 if integer else 0.0))
    high = schema.get("maximum", schema.get("exclusiveMaximum", low + 100))
    if "exclusiveMinimum" in schema and "minimum" not in schema:
        low += 1 if integer else 0.01
    if "exclusiveMaximum" in schema and "maximum" not in schema:
        high -= 1 if integer else 0.01
    if integer:
        return rng.randint(int(low), max(int(low), int(high)))
    return round(rng.uniform(float(low), float(max(low, high))), 2)


def _string(name: str, schema: dict[str, Any], rng: random.Random) -> str:
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS:
        return _FORMATS[fmt]
    lowered = name.lower()
    choices = next((v for k, v in _BY_NAME.items() if k in lowered), None)
    value = rng.choice(choices) if choices else " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
    min_length, max_length = int(schema.get("minLength", 0)), schema.get("maxLength")
    if len(value) < min_length:
        value = value + "x" * (min_length - len(value))
    if isinstance(max_length, int):
        value = value[:max_length]
    return value
