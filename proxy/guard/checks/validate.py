"""Validate a finished turn against the tools the client declared, applying allowed repairs.

A tool call reaches the client only when its name is declared and its arguments are a JSON object
that satisfies the declared JSON Schema (ARCHITECTURE.md, invariants). Everything else is a fatal
finding (``Action.RETRY``); every repair is a ``Severity.WARNING`` / ``Action.REPAIRED`` finding.

Argument serialisation: valid arguments are re-serialised as strict, compact JSON,
``json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)``. Compact so
every call has one canonical text (the emitter slices it into deltas); ``ensure_ascii=False``
because the SSE envelope is ASCII-escaped anyway (PROTOCOLS.md 0.7) and the argument string a
client sees after decoding stays the model's own text. Numbers pass through Python ``float``
(what JavaScript and Python clients parse them to anyway); duplicate keys keep the last value.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from cachetools import LRUCache
from jsonschema import Draft7Validator, Draft202012Validator
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from proxy.guard.checks.repair import (
    REPAIR_KINDS,
    TOKEN_SUFFIX_READING,
    parse_arguments,
    read_name,
    resolve_name,
    unwrap_double_encoded,
)
from proxy.guard.checks.schema_bounds import SchemaCost, measure, value_nodes
from proxy.guard.checks.schema_regex import safe_class, strip_backtracking_keywords
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from proxy.guard.policy import GuardPolicy, Repair
from proxy.guard.stream.integrity import has_lone_surrogate
from proxy.guard.turn import ChoiceTurn, RequestSpec, ToolCall, Turn

_DETAIL_CAP = 500


def serialise_arguments(value: Any) -> str:
    """The canonical argument text for a parsed value (see the module docstring)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True, slots=True)
class Offloaded:
    """One validation too costly for the event loop: tool ``tool``, the schema's canonical text
    (``schema``, the cache key), the arguments' canonical text (``arguments``) and the estimate
    (``cost x nodes(arguments)``, ``proxy.guard.checks.schema_bounds``) that put it over the inline budget."""

    tool: str
    schema: str
    arguments: str
    estimate: float


@dataclass(frozen=True, slots=True)
class Verdict:
    """The result of an offloaded validation: ``kind`` ``valid`` | ``violation`` (``text`` = "message at
    path") | ``unusable`` (the schema fails at validation time; ``text`` = why) | ``unfinished`` (no
    result: the worker was killed at its deadline or died; ``text`` = why)."""

    kind: Literal["valid", "violation", "unusable", "unfinished"]
    text: str = ""


#: Verdicts already known, by ``(Offloaded.schema, Offloaded.arguments)``.
Verdicts = Mapping[tuple[str, str], Verdict]


class NeedVerdicts(Exception):
    """``check_turn`` cannot finish without the verdicts of ``checks`` (validations over the inline
    budget that ``verdicts`` did not answer): the caller gets them off the event loop and calls again."""

    def __init__(self, checks: tuple[Offloaded, ...]) -> None:
        super().__init__(f"{len(checks)} validations to run off the event loop")
        self.checks = checks


def check_turn(turn: Turn, request: RequestSpec, policy: GuardPolicy,
               verdicts: Verdicts | None = None) -> tuple[Turn, list[Finding]]:
    """Check every tool call of every choice; return the repaired turn and all findings.

    Per call (findings carry ``choice`` and ``slot``): truncated arguments under
    ``finish_reason: length`` (C24, ``TRUNCATED_ARGUMENTS_LENGTH``), undeclared / prefixed names
    (C46), argument repairs (C20, C21, C23), ``ARGUMENTS_NOT_JSON``, ``ARGUMENTS_NOT_OBJECT``,
    ``SCHEMA_VIOLATION`` (``jsonschema``; a broken client schema counts as none and is reported
    as ``TOOL_SCHEMA_INVALID`` info). Per choice: ``tool_choice`` and ``parallel_tool_calls``.
    The input turn is not mutated; calls that fail keep their raw name and arguments.

    A call whose estimated validation cost (schema cost x JSON values of the arguments) is above
    ``request.inline_cost`` is not validated here: its verdict comes from ``verdicts`` (an
    ``unfinished`` one is a fatal ``SCHEMA_VALIDATION_UNFINISHED``); without one, ``NeedVerdicts``
    lists every such call of the turn once all other calls are checked.
    """
    checker = _Checker(request, policy, verdicts or {})
    choices = [checker.choice(c) for c in turn.choices]
    if checker.pending:
        raise NeedVerdicts(tuple(dict.fromkeys(checker.pending)))
    return replace(turn, choices=choices), checker.findings


def offloaded_verdict(schema: str, arguments: str) -> Verdict:
    """Validate ``arguments`` (canonical JSON text of an object) against the schema with canonical text
    ``schema``: the work of one ``Offloaded`` check, for the validation pool's worker processes (and for
    sans-IO callers that validate inline). Never raises on any schema or arguments."""
    compiled = _compiled(schema)
    if compiled.validator is None:
        return Verdict("unusable", compiled.problem)
    try:
        problem = _violation(compiled.validator, json.loads(arguments))
    except Exception as exc:  # noqa: BLE001 -- e.g. an unresolvable $ref only fails at validation time
        return Verdict("unusable", _short(exc))
    return Verdict("valid") if problem is None else Verdict("violation", problem)


@dataclass(slots=True)
class _Checker:
    """Per-turn state: the request, the policy, findings so far, schemas already reported broken."""

    request: RequestSpec
    policy: GuardPolicy
    verdicts: Verdicts
    findings: list[Finding] = field(default_factory=list)
    broken: set[str] = field(default_factory=set)
    pending: list[Offloaded] = field(default_factory=list)

    def choice(self, choice: ChoiceTurn) -> ChoiceTurn:
        """The choice with every call checked, plus its ``tool_choice`` / parallel findings."""
        tool_calls = self.one_call_only(choice)
        calls = [self.call(call, choice, slot) for slot, call in enumerate(tool_calls)]
        self.tool_choice(choice.index, calls)
        return replace(choice, tool_calls=calls)

    def call(self, call: ToolCall, choice: ChoiceTurn, slot: int) -> ToolCall:
        """One call checked: the repaired call when valid, else the call unchanged."""
        raw = call.arguments if call.arguments.strip() else self.blank(choice.index, slot)
        parsed = parse_arguments(raw, self.policy)
        if not parsed.ok:
            self.not_json(choice, slot, parsed.error)
            return call
        name = self.name(call.name, choice.index, slot)
        if name is None:
            return call
        for fix in parsed.repairs:
            self.repaired(fix.repair, fix.detail, choice.index, slot)
        if not isinstance(parsed.value, dict):
            self.fatal(FindingKind.ARGUMENTS_NOT_OBJECT, f"arguments are a JSON {_json_type(parsed.value)}, "
                       "not an object", choice.index, slot)
            return call
        value = self.schema_check(name, parsed.value, choice.index, slot)
        if value is None:
            return call
        text = serialise_arguments(value)
        if has_lone_surrogate(text):  # a \ud800 escape inside the argument JSON: not text a client can encode
            self.fatal(FindingKind.LONE_SURROGATE, "a lone surrogate in the tool arguments", choice.index, slot)
            return call
        return ToolCall(call.id, name, text, dict(call.extra))

    def one_call_only(self, choice: ChoiceTurn) -> list[ToolCall]:
        """With ``parallel_tool_calls: false`` and the repair allowed, only the first call (or the first
        one a named ``tool_choice`` forces); otherwise every call (a violation is found later)."""
        calls = choice.tool_calls
        if self.request.parallel_tool_calls or len(calls) < 2 or not self.policy.allows(Repair.EXTRA_PARALLEL_CALLS):
            return calls
        forced = self.request.tool_choice
        names = [resolve_name(c.name, self.request.names, self.policy) for c in calls]
        keep = names.index(forced) if forced in names else 0
        self.repaired(Repair.EXTRA_PARALLEL_CALLS, f"parallel_tool_calls false: kept call {keep + 1} of {len(calls)}",
                      choice.index, 1 if keep == 0 else 0)
        return [calls[keep]]

    def blank(self, choice: int, slot: int) -> str:
        """Empty arguments mean no arguments (C19; normally the accumulator's job)."""
        self.findings.append(Finding(FindingKind.EMPTY_ARGUMENTS_FOR_NO_ARG_TOOL, Severity.INFO,
                                     Action.NORMALIZED, "empty arguments read as {}", choice, slot))
        return "{}"

    def not_json(self, choice: ChoiceTurn, slot: int, error: str) -> None:
        """Unparseable arguments: truncation when the choice hit the length limit (C24)."""
        if choice.finish_reason == "length":
            self.fatal(FindingKind.TRUNCATED_ARGUMENTS_LENGTH,
                       f"arguments cut off by finish_reason length ({error})", choice.index, slot)
        else:
            self.fatal(FindingKind.ARGUMENTS_NOT_JSON, f"arguments are not JSON ({error})",
                       choice.index, slot)

    def name(self, name: str, choice: int, slot: int) -> str | None:
        """The declared name ``name`` resolves to, reporting a repair or a fatal finding."""
        resolved = resolve_name(name, self.request.names, self.policy)
        if resolved is None:
            self.fatal(FindingKind.UNDECLARED_OR_PREFIXED_TOOL_NAME,
                       f"tool {_quote(name)} is not declared", choice, slot)
        elif resolved != name:
            reading = read_name(name, self.request.names)
            detail = reading.detail(f"tool {_quote(name)}") + f", resolved to {_quote(resolved)}"
            if reading.chosen is not None and TOKEN_SUFFIX_READING in reading.chosen.how:
                self.findings.append(Finding(FindingKind.TOOL_NAME_SPECIAL_TOKEN_SUFFIX, Severity.WARNING,
                                             Action.REPAIRED, detail[:_DETAIL_CAP], choice, slot))
            else:
                self.repaired(Repair.NAME_PREFIX, detail[:_DETAIL_CAP], choice, slot)
        return resolved

    def schema_check(self, name: str, value: dict[str, Any], choice: int, slot: int) -> dict[str, Any] | None:
        """``value`` unwrapped (C20) and validated against ``name``'s schema; None on a violation."""
        spec = next((t for t in self.request.tools if t.name == name), None)
        if spec is None or spec.parameters is None:
            return value
        key = _schema_key(spec.parameters)
        compiled = cached_key(key)
        if compiled is None and value_nodes(spec.parameters) > self.request.inline_check_nodes:
            validator = None  # not compiled yet (evicted) and costly to compile here: validated in the pool
        else:
            compiled = compiled or _compiled(key)
            if compiled.validator is None:
                self.unusable(name, compiled.problem, choice, slot)
                return value
            validator = compiled.validator
        if self.policy.allows(Repair.DOUBLE_ENCODED):
            value, paths = unwrap_double_encoded(value, spec.parameters if validator is None else validator.schema)
            for path in paths:
                self.repaired(Repair.DOUBLE_ENCODED, f"unwrapped JSON string at {path}", choice, slot)
        estimate = math.inf if compiled is None else compiled.cost.estimate(value)
        if validator is None or estimate > self.request.inline_cost:
            return self.offloaded(Offloaded(name, key, serialise_arguments(value), estimate), value, choice, slot)
        try:
            problem = _violation(validator, value)
        except Exception as exc:  # noqa: BLE001 -- e.g. an unresolvable $ref only fails at validation time
            self.unusable(name, _short(exc), choice, slot)
            return value
        if problem is None:
            return value
        self.fatal(FindingKind.SCHEMA_VIOLATION, f"{name}: {problem}", choice, slot)
        return None

    def offloaded(self, check: Offloaded, value: dict[str, Any], choice: int, slot: int) -> dict[str, Any] | None:
        """A call over the inline budget: its verdict from ``verdicts``, else noted as pending."""
        verdict = self.verdicts.get((check.schema, check.arguments))
        if verdict is None:
            self.pending.append(check)
            return value
        if verdict.kind == "violation":
            self.fatal(FindingKind.SCHEMA_VIOLATION, f"{check.tool}: {verdict.text}", choice, slot)
            return None
        if verdict.kind == "unfinished":
            self.fatal(FindingKind.SCHEMA_VALIDATION_UNFINISHED,
                       f"{check.tool}: arguments not validated ({verdict.text}; estimated cost "
                       f"{_count(check.estimate)})", choice, slot)
            return None
        if verdict.kind == "unusable":
            self.unusable(check.tool, verdict.text, choice, slot)
        return value

    def unusable(self, name: str, problem: str, choice: int, slot: int) -> None:
        """Report (once per tool) a client schema that cannot be used: the call goes unvalidated."""
        if name not in self.broken:
            self.broken.add(name)
            self.findings.append(Finding(FindingKind.TOOL_SCHEMA_INVALID, Severity.INFO, Action.IGNORED,
                                         f"{name}: schema not usable, not validated ({problem})",
                                         choice, slot))

    def tool_choice(self, choice: int, calls: list[ToolCall]) -> None:
        """``tool_choice`` (required / none / a named function) and ``parallel_tool_calls``."""
        wanted = self.request.tool_choice
        if wanted == "required" and not calls:
            self.fatal(FindingKind.TOOL_CHOICE_VIOLATION, "tool_choice required but no tool call", choice)
        elif wanted == "none" and calls:
            self.fatal(FindingKind.TOOL_CHOICE_VIOLATION, "tool_choice none but a tool was called", choice, 0)
        elif wanted not in ("auto", "required", "none") and all(c.name != wanted for c in calls):
            self.fatal(FindingKind.TOOL_CHOICE_VIOLATION, f"tool_choice forces {_quote(wanted)}, not called",
                       choice)
        if not self.request.parallel_tool_calls and len(calls) > 1:
            self.fatal(FindingKind.PARALLEL_TOOL_CALLS_VIOLATION,
                       f"parallel_tool_calls false but {len(calls)} calls", choice, 1)

    def repaired(self, repair: Repair, detail: str, choice: int, slot: int) -> None:
        """Record one applied repair."""
        self.findings.append(Finding(REPAIR_KINDS[repair], Severity.WARNING, Action.REPAIRED, detail,
                                     choice, slot))

    def fatal(self, kind: FindingKind, detail: str, choice: int, slot: int | None = None) -> None:
        """Record a finding that makes the attempt unusable."""
        self.findings.append(Finding(kind, Severity.ERROR, Action.RETRY, detail[:_DETAIL_CAP], choice, slot))


def arguments_accepted(request: RequestSpec, policy: GuardPolicy, name: str, value: dict[str, Any]) -> bool:
    """True when ``value`` (parsed arguments) is valid for tool ``name`` as ``check_turn`` would judge it:
    the name resolves to a declared tool (policy repairs allowed) and the schema accepts the value after
    the allowed C20 unwrapping. A tool without a usable schema accepts any object, and so does a schema
    that fails at validation time (``check_turn`` reports it). Within the schema bounds only: a schema not
    compiled yet and costly to compile, or a validation over the request's inline budget, accepts too
    (the delivered reading is then validated in the pool, ``proxy.relay.schema_pool``). Never raises."""
    resolved = resolve_name(name, request.names, policy)
    if resolved is None:
        return False
    spec = next((t for t in request.tools if t.name == resolved), None)
    if spec is None or spec.parameters is None:
        return True
    key = _schema_key(spec.parameters)
    compiled = cached_key(key)
    if compiled is None:
        if value_nodes(spec.parameters) > request.inline_check_nodes:
            return True
        compiled = _compiled(key)
    validator = compiled.validator
    if validator is None:
        return True
    if policy.allows(Repair.DOUBLE_ENCODED):
        value, _ = unwrap_double_encoded(value, validator.schema)
    try:
        if compiled.cost.estimate(value) > request.inline_cost:
            return True
        return _violation(validator, value) is None
    except Exception:  # noqa: BLE001 -- e.g. an unresolvable $ref: the call goes unvalidated, as in check_turn
        return True


def _schema_key(schema: dict[str, Any]) -> str:
    """A cache key for a schema: its canonical JSON text (sorted keys, compact, not ASCII-escaped)."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)


#: Memory of a compiled schema per byte of its canonical JSON text: the validator (measured with
#: ``tracemalloc`` at 4.4 to 6 bytes per byte of text, from a 400,000-entry enum to 200 plain
#: properties) plus the key text itself, rounded up.
BYTES_PER_SCHEMA_BYTE = 8
#: Default bound of the compiled-schema cache (``configure_cache``; settings ``SCHEMA_CACHE_BYTES``).
DEFAULT_CACHE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CompiledSchema:
    """A client schema ready to validate with: ``key`` its canonical JSON text, ``validator`` (None when the
    schema is unusable, ``problem`` says why), ``cost`` its static cost (``schema_bounds.measure``;
    whose ``estimate(arguments)`` bounds a validation's work) and ``weight``, its estimated memory in bytes."""

    key: str
    validator: Validator | None
    problem: str
    cost: SchemaCost

    @property
    def weight(self) -> int:
        """Estimated bytes held while cached (``BYTES_PER_SCHEMA_BYTE`` x the key's length)."""
        return BYTES_PER_SCHEMA_BYTE * len(self.key)


def _weight(entry: CompiledSchema) -> int:
    return entry.weight


_cache_lock = threading.Lock()
_cache: LRUCache[str, CompiledSchema] = LRUCache(maxsize=DEFAULT_CACHE_BYTES, getsizeof=_weight)


def configure_cache(max_bytes: int) -> None:
    """Bound the compiled-schema cache to ``max_bytes`` (estimated, ``CompiledSchema.weight``), emptying it.
    Least recently used schemas leave first; a schema heavier than the whole bound is never kept."""
    global _cache
    with _cache_lock:
        _cache = LRUCache(maxsize=max_bytes, getsizeof=_weight)


def cache_usage() -> tuple[int, int, int]:
    """The compiled-schema cache as ``(schemas, estimated bytes, bound in bytes)``."""
    with _cache_lock:
        return len(_cache), int(_cache.currsize), int(_cache.maxsize)


_UNKNOWN_COST = SchemaCost(float("inf"), 0, 0, 0, 0, 0, 0, recursive=True)


def compile_schema(schema: dict[str, Any], check: SchemaCheck | None = None) -> CompiledSchema:
    """The compiled (and cached) form of a client's ``parameters`` schema; never raises. ``check``: the
    schema's ``schema_check`` when it was run elsewhere (the validation pool), else it runs here."""
    return _compiled(_schema_key(schema), check)


def cached_schema(schema: dict[str, Any]) -> CompiledSchema | None:
    """The compiled form of ``schema`` when the cache holds it, else None (nothing is compiled)."""
    return cached_key(_schema_key(schema))


def cached_key(key: str) -> CompiledSchema | None:
    """The cached compiled schema of canonical text ``key`` (``schema_key``), else None."""
    with _cache_lock:
        return _cache.get(key)


def schema_key(schema: dict[str, Any]) -> str:
    """The canonical JSON text of a schema: the cache key, and what the validation pool is sent."""
    return _schema_key(schema)


#: The outcome of checking a schema against its draft's metaschema: the position of the validator class
#: that accepts it (in ``_validator_classes``), or -1 and why none does.
SchemaCheck = tuple[int, str]


def schema_check(key: str) -> SchemaCheck:
    """Check the schema with canonical text ``key`` against its draft's metaschema (``check_schema``).

    The costly part of compiling: ~0.05 ms per JSON value of the schema against draft 7's metaschema,
    ~0.4 ms against 2020-12's (its ``$dynamicRef``), so a large schema is checked in the validation
    pool (``proxy.relay.schema_pool.check_schemas``). Pure; never raises."""
    try:
        schema = json.loads(key)
    except ValueError:
        return -1, "the schema is not JSON"
    problem = "$schema is not a URI string"
    for position, cls in enumerate(_validator_classes(schema)):
        try:
            cls.check_schema(schema)
            return position, ""
        except Exception as exc:  # noqa: BLE001 -- client schemas are arbitrary; never crash on one
            problem = _short(exc)
    return -1, problem


def _compiled(key: str, check: SchemaCheck | None = None) -> CompiledSchema:
    """The cached ``CompiledSchema`` for the schema with canonical JSON text ``key`` (``_compile``)."""
    with _cache_lock:
        entry = _cache.get(key)
    if entry is not None:
        return entry
    entry = _compile(key, check)
    with _cache_lock:
        try:
            _cache[key] = entry
        except ValueError:  # heavier than the whole cache: used once, never kept
            pass
    return entry


def _compile(key: str, check: SchemaCheck | None = None) -> CompiledSchema:
    """A checked validator for the schema with JSON text ``key``, or why it is unusable, and its cost.

    Draft 2020-12 unless ``$schema`` names another; a schema without ``$schema`` that is only
    valid as draft 7 (tuple ``items``) gets draft 7. Never fetches remote ``$ref`` (jsonschema's
    ``referencing`` has no retriever configured), so validation stays I/O-free.
    """
    schema = json.loads(key)
    try:
        cost = measure(schema, text=key)
    except Exception:  # noqa: BLE001 -- e.g. a $ref cycle that never descends: validation cannot end
        return CompiledSchema(key, None, "a $ref cycle never descends into the arguments", _UNKNOWN_COST)
    position, problem = check if check is not None else schema_check(key)
    classes = _validator_classes(schema)
    if not 0 <= position < len(classes):
        return CompiledSchema(key, None, problem or "the schema is not valid", cost)
    try:
        # Patterns come from the client and strings from the model: match them in linear time.
        return CompiledSchema(key, safe_class(classes[position])(strip_backtracking_keywords(schema)), "", cost)
    except Exception as exc:  # noqa: BLE001 -- client schemas are arbitrary; never crash on one
        return CompiledSchema(key, None, _short(exc), cost)


def _validator_classes(schema: Any) -> list[type[Validator]]:
    """The validator classes to try for ``schema``, by its ``$schema`` (none when that is not text)."""
    declared = schema.get("$schema") if isinstance(schema, dict) else None
    if declared is None:
        return [Draft202012Validator, Draft7Validator]
    return [validator_for(schema, default=Draft202012Validator)] if isinstance(declared, str) else []


def _violation(validator: Validator, value: dict[str, Any]) -> str | None:
    """The most relevant validation error for ``value`` ("message at path"), or None when valid.

    Raises whatever the validator raises on a schema that only fails at validation time.
    """
    error = best_match(validator.iter_errors(value))
    return None if error is None else f"{_short(error.message)} at {error.json_path}"


def _count(estimate: float) -> str:
    """An estimate for a finding: a whole number, or "unknown" (a recursive or uncompiled schema)."""
    return "unknown" if math.isinf(estimate) else f"{estimate:.0f}"


def _short(exc: object) -> str:
    """The first line of an error text, capped."""
    text = getattr(exc, "message", None) or str(exc)
    return str(text).splitlines()[0][:200] if str(text) else type(exc).__name__


def _json_type(value: Any) -> str:
    """The JSON type name of a parsed value."""
    return _JSON_TYPES.get(type(value), "value")


_JSON_TYPES = {list: "array", str: "string", bool: "boolean", int: "number", float: "number",
               type(None): "null"}


def _quote(name: str) -> str:
    """``name`` quoted and capped for a finding sentence."""
    return json.dumps(name[:100])


def tool_declaration_problem(spec: RequestSpec) -> tuple[str, str] | None:
    """Why a request's tool declarations (``spec``) can never be satisfied, as ``(message, param)``, or
    None. Caught before any upstream call: retrying the upstream cannot fix the client's request.

    Two tools with one name (which schema would a call be checked against?), and a ``tool_choice``
    that forces an undeclared function or requires a call with no tools declared (OpenAI answers
    both with 400, PROTOCOLS.md 1.1).
    """
    seen: set[str] = set()
    for tool in spec.tools:
        if tool.name in seen:
            return f"two tools are named {tool.name!r}", "tools"
        seen.add(tool.name)
    if spec.tool_choice not in ("auto", "none", "required") and spec.tool_choice not in seen:
        return f"tool_choice forces {spec.tool_choice!r}, which is not among the declared tools", "tool_choice"
    if spec.tool_choice == "required" and not spec.tools:
        return "tool_choice is 'required' but no tools are declared", "tool_choice"
    return None
