"""Deterministic, policy-gated repairs of tool-call names and argument texts.

Every repair here is exact: it either recovers the value the model meant, unambiguously, or does
nothing. There is no heuristic JSON completion (a truncated call must never become an executable
one, C24). Callers report each applied repair as a finding (``proxy.guard.checks.validate``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from proxy.guard.findings import FindingKind
from proxy.guard.policy import GuardPolicy, Repair
from proxy.guard.reading import PLAIN, Read, Reading, read

#: Chat-template namespaces models prepend to function names (C46: ``functions.run_shell``;
#: Gemini's ``default_api.``; ``tools.`` / ``tool.`` from Hermes-style templates).
NAME_PREFIXES = ("functions.", "default_api.", "tools.", "tool.")
#: Kimi K2's tool-call id shape leaking into the name: ``functions.get_weather:0``.
_KIMI_SUFFIX = re.compile(r":\d+\Z")


def resolve_name(name: str, names: frozenset[str], policy: GuardPolicy) -> str | None:
    """Map a called ``name`` onto a declared tool name, or None when it is not one.

    Exact match first. Else, when ``Repair.NAME_PREFIX`` is allowed, the name readings of
    ``read_name`` (the reading rule, ``proxy.guard.reading``): the result is used only if exactly one
    declared tool remains (C46: ``functions.run_shell`` -> ``run_shell``, ``toolbox.web.answer`` -> None).
    """
    if name in names:
        return name
    if not policy.allows(Repair.NAME_PREFIX):
        return None
    chosen = read_name(name, names).chosen
    return chosen.value if chosen is not None else None


#: Template decoration after a name: a special token and what follows (Harmony ``<|channel|>commentary``,
#: ``<|constrain|>json``, DeepSeek's full-width ``<｜tool▁sep｜>``), from the first ``<``.
_TOKEN_SUFFIX = re.compile(r"\s*<[|｜].*\Z", re.DOTALL)
#: Index decoration after a name: Kimi's ``:0``, and the same without its separator (``_0``, ``0``).
_INDEX_SUFFIXES = (("index suffix :N", _KIMI_SUFFIX), ("index suffix _N", re.compile(r"_\d+\Z")),
                   ("index suffix N", re.compile(r"(?<=[A-Za-z_])\d+\Z")))
#: Template prefixes without their separator (Kimi ids ``functions_read_file_0``, ``functionsrun_shell1``).
_BARE_PREFIXES = ("functions_", "functions")
#: What a reading that strips a special-token suffix is reported as (the other name readings: C46's kind).
TOKEN_SUFFIX_READING = "special-token suffix"  # noqa: S105 -- a reading name, not a secret


def read_name(name: str, names: frozenset[str]) -> Read[str]:
    """The name readings of ``name`` (the reading rule, ``proxy.guard.reading``): the plain name, then
    every combination of at most one special-token suffix cut, one index suffix cut and one template
    prefix cut (``NAME_PREFIXES``, then the separatorless Kimi prefixes), each valid when declared.
    Bounded: names longer than 256 characters get the plain reading only."""
    return read(_name_readings(name), names.__contains__)


def _name_readings(name: str) -> Iterator[Reading[str]]:
    yield Reading(PLAIN, name)
    if len(name) > 256:
        return
    stripped = name.strip()
    for how_t, t in (("", stripped), (TOKEN_SUFFIX_READING, _TOKEN_SUFFIX.sub("", stripped))):
        if how_t and t == stripped:
            continue
        indexed = [("", t)] + [(h, rx.sub("", t)) for h, rx in _INDEX_SUFFIXES if rx.search(t)]
        for how_i, i in indexed:
            prefixed = [("", i)] + [(f"prefix {p}", i[len(p):]) for p in (*NAME_PREFIXES, *_BARE_PREFIXES)
                                   if i.startswith(p) and len(i) > len(p)]
            for how_p, value in prefixed:
                how = ", ".join(h for h in (how_t, how_i, how_p) if h) or "whitespace"
                if value != name and value:
                    yield Reading(how, value)


#: The finding kind that reports each repair (``proxy.guard.findings``).
REPAIR_KINDS: dict[Repair, FindingKind] = {
    Repair.CONTROL_CHARACTERS: FindingKind.RAW_CONTROL_CHARACTERS_IN_ARGUMENTS,
    Repair.STRAY_ESCAPES: FindingKind.STRAY_ESCAPE_IN_ARGUMENTS,
    Repair.CODE_FENCE: FindingKind.CODE_FENCE_PREFIX_IN_ARGUMENTS,
    Repair.DOUBLE_ENCODED: FindingKind.NESTED_VALUES_DOUBLE_ENCODED,
    Repair.NAME_PREFIX: FindingKind.UNDECLARED_OR_PREFIXED_TOOL_NAME,
    Repair.LEAKED_MARKUP: FindingKind.LEAKED_MARKUP_UNPARSEABLE,
    Repair.EXTRA_PARALLEL_CALLS: FindingKind.PARALLEL_TOOL_CALLS_VIOLATION,
    Repair.MISSING_BRACE: FindingKind.ARGUMENTS_MISSING_BRACE,
}

#: A leading Markdown fence (```` ``` ````, ```` ```json ````) or the bare ``json`` tag a split fence
#: leaves behind (C23), directly before the JSON value.
_FENCE_HEAD = re.compile(r"\A\s*(?:```[ \t]*(?:json[a-z0-9]*)?|json)\s*(?=[{\[\"])", re.IGNORECASE)
_FENCE_TAIL = re.compile(r"(?<=[}\]\"])\s*```\s*\Z")
#: What a backslash escape outside a string stands for: literal ``\n`` between tokens is whitespace.
_STRAY_WHITESPACE = frozenset("nrt")


@dataclass(frozen=True, slots=True)
class Applied:
    """One repair applied to a call: which, and a sentence for the finding."""

    repair: Repair
    detail: str


@dataclass(frozen=True, slots=True)
class ParsedArguments:
    """The outcome of ``parse_arguments``.

    ``ok`` False means the text is not JSON even after the allowed repairs (``error`` says why);
    otherwise ``value`` is the parsed value (any JSON type) and ``repairs`` the repairs it needed.
    """

    ok: bool
    value: Any = None
    repairs: tuple[Applied, ...] = ()
    error: str = ""


def parse_arguments(raw: str, policy: GuardPolicy) -> ParsedArguments:
    """Parse tool-call argument text as strict JSON, applying the repairs ``policy`` allows.

    Repairs, each applied only when the text does not parse without it: code-fence residue
    (``Repair.CODE_FENCE``, C23), backslash escapes outside strings (``Repair.STRAY_ESCAPES``),
    raw control characters inside strings (``Repair.CONTROL_CHARACTERS``, C21: a lenient parse
    whose value the caller re-serialises strictly), and a whole object sent as a JSON string
    (``Repair.DOUBLE_ENCODED``). ``NaN`` / ``Infinity`` and out-of-range numbers are not JSON.
    Truncated text (C24) stays unparseable: nothing here completes JSON.
    """
    try:  # the common case, and the only one valid JSON ever takes: no text step runs on it
        parsed = ParsedArguments(True, _loads(raw, strict=True))
    except (ValueError, RecursionError):
        parsed = _repair_and_parse(raw, policy)
    if parsed.ok and isinstance(parsed.value, str) and policy.allows(Repair.DOUBLE_ENCODED):
        return _unwrap_top_level(parsed)
    return parsed


def _repair_and_parse(raw: str, policy: GuardPolicy) -> ParsedArguments:
    """Apply the allowed text steps that change ``raw``, then parse (leniently if allowed)."""
    text, applied = raw, []
    for repair, step in ((Repair.CODE_FENCE, strip_code_fence), (Repair.STRAY_ESCAPES, drop_stray_escapes)):
        fixed = step(text) if policy.allows(repair) else text
        if fixed != text:
            text = fixed
            applied.append(Applied(repair, _STEP_DETAILS[repair]))
    return _parse(text, policy, applied)


_STEP_DETAILS = {
    Repair.CODE_FENCE: "stripped Markdown code-fence residue around the arguments",
    Repair.STRAY_ESCAPES: "dropped backslash escapes outside JSON strings",
}


def _parse(text: str, policy: GuardPolicy, applied: list[Applied]) -> ParsedArguments:
    """Strict parse, then (when allowed) a parse that accepts raw control characters in strings."""
    try:
        return ParsedArguments(True, _loads(text, strict=True), tuple(applied))
    except (ValueError, RecursionError) as exc:
        error = str(exc)
    if not policy.allows(Repair.CONTROL_CHARACTERS):
        return ParsedArguments(False, error=error)
    try:
        value = _loads(text, strict=False)
    except (ValueError, RecursionError):
        return ParsedArguments(False, error=error)
    fix = Applied(Repair.CONTROL_CHARACTERS, "escaped raw control characters inside JSON strings")
    return ParsedArguments(True, value, (*applied, fix))


def _unwrap_top_level(parsed: ParsedArguments) -> ParsedArguments:
    """Arguments that are a JSON string holding an object: the object (parameters are objects)."""
    try:
        inner = _loads(parsed.value, strict=True)
    except (ValueError, RecursionError):
        return parsed
    if not isinstance(inner, dict):
        return parsed
    fix = Applied(Repair.DOUBLE_ENCODED, "unwrapped arguments sent as a JSON string holding the object")
    return ParsedArguments(True, inner, (*parsed.repairs, fix))


def _loads(text: str, *, strict: bool) -> Any:
    """``json.loads`` that rejects ``NaN``/``Infinity`` literals and numbers overflowing a double."""
    return json.loads(text, strict=strict, parse_constant=_reject_constant, parse_float=_finite_float)


def _reject_constant(name: str) -> Any:
    """Refuse the non-standard constants Python's json accepts (RFC 8259 has none)."""
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    """A JSON number as float; a value beyond double range cannot be re-serialised as JSON."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def strip_code_fence(text: str) -> str:
    """``text`` without a leading fence / ``json`` tag and a trailing fence (C23); else unchanged."""
    return _FENCE_TAIL.sub("", _FENCE_HEAD.sub("", text, count=1), count=1)


def drop_stray_escapes(text: str) -> str:
    """``text`` with backslashes outside JSON strings removed (``\\n``/``\\r``/``\\t`` become spaces).

    A text that is entirely escaped JSON (``{\\"a\\":1}``, no bare quote at all) is unescaped
    as JSON string content instead, which is exact. Strings are left byte-for-byte alone.
    """
    if "\\" not in text:
        return text
    whole = _unescape_whole(text)
    if whole is not None:
        return whole
    out: list[str] = []
    in_string = escaped = skip = False
    for i, ch in enumerate(text):
        if skip:
            skip = False
        elif in_string:
            out.append(ch)
            in_string, escaped = _string_step(ch, escaped)
        elif ch == "\\":
            nxt = text[i + 1 : i + 2]
            skip = nxt in _STRAY_WHITESPACE
            out.append(" " if skip else "")
        else:
            out.append(ch)
            in_string = ch == '"'
    return "".join(out)


def _string_step(ch: str, escaped: bool) -> tuple[bool, bool]:
    """(still inside the string, next char escaped) after ``ch`` inside a JSON string."""
    if escaped:
        return True, False
    if ch == "\\":
        return True, True
    return ch != '"', False


def _unescape_whole(text: str) -> str | None:
    """The unescaped text when ``text`` is escaped JSON with no bare quote, else None."""
    stripped = text.strip()
    if not stripped.startswith(('{\\"', '[\\"')) or _has_bare_quote(stripped):
        return None
    try:
        inner = json.loads('"' + stripped + '"', strict=False)
    except ValueError:
        return None
    return inner if isinstance(inner, str) else None


def _has_bare_quote(text: str) -> bool:
    """True when ``text`` has a double quote not preceded by a backslash."""
    return any(ch == '"' and (i == 0 or text[i - 1] != "\\") for i, ch in enumerate(text))


def unwrap_double_encoded(value: Any, schema: Any, path: str = "$") -> tuple[Any, list[str]]:
    """Schema-guided unwrapping of JSON-in-a-string values (C20), nested at any depth.

    Where ``schema`` asks for ``array`` / ``object`` (and not ``string``) and ``value`` is a string
    that parses strictly to that type, the parsed value replaces it. Recurses through
    ``properties``, ``additionalProperties``, ``items`` and ``prefixItems``. Returns the new value
    and the JSON paths unwrapped (empty when nothing changed; ``value`` is never mutated).
    """
    if not isinstance(schema, dict):
        return value, []
    unwrapped: list[str] = []
    if isinstance(value, str):
        value, done = _unwrap_string(value, _schema_types(schema))
        unwrapped += [path] if done else []
    if isinstance(value, dict):
        value, inner = _unwrap_members(value, schema, path)
    elif isinstance(value, list):
        value, inner = _unwrap_items(value, schema, path)
    else:
        inner = []
    return value, unwrapped + inner


def _schema_types(schema: dict[str, Any]) -> set[str]:
    """The JSON types a schema allows, from ``type`` and its ``anyOf``/``oneOf`` branches."""
    types: set[str] = set()
    for node in [schema, *_branches(schema)]:
        declared = node.get("type")
        listed = declared if isinstance(declared, list) else [declared]
        types.update(t for t in listed if isinstance(t, str))
    return types


def _branches(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The dict branches of ``anyOf`` / ``oneOf``."""
    branches: list[dict[str, Any]] = []
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        branches += [o for o in options if isinstance(o, dict)] if isinstance(options, list) else []
    return branches


def _unwrap_string(value: str, types: set[str]) -> tuple[Any, bool]:
    """Parse ``value`` when the schema wants another JSON type here and no string is allowed.

    An array/object (C20), or a scalar (a number, integer, boolean or null sent as its JSON text, e.g.
    ``"123"`` for an integer: SGLang's glm parsers, sgl-project/sglang#35564). A scalar is taken only
    when the string is exactly the JSON text of a value of a wanted type (no surrounding whitespace).
    """
    if "string" in types or not types & (set(_SCALARS) | {"array", "object"}):
        return value, False
    if value.lstrip()[:1] not in ("[", "{"):
        return _unwrap_scalar(value, types)
    try:
        parsed = _loads(value, strict=True)
    except (ValueError, RecursionError):
        return value, False
    kind = "array" if isinstance(parsed, list) else "object" if isinstance(parsed, dict) else ""
    return (parsed, True) if kind in types else (value, False)


#: A JSON scalar type -> does a parsed value have it (bool is not a number in JSON Schema).
_SCALARS: dict[str, Any] = {
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) in (int, float),
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}


def _unwrap_scalar(value: str, types: set[str]) -> tuple[Any, bool]:
    """``value`` parsed when it is exactly the JSON text of a scalar of one of ``types``."""
    if not value or len(value) > 64 or value != value.strip():
        return value, False
    try:
        parsed = _loads(value, strict=True)
    except (ValueError, RecursionError):
        return value, False
    ok = any(_SCALARS[t](parsed) for t in types if t in _SCALARS)
    return (parsed, True) if ok else (value, False)


def _unwrap_members(value: dict[str, Any], schema: dict[str, Any], path: str) -> tuple[Any, list[str]]:
    """Recurse into an object's members by ``properties`` / ``additionalProperties``."""
    declared = schema.get("properties")
    props: dict[str, Any] = declared if isinstance(declared, dict) else {}
    extra = schema.get("additionalProperties")
    out, done = dict(value), []
    for key, member in value.items():
        sub = props.get(key, extra if isinstance(extra, dict) else None)
        out[key], paths = unwrap_double_encoded(member, sub, f"{path}.{key}")
        done += paths
    return (out if done else value), done


def _unwrap_items(value: list[Any], schema: dict[str, Any], path: str) -> tuple[Any, list[str]]:
    """Recurse into an array's elements by ``prefixItems`` / ``items`` (draft-07 tuple ``items`` too)."""
    declared = schema.get("prefixItems")
    prefix: list[Any] = declared if isinstance(declared, list) else []
    items = schema.get("items")
    if isinstance(items, list):  # draft 4-7 tuple form; the rest follow additionalItems
        prefix, items = items, schema.get("additionalItems")
    out, done = list(value), []
    for i, element in enumerate(value):
        sub = prefix[i] if i < len(prefix) else items
        out[i], paths = unwrap_double_encoded(element, sub, f"{path}[{i}]")
        done += paths
    return (out if done else value), done
