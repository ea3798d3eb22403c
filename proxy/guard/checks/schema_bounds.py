"""Bounds on a client's tool schema, and the static cost of validating against it (sans-IO).

A client declares its tools' ``parameters`` as JSON Schema, and every tool call the upstream makes
is validated against it (``proxy.guard.checks.validate``). A small schema can still be very expensive to
validate: a chain of ``anyOf`` nodes, each of two ``$ref`` to the next level, doubles the work per
level (issue 15: 15 levels, 1 KB, 10.8 s per call). So every schema is measured when the request
arrives, before any upstream call:

- ``depth``: nesting of the schema's JSON (objects and arrays, at most ``max_depth``), and of the
  schema walked with its ``$ref`` expanded (at most ``2 x max_depth`` subschemas);
- ``bytes`` / ``nodes``: the size of its compact JSON text and its number of JSON values;
- ``enum``: entries of the largest ``enum``;
- ``branches``: subschemas of the largest ``anyOf`` / ``oneOf`` / ``allOf``;
- ``refs``: ``$ref`` expansions a validation can go through (each reachable use of a ``$ref``,
  counted along every path, so nested combinators of refs multiply);
- ``cost``: the size of the schema tree with every ``$ref`` expanded, each ``enum`` adding one per
  eight entries. One validation of one argument value visits at most ``cost`` schema nodes per
  JSON value of the arguments, so ``cost x nodes(arguments)`` bounds the work (``inline_cost``
  decides whether that is cheap enough to do on the event loop).

A ``$ref`` cycle that never descends into the instance (``{"anyOf":[{"$ref":"#"}]}``) can never end
and is refused (``refs``). A cycle through ``properties`` / ``items`` (a tree of nodes) is allowed,
but its cost depends on how deep the model nests its arguments, so the schema is ``recursive``: its
cost is infinite and it is always validated off the event loop. So are references this module
cannot follow (a ``$ref`` to an ``$id`` or an anchor, ``$dynamicRef``, ``$recursiveRef``), and so are
``unevaluatedItems`` / ``unevaluatedProperties`` (jsonschema evaluates them by validating the
schema's other subschemas again). ``uniqueItems`` makes the estimate quadratic in the arguments.

Keywords and their meaning: JSON Schema 2020-12 Core and Validation (json-schema.org/draft/2020-12),
draft 7 ``items`` arrays, ``additionalItems``, ``definitions`` and ``dependencies``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

#: Keywords whose value is one subschema applied to a part of the instance (a child value).
_DESCEND_ONE = ("items", "additionalItems", "additionalProperties", "contains", "propertyNames",
                "unevaluatedItems", "unevaluatedProperties")
#: Keywords whose value is one subschema applied to the instance itself.
_SAME_ONE = ("not", "if", "then", "else", "contentSchema")
#: Keywords whose value maps names to subschemas applied to child values.
_DESCEND_MAP = ("properties", "patternProperties")
#: Keywords whose value maps names to subschemas applied to the instance itself.
_SAME_MAP = ("dependentSchemas", "dependencies")
#: Combinators: a list of subschemas applied to the instance itself.
COMBINATORS = ("anyOf", "oneOf", "allOf")
#: Lists of subschemas applied to child values.
_DESCEND_LIST = ("prefixItems",)
#: Keywords that make a schema's cost unknown here (validated off the loop): references this module does
#: not follow, and ``unevaluated*``, which jsonschema evaluates by validating the other subschemas again.
_OPAQUE = ("$dynamicRef", "$recursiveRef", "unevaluatedItems", "unevaluatedProperties")


@dataclass(frozen=True, slots=True)
class SchemaBounds:
    """Hard bounds on one tool's ``parameters`` schema, and the inline validation budget.

    ``max_depth`` levels, ``max_bytes`` bytes of compact JSON, ``max_nodes`` JSON values,
    ``max_enum`` entries per ``enum``, ``max_branches`` subschemas per combinator,
    ``max_refs`` reachable ``$ref`` expansions, ``max_cost`` expanded schema nodes (module
    docstring). ``inline_cost``: validations whose estimate (``cost x nodes(arguments)``) is at most
    this run inline, the others in the validation pool. ``inline_check_nodes``: schemas a request declares
    that are not compiled yet are checked against their metaschema inline when they have at most this
    many JSON values together (the check costs ~0.05 to 0.4 ms per value), else in the validation pool.
    ``max_request_cost``: all of a request's schemas together. Defaults match ``config/settings.py``.
    """

    max_depth: int = 32
    max_bytes: int = 128 * 1024
    max_nodes: int = 10_000
    max_enum: int = 2_000
    max_branches: int = 128
    max_refs: int = 1_000
    max_cost: int = 20_000
    inline_cost: float = 2_000
    inline_check_nodes: int = 300
    #: The static costs of all of a request's tool schemas together (a recursive one counts its nodes):
    #: each schema within its bounds, thousands of them could still keep the validation pool busy for
    #: every tenant (found in review: 2,000 tools of 255 refs each).
    max_request_cost: int = 100_000


@dataclass(frozen=True, slots=True)
class SchemaCost:
    """A measured schema: ``cost`` (expanded nodes; ``math.inf`` when ``recursive``), ``refs``
    (reachable ``$ref`` expansions), ``depth`` (deepest JSON nesting), ``nodes`` / ``size`` (JSON
    values / bytes of compact JSON text), ``enum`` / ``branches`` (largest enum / combinator);
    ``quadratic``: it has ``uniqueItems`` (jsonschema compares unsortable items pairwise); ``deepest``:
    the deepest subschema reached with ``$ref`` expanded."""

    cost: float
    refs: int
    depth: int
    nodes: int
    size: int
    enum: int
    branches: int
    recursive: bool = False
    quadratic: bool = False
    deepest: int = 0

    def estimate(self, arguments: Any) -> float:
        """An upper bound of the schema nodes one validation of ``arguments`` (parsed JSON) visits:
        ``cost x nodes(arguments)``, squared in the nodes when ``quadratic``; ``inf`` when recursive."""
        nodes = value_nodes(arguments)
        return self.cost * nodes * (nodes if self.quadratic else 1)


class SchemaTooComplex(ValueError):
    """A schema beyond a bound: ``bound`` names it (``depth``, ``bytes``, ``nodes``, ``enum``,
    ``branches``, ``refs``, ``cost``), ``message`` says what was found and what the bound is."""

    def __init__(self, bound: str, message: str) -> None:
        super().__init__(message)
        self.bound = bound
        self.message = message


def measure(schema: Any, bounds: SchemaBounds | None = None, *, text: str | None = None) -> SchemaCost:
    """Measure ``schema`` (parsed JSON); ``SchemaTooComplex`` naming the first bound it exceeds.

    ``bounds`` None: no bound except the nesting needed to walk it (``SchemaBounds().max_depth``
    x 4 subschemas); a schema past that gets ``cost = inf`` instead of an error. ``text``: the schema's compact
    JSON when the caller has it (saves one serialisation). Time and memory are linear in the size of
    the schema, whatever its expanded cost (expansions are counted, never walked twice).
    """
    raw = _raw(schema, bounds)
    if text is None:
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False, default=repr)
    size = len(text.encode("utf-8", errors="replace"))
    if bounds is not None and size > bounds.max_bytes:
        raise SchemaTooComplex("bytes", f"the schema is {size} bytes; the bound is {bounds.max_bytes}")
    walk = _Expanded(schema, bounds)
    try:
        cost, refs = walk.node(schema, 0)
    except RecursionError:  # unreachable within the depth bound; an unbounded measure says "unknown"
        cost, refs, walk.recursive = math.inf, 0, True
    except _TooDeep:
        if bounds is not None:
            raise SchemaTooComplex("depth", f"the schema nests deeper than {2 * bounds.max_depth} subschemas "
                                   "with its $ref expanded") from None
        cost, refs, walk.recursive = math.inf, 0, True
    if bounds is not None:
        if refs > bounds.max_refs:
            raise SchemaTooComplex("refs", f"validation can expand {_count(refs)} $ref; the bound is "
                                   f"{bounds.max_refs}")
        if not walk.recursive and cost > bounds.max_cost:
            raise SchemaTooComplex("cost", f"the schema expands to {_count(cost)} nodes (nested combinators "
                                   f"and $ref multiply); the bound is {bounds.max_cost}")
    return SchemaCost(math.inf if walk.recursive else cost, refs, raw.depth, raw.nodes, size, raw.enum,
                      raw.branches, walk.recursive, walk.quadratic, walk.deepest)


def exceeded(measured: SchemaCost, bounds: SchemaBounds) -> SchemaTooComplex | None:
    """The first bound a schema measured earlier (``measure``, maybe under other bounds) exceeds, or
    None: what ``measure(schema, bounds)`` would raise, without walking the schema again."""
    checks = (
        ("depth", measured.depth > bounds.max_depth, f"the schema nests deeper than {bounds.max_depth} levels"),
        ("nodes", measured.nodes > bounds.max_nodes, f"the schema has more than {bounds.max_nodes} JSON values"),
        ("enum", measured.enum > bounds.max_enum, f"an enum has {measured.enum} entries; the bound is "
                                                  f"{bounds.max_enum}"),
        ("branches", measured.branches > bounds.max_branches, f"a combinator has {measured.branches} branches; "
                                                              f"the bound is {bounds.max_branches}"),
        ("bytes", measured.size > bounds.max_bytes, f"the schema is {measured.size} bytes; the bound is "
                                                    f"{bounds.max_bytes}"),
        ("depth", measured.deepest > 2 * bounds.max_depth, f"the schema nests deeper than {2 * bounds.max_depth} "
                                                           "subschemas with its $ref expanded"),
        ("refs", measured.refs > bounds.max_refs, f"validation can expand {_count(measured.refs)} $ref; the bound "
                                                  f"is {bounds.max_refs}"),
        ("cost", not measured.recursive and measured.cost > bounds.max_cost,
         f"the schema expands to {_count(measured.cost)} nodes (nested combinators and $ref multiply); the "
         f"bound is {bounds.max_cost}"),
    )
    return next((SchemaTooComplex(bound, message) for bound, over, message in checks if over), None)


def value_nodes(value: Any) -> int:
    """The number of JSON values in ``value`` (parsed JSON; containers count, with their contents)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def _count(n: float) -> str:
    """A count for a message: exact below a million, else its order of magnitude ("unknown": infinite)."""
    if math.isinf(n):
        return "unknown"
    return str(int(n)) if n < 1_000_000 else f"~1e{int(math.log10(n))}"


@dataclass(slots=True)
class _Raw:
    depth: int = 0
    nodes: int = 0
    enum: int = 0
    branches: int = 0


def _raw(schema: Any, bounds: SchemaBounds | None) -> _Raw:
    """Depth, node count, largest enum and combinator of the schema's JSON, iteratively (any nesting)."""
    raw = _Raw()
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        item, depth = stack.pop()
        raw.nodes += 1
        raw.depth = max(raw.depth, depth)
        if bounds is not None:
            if depth > bounds.max_depth:
                raise SchemaTooComplex("depth", f"the schema nests deeper than {bounds.max_depth} levels")
            if raw.nodes > bounds.max_nodes:
                raise SchemaTooComplex("nodes", f"the schema has more than {bounds.max_nodes} JSON values")
        if isinstance(item, dict):
            enum = item.get("enum")
            if isinstance(enum, list):
                raw.enum = max(raw.enum, len(enum))
                if bounds is not None and len(enum) > bounds.max_enum:
                    raise SchemaTooComplex("enum", f"an enum has {len(enum)} entries; the bound is "
                                           f"{bounds.max_enum}")
            for keyword in COMBINATORS:
                branches = item.get(keyword)
                if isinstance(branches, list):
                    raw.branches = max(raw.branches, len(branches))
                    if bounds is not None and len(branches) > bounds.max_branches:
                        raise SchemaTooComplex("branches", f"an {keyword} has {len(branches)} branches; the "
                                               f"bound is {bounds.max_branches}")
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return raw


class _TooDeep(Exception):
    """The expanded walk went past its depth bound."""


class _Expanded:
    """The walk of a schema with ``$ref`` expanded: (cost, refs) per subschema, memoised per target."""

    def __init__(self, root: Any, bounds: SchemaBounds | None) -> None:
        self.root = root
        self.limit = 2 * (bounds.max_depth if bounds is not None else SchemaBounds().max_depth * 2)
        self.memo: dict[int, tuple[float, int]] = {}
        self.stack: dict[int, int] = {}  # subschemas being walked -> descents when entered
        self.recursive = False
        self.quadratic = False
        self.deepest = 0

    def node(self, schema: Any, descents: int, depth: int = 0) -> tuple[float, int]:
        """(cost, refs) of ``schema`` reached after ``descents`` instance descents, ``depth`` levels deep."""
        if not isinstance(schema, dict):
            return 1, 0  # true / false / a broken subschema (check_schema reports it)
        if depth > self.limit:
            raise _TooDeep
        self.deepest = max(self.deepest, depth)
        key = id(schema)
        if key in self.memo:
            return self.memo[key]
        if key in self.stack:
            if self.stack[key] == descents:
                raise SchemaTooComplex("refs", "a $ref cycle never descends into the arguments, so "
                                       "validation would never end")
            self.recursive = True
            return 1, 0
        self.stack[key] = descents
        try:
            result = self._children(schema, descents, depth)
        finally:
            del self.stack[key]
        self.memo[key] = result
        return result

    def _children(self, schema: dict[str, Any], descents: int, depth: int) -> tuple[float, int]:
        enum = schema.get("enum")
        cost: float = 1 + (len(enum) // 8 if isinstance(enum, list) else 0)
        refs = 0
        for sub, deeper in _subschemas(schema):
            c, r = self.node(sub, descents + deeper, depth + 1)
            cost, refs = cost + c, refs + r
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = self._resolve(ref)
            if target is None:
                self.recursive = True  # not followed here: its cost is unknown
            else:
                c, r = self.node(target, descents, depth + 1)
                cost, refs = cost + c, refs + r + 1
        if any(k in schema for k in _OPAQUE):
            self.recursive = True
        if schema.get("uniqueItems") is True:
            self.quadratic = True
        return cost, refs

    def _resolve(self, ref: str) -> Any | None:
        """The subschema a local JSON Pointer ``$ref`` (``#``, ``#/$defs/a``) names, else None."""
        if ref == "#":
            return self.root
        if not ref.startswith("#/"):
            return None
        node: Any = self.root
        for part in ref[2:].split("/"):
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node


def _subschemas(schema: dict[str, Any]) -> list[tuple[Any, int]]:
    """The subschemas a validation applies, each with 1 when it applies to a child value, else 0.
    ``$defs`` / ``definitions`` are not applied (only reached through ``$ref``)."""
    out: list[tuple[Any, int]] = []
    for keyword in _DESCEND_ONE:
        value = schema.get(keyword)
        if isinstance(value, list):  # draft 7 tuple items
            out.extend((v, 1) for v in value)
        elif value is not None:
            out.append((value, 1))
    out.extend((schema[k], 0) for k in _SAME_ONE if k in schema)
    for keyword in _DESCEND_MAP:
        value = schema.get(keyword)
        if isinstance(value, dict):
            out.extend((v, 1) for v in value.values())
    for keyword in _SAME_MAP:
        value = schema.get(keyword)
        if isinstance(value, dict):
            out.extend((v, 0) for v in value.values() if isinstance(v, dict))
    for keyword in COMBINATORS:
        value = schema.get(keyword)
        if isinstance(value, list):
            out.extend((v, 0) for v in value)
    for keyword in _DESCEND_LIST:
        value = schema.get(keyword)
        if isinstance(value, list):
            out.extend((v, 1) for v in value)
    return out
