"""Bounded tool-schema validation (issue 15, item 1): the bounds, the static cost, the inline budget,
the byte-bounded schema cache, and the real tool sets of four coding agents (sans-IO, no event loop)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.guard.checks import validate
from proxy.guard.checks.request import RequestInvalid, prepare
from proxy.guard.checks.schema_bounds import SchemaBounds, SchemaTooComplex, exceeded, measure, value_nodes
from proxy.guard.checks.validate import Verdict, check_turn, configure_cache, offloaded_verdict
from proxy.guard.decisions.attempt import AttemptGuard, guard_body
from proxy.guard.events import Done, Pending, ToolCallValid
from proxy.guard.findings import FindingKind
from proxy.guard.policy import GuardPolicy
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "agent_tools"
AGENTS = ("claude_code", "codex_cli", "opencode", "qwen_code")


def hostile(levels: int, leaf: dict[str, Any] | None = None) -> dict[str, Any]:
    """Issue 15's schema: ``levels`` of ``anyOf`` of two ``$ref`` to the next level, then ``leaf``."""
    defs: dict[str, Any] = {f"l{i}": {"anyOf": [{"$ref": f"#/$defs/l{i + 1}"}, {"$ref": f"#/$defs/l{i + 1}"}]}
                            for i in range(levels)}
    defs[f"l{levels}"] = leaf or {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/l0"}}, "required": ["x"], "$defs": defs}


def body(*schemas: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": f"t{i}", "parameters": s}}
                      for i, s in enumerate(schemas)]}


def sse(name: str, arguments: str) -> bytes:
    chunks = [{"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {
        "role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                             "function": {"name": name, "arguments": arguments}}]}}]},
              {"id": "c1", "object": "chat.completion.chunk", "model": "m",
               "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


# -- the bounds, each named in the 400 ----------------------------------------------------------


def test_issue15_hostile_schema_is_refused_fast_naming_the_bound() -> None:
    started = time.monotonic()
    with pytest.raises(RequestInvalid) as caught:
        prepare(body({"type": "object"}, hostile(15)))
    assert time.monotonic() - started < 1.0  # linear in the schema's 1 KB, not in its 2^15 expansion
    assert caught.value.param == "tools[1].function.parameters"
    assert caught.value.code == "tool_schema_too_complex"
    assert "'t1'" in caught.value.message and "refs:" in caught.value.message


@pytest.mark.parametrize(("schema", "bounds", "bound"), [
    ({"type": "object", "properties": {"a": {"enum": [f"v{i}" for i in range(400_000)]}}}, SchemaBounds(), "enum"),
    (hostile(15), SchemaBounds(max_refs=10**9), "cost"),
    ({"anyOf": [{"type": "string", "minLength": i} for i in range(200)]}, SchemaBounds(), "branches"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(6_000)}}, SchemaBounds(), "nodes"),
    ({"type": "object", "description": "x" * 200_000}, SchemaBounds(), "bytes"),
    (json.loads('{"items":' * 40 + "{}" + "}" * 40), SchemaBounds(), "depth"),
    ({"anyOf": [{"$ref": "#"}, {"type": "null"}]}, SchemaBounds(), "refs"),
    ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}},
      "$ref": "#/$defs/a"}, SchemaBounds(), "refs"),
])
def test_each_bound_is_named(schema: dict[str, Any], bounds: SchemaBounds, bound: str) -> None:
    with pytest.raises(SchemaTooComplex) as caught:
        measure(schema, bounds)
    assert caught.value.bound == bound
    with pytest.raises(RequestInvalid) as refused:
        prepare(body(schema), bounds=bounds)
    assert f"({bound}: " in refused.value.message


def test_400000_entry_enum_is_refused_before_it_is_compiled() -> None:
    configure_cache(validate.DEFAULT_CACHE_BYTES)
    with pytest.raises(RequestInvalid, match="enum: an enum has 400000 entries; the bound is 2000"):
        prepare(body({"type": "object", "properties": {"a": {"enum": list(range(400_000))}}}))
    assert validate.cache_usage()[0] == 0


def test_the_cost_counts_every_expansion_linearly() -> None:
    for levels in (4, 8, 12, 30):
        measured = measure(hostile(levels), None)
        assert measured.cost == 2 ** (levels + 2) - 1  # every path of the expansion counted, once each
        assert measured.refs == 2 ** (levels + 1) - 1
    assert measure(hostile(70), None).cost == math.inf  # past the walk's depth: unknown, never a crash


def test_recursive_schemas_are_allowed_but_never_inline() -> None:
    tree = {"type": "object", "properties": {"name": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#"}}}}
    measured = measure(tree, SchemaBounds())
    assert measured.recursive and measured.cost == math.inf
    for opaque in ({"$dynamicRef": "#meta"}, {"unevaluatedProperties": False}, {"$ref": "other.json"}):
        assert measure({"type": "object", **opaque}, SchemaBounds()).cost == math.inf


def test_unique_items_makes_the_estimate_quadratic() -> None:
    measured = measure({"type": "array", "uniqueItems": True, "items": {"type": "object"}}, SchemaBounds())
    assert measured.quadratic
    assert measured.estimate([{}] * 100) == measured.cost * 101 * 101


# -- the inline budget and the pending verdicts -------------------------------------------------


def test_costly_call_is_pending_then_decided_by_its_verdict() -> None:
    request = prepare(body(hostile(8, {"type": "string", "not": {"type": "string"}})),
                      bounds=SchemaBounds(inline_cost=100)).spec
    guard = AttemptGuard(request, GuardPolicy())
    events = guard.feed(sse("t0", '{"x":"a"}'))
    assert not any(isinstance(e, ToolCallValid) for e in events)  # never judged on the event loop
    final = guard.finish()
    assert isinstance(final[-1], Pending)
    (check,) = final[-1].checks
    assert check.tool == "t0" and check.arguments == '{"x":"a"}' and check.estimate > 100
    guard.supply({(check.schema, check.arguments): Verdict("unfinished", "validation took longer than 2 s")})
    done = guard.finish()[-1]
    assert isinstance(done, Done) and not done.decision.usable
    (finding,) = [f for f in done.decision.findings if f.fatal]
    assert finding.kind is FindingKind.SCHEMA_VALIDATION_UNFINISHED and finding.tool == "t0"
    assert "took longer than 2 s" in finding.detail


@pytest.mark.parametrize(("arguments", "usable"), [('{"x":"a"}', True), ('{"x":1}', False)])
def test_sans_io_callers_validate_pending_calls_inline(arguments: str, usable: bool) -> None:
    request = prepare(body(hostile(6)), bounds=SchemaBounds(inline_cost=10)).spec
    decision = guard_body(sse("t0", arguments), request, GuardPolicy())
    assert decision.usable is usable


def test_calls_within_the_budget_never_wait() -> None:
    request = prepare(body(hostile(3))).spec  # cost 31, 2 values: 62 <= 2000
    turn = Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c", "t0", '{"x":"a"}')], finish_reason="tool_calls")])
    _, findings = check_turn(turn, request, GuardPolicy())
    assert findings == []


def test_offloaded_verdict_never_raises() -> None:
    assert offloaded_verdict(validate._schema_key(hostile(2)), '{"x":"a"}') == Verdict("valid")
    assert offloaded_verdict(validate._schema_key(hostile(2)), '{"x":1}').kind == "violation"
    assert offloaded_verdict(json.dumps({"type": 12}), "{}").kind == "unusable"
    assert offloaded_verdict(json.dumps({"$ref": "https://example.com/s.json"}), "{}").kind == "unusable"


# -- the cache, bounded by bytes ------------------------------------------------------------------


def test_schema_cache_is_bounded_by_bytes_not_entries() -> None:
    configure_cache(2 * 1024 * 1024)
    try:
        for i in range(40):  # 40 distinct ~64 KB schemas: ~20 MB if every one were kept
            enum = [f"{i}-{n:05d}" for n in range(1_900)]
            validate.compile_schema({"type": "object", "properties": {"a": {"enum": enum}, "b": {"const": i}}})
            count, used, bound = validate.cache_usage()
            assert used <= bound == 2 * 1024 * 1024
        assert 0 < count < 40
        validate.compile_schema({"enum": ["x" * 300_000]})  # heavier than the whole cache: used, not kept
        assert validate.cache_usage()[1] <= 2 * 1024 * 1024
    finally:
        configure_cache(validate.DEFAULT_CACHE_BYTES)


# -- the real tool sets --------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_default_bounds_accept_real_agent_tool_sets(agent: str) -> None:
    tools = json.loads((FIXTURES / f"{agent}.json").read_text())["tools"]
    assert len(tools) >= 10
    request = prepare({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"type": "function", "function": t} for t in tools]})
    bounds = SchemaBounds()
    for tool in tools:
        measured = measure(tool["parameters"], bounds)
        # A wide margin under every bound, and a large call (200 JSON values) is still inline.
        assert measured.cost * 200 <= bounds.inline_cost * 2
        assert measured.depth * 2 <= bounds.max_depth and measured.size * 20 <= bounds.max_bytes
        compiled = validate.compile_schema(tool["parameters"])
        assert compiled.validator is not None, (tool["name"], compiled.problem)
    assert request.spec.inline_cost == bounds.inline_cost


def test_a_claude_code_todo_list_validates_inline() -> None:
    tools = json.loads((FIXTURES / "claude_code.json").read_text())["tools"]
    todo = next(t for t in tools if t["name"] == "TodoWrite")
    request = prepare({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"type": "function", "function": todo}]}).spec
    todos = [{"content": f"step {i}", "status": "pending", "activeForm": f"doing step {i}"} for i in range(20)]
    turn = Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c", "TodoWrite", json.dumps({"todos": todos}))],
                                    finish_reason="tool_calls")])
    _, findings = check_turn(turn, request, GuardPolicy())  # raises NeedVerdicts if it were over budget
    assert findings == []


# -- property: within the bounds, the estimate holds ---------------------------------------------

_leaf = st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"enum": [1, "a", None]},
                         {"type": "string", "maxLength": 3}, {}])


def _schemas(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.fixed_dictionaries({"type": st.just("object"),
                               "properties": st.dictionaries(st.sampled_from("abc"), children, max_size=3)}),
        st.fixed_dictionaries({"type": st.just("array"), "items": children}),
        st.builds(lambda k, xs: {k: xs}, st.sampled_from(["anyOf", "oneOf", "allOf"]),
                  st.lists(children, min_size=1, max_size=4)),
        st.builds(lambda d: {"$ref": f"#/$defs/{d}"}, st.sampled_from("pqrr")),
        st.builds(lambda x: {"not": x}, children),
    )


_schema = st.recursive(_leaf, _schemas, max_leaves=12).map(
    lambda s: {"$defs": {"p": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#/$defs/q"}}]},
                         "q": {"type": "object", "properties": {"a": {"$ref": "#/$defs/p"}}},
                         "r": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]}},
               "allOf": [s]})
_json = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text("ab", max_size=2),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from("abc"), c, max_size=3),
                     max_leaves=15)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schema, value=_json)
def test_within_bounds_the_estimate_bounds_the_work(schema: dict[str, Any], value: Any) -> None:
    """Random schemas (combinators, refs, nesting, a ref cycle through the arguments) that pass the
    bounds: the subschemas a real validation applies never exceed the static estimate, so a call
    under the inline budget does at most that budget of work on the event loop."""
    bounds = SchemaBounds(max_cost=2_000, max_refs=500)
    try:
        measured = measure(schema, bounds)
    except SchemaTooComplex:
        return
    compiled = validate.compile_schema(schema)
    if compiled.validator is None:
        return
    visits = [0]
    cls = type(compiled.validator)
    descend = cls.descend

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        visits[0] += 1
        yield from descend(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cls, "descend", counting)
        try:
            list(compiled.validator.iter_errors(value))
        except RecursionError:
            assert measured.recursive  # only a cycle can recurse without end: never inline
            return
    if measured.recursive:
        assert measured.estimate(value) == math.inf
    else:
        assert 1 + visits[0] <= measured.estimate(value)
        assert value_nodes(value) >= 1


@settings(max_examples=200, deadline=None)
@given(schema=_schema, max_cost=st.integers(1, 400), max_refs=st.integers(0, 60), max_depth=st.integers(3, 12))
def test_figures_of_a_cached_schema_refuse_exactly_what_a_new_walk_refuses(schema: dict[str, Any], max_cost: int,
                                                                         max_refs: int, max_depth: int) -> None:
    """A cached schema is not walked again: its stored figures (``exceeded``) must refuse it under the same
    bounds exactly when ``measure`` would."""
    bounds = SchemaBounds(max_cost=max_cost, max_refs=max_refs, max_depth=max_depth, max_branches=3)
    try:
        figures = measure(schema, None)
    except SchemaTooComplex:
        return  # a $ref cycle that never descends: refused by every measure, never compiled
    try:
        measure(schema, bounds)
        refused = None
    except SchemaTooComplex as exc:
        refused = exc.bound
    over = exceeded(figures, bounds)
    assert (over is None) == (refused is None), (refused, over and over.bound)


def test_a_schema_cached_under_other_bounds_is_still_refused() -> None:
    schema = hostile(9)
    prepare(body(schema), bounds=SchemaBounds(max_refs=10**6))  # compiled and cached under lenient bounds
    assert validate.cached_schema(schema) is not None
    with pytest.raises(RequestInvalid, match=r"\(refs: validation can expand 1023 \$ref; the bound is 1000\)"):
        prepare(body(schema))


def test_many_schemas_each_within_bounds_are_bounded_together() -> None:
    """Found in review: 2,000 tools of 8 levels of anyOf/$ref each (255 refs, under every per-schema bound)
    kept the shared validation pool busy for every tenant. Their static costs together are bounded
    (``max_request_cost``), cached schemas included; a recursive one counts its nodes, not infinity."""
    def tool(i: int) -> dict[str, Any]:
        return {**hostile(8), "description": f"tool {i}"}  # distinct: nothing shared through the cache

    single = measure(tool(0), SchemaBounds()).cost
    bounds = SchemaBounds(max_request_cost=int(single * 10), max_cost=int(single))
    prepare(body(*(tool(i) for i in range(10))), bounds=bounds)
    with pytest.raises(RequestInvalid) as refused:
        prepare(body(*(tool(i) for i in range(11))), bounds=bounds)
    assert refused.value.param == "tools" and "(request: " in refused.value.message
    with pytest.raises(RequestInvalid):  # the same schemas again, now cached: still counted
        prepare(body(*(tool(i) for i in range(11))), bounds=bounds)
    recursive = {"type": "object", "properties": {"n": {"$ref": "#"}}}
    prepare(body(*(dict(recursive, description=str(i)) for i in range(50))),
            bounds=SchemaBounds(max_request_cost=500, max_cost=100))
