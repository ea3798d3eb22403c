"""Property tests: random valid turns, rendered through a dialect mangler that applies the corpus'
fault kinds in random combinations and cut at random bytes, come back equal (or, for the fatal
kinds, as a retry); arbitrary bytes and arbitrary chunk shapes never make the guard fail."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.guard.decisions.attempt import AttemptGuard, decide_completion
from proxy.guard.events import Done
from proxy.guard.findings import FindingKind
from proxy.guard.policy import GuardPolicy
from proxy.guard.turn import Decision, Outcome, RequestSpec, ToolSpec

OBJ = "object"
TOOLS = (
    ToolSpec("get_weather", {"type": OBJ, "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    ToolSpec("write_file", {"type": OBJ, "properties": {"path": {"type": "string"}, "content": {"type": "string"},
                                                        "n": {"type": "integer"}}, "required": ["path"]}),
    ToolSpec("get_time", {"type": OBJ, "properties": {}}),
    ToolSpec("set_flags", {"type": OBJ, "properties": {"flags": {"type": "array", "items": {"type": "string"}},
                                                       "on": {"type": "boolean"}}}),
)
POLICY = GuardPolicy()
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# No letters that could spell a marker (``tool_call``, ``function=`` …), but ``<``, ``|``, quotes,
# backslashes, braces, newlines and non-ASCII so that holding, escaping and UTF-8 splits are exercised.
SAFE = st.text(alphabet="ab xyz<>|{}[]\"\\\n\té☃€", max_size=12)
TEXT = st.text(alphabet="ab xyz<>|{}\"\\\n é☃", min_size=1, max_size=30)


@dataclass
class Call:
    name: str
    args: dict[str, Any]


@dataclass
class Choice:
    index: int
    content: str | None
    reasoning: str | None
    calls: list[Call]


@st.composite
def call_args(draw: st.DrawFn, name: str) -> dict[str, Any]:
    if name == "get_weather":
        return {"city": draw(SAFE)}
    if name == "write_file":
        out: dict[str, Any] = {"path": draw(SAFE)}
        if draw(st.booleans()):
            out["content"] = draw(SAFE)
        if draw(st.booleans()):
            out["n"] = draw(st.integers(-10**6, 10**6))
        return out
    if name == "set_flags":
        return {"flags": draw(st.lists(SAFE, max_size=3)), "on": draw(st.booleans())}
    return {}


@st.composite
def choices(draw: st.DrawFn, index: int) -> Choice:
    calls: list[Call] = []
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from([t.name for t in TOOLS]))
        c = Call(name, draw(call_args(name)))
        if all((c.name, c.args) != (o.name, o.args) for o in calls):
            calls.append(c)
    content = draw(st.none() | TEXT)
    if not calls and content is None:
        content = draw(TEXT)
    return Choice(index, content, draw(st.none() | TEXT), calls)


@dataclass
class Faults:
    """Which fault kinds the mangler applies (a random combination per example)."""

    name_mode: str = "plain"  # plain | late (C05) | split (C06) | repeat (C03) | empty (C01) | ids (C07)
    no_ids: bool = False  # C08
    index_mode: str = "plain"  # plain | zero (C09) | missing (C10) | offset
    no_type: bool = False  # C12
    arg_mode: str = "stream"  # stream | snapshot (C14) | object (C13) | single (C17)
    resend: bool = False  # C15
    merge_finish: bool = False  # C18
    blank_no_args: bool = False  # C19
    finish_mode: str = "plain"  # plain | stop (C32) | dup (C33) | empty (C34)
    usage: bool = False  # C36
    filter_chunks: bool = False  # C37
    no_space: bool = False  # C38
    comments: bool = False  # C40
    crlf: bool = False
    role_everywhere: bool = False
    no_done: bool = False
    leak: str = "none"  # none | hermes | deepseek | kimi | minimax | function (C26-C31)
    fatal: str = "none"  # none | truncate (C24) | error (C41) | fused (C45) | regenerate
    extras: list[str] = field(default_factory=list)

    @property
    def anomalies(self) -> bool:
        return self != Faults()


@st.composite
def faults(draw: st.DrawFn) -> Faults:
    f = Faults(
        name_mode=draw(st.sampled_from(["plain", "late", "split", "repeat", "empty", "ids"])),
        no_ids=draw(st.booleans()),
        index_mode=draw(st.sampled_from(["plain", "zero", "missing", "offset"])),
        no_type=draw(st.booleans()),
        arg_mode=draw(st.sampled_from(["stream", "snapshot", "object", "single"])),
        resend=draw(st.booleans()),
        merge_finish=draw(st.booleans()),
        blank_no_args=draw(st.booleans()),
        finish_mode=draw(st.sampled_from(["plain", "stop", "dup", "empty"])),
        usage=draw(st.booleans()),
        filter_chunks=draw(st.booleans()),
        no_space=draw(st.booleans()),
        comments=draw(st.booleans()),
        crlf=draw(st.booleans()),
        role_everywhere=draw(st.booleans()),
        no_done=draw(st.booleans()),
        leak=draw(st.sampled_from(["none", "none", "hermes", "deepseek", "kimi", "minimax", "function"])),
        fatal=draw(st.sampled_from(["none"] * 6 + ["truncate", "error", "fused", "regenerate"])),
    )
    if draw(st.sampled_from([True, False, False, False, False, False])):
        return Faults()  # a share of clean canonical streams
    if f.name_mode == "ids" and f.no_ids:
        f.name_mode = "plain"  # C07 needs ids to change
    if f.name_mode == "split" and f.no_ids and f.index_mode in ("zero", "missing"):
        f.name_mode = "plain"  # no id, no index, a name fragment: no stream can tell a new call apart
    return f


class Mangler:
    """Renders choices to upstream chunk frames with the chosen faults applied."""

    def __init__(self, f: Faults, draw: st.DrawFn) -> None:
        self.f = f
        self.draw = draw
        self.ids = 0

    def split(self, text: str, parts: int = 3) -> list[str]:
        cuts = sorted(self.draw(st.lists(st.integers(0, len(text)), max_size=parts)))
        bounds = [0, *cuts, len(text)]
        return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a] or [text]

    def chunk(self, index: int, delta: dict[str, Any], finish: Any = None) -> dict[str, Any]:
        if self.f.role_everywhere:
            delta = {"role": "assistant", **delta}
        fin = "" if finish is None and self.f.finish_mode == "empty" else finish
        return {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": index, "delta": delta, "finish_reason": fin}]}

    def choice_deltas(self, c: Choice, leaked: list[Call]) -> list[dict[str, Any]]:
        out = [self.chunk(c.index, {"role": "assistant", "content": ""})]
        if c.reasoning:
            out += [self.chunk(c.index, {"reasoning_content": p}) for p in self.split(c.reasoning)]
        text = (c.content or "") + "".join(leak_markup(self.f.leak, k) for k in leaked)
        if text:
            out += [self.chunk(c.index, {"content": p}) for p in self.split(text, 5)]
        structured = c.calls[: len(c.calls) - len(leaked)]
        for slot, call in enumerate(structured):
            out += self.call_deltas(c.index, slot, call)
        out += self.finish(c, structured, out)
        return out

    def call_deltas(self, choice: int, slot: int, call: Call) -> list[dict[str, Any]]:
        f = self.f
        self.ids += 1
        cid = None if f.no_ids else f"call_{self.ids}"
        args_text = json.dumps(call.args, ensure_ascii=False)
        if f.blank_no_args and not call.args:
            args_text = ""
        index: Any = {"zero": 0, "offset": slot + 2}.get(f.index_mode, slot)

        def entry(first: bool, name: Any, args: Any, id_: Any = None) -> dict[str, Any]:
            e: dict[str, Any] = {} if f.index_mode == "missing" else {"index": index}
            if id_ is not None:
                e["id"] = id_
            if first and not f.no_type:
                e["type"] = "function"
            fn: dict[str, Any] = {}
            if name is not None:
                fn["name"] = name
            if args is not None:
                fn["arguments"] = args
            e["function"] = fn
            return {"tool_calls": [e]}

        head_name: Any = call.name
        rest_names: list[Any] = []
        if f.name_mode == "late":
            head_name = ""
        elif f.name_mode == "split" and len(call.name) > 3:
            head_name, rest_names = call.name[:3], [call.name[3:]]
        if f.arg_mode == "single" or f.arg_mode == "object":
            value: Any = call.args if f.arg_mode == "object" else args_text
            out = [self.chunk(choice, entry(True, call.name, value, cid))]
        else:
            pieces = self.split(args_text, 4) if args_text else []
            if f.arg_mode == "snapshot":
                pieces = ["".join(pieces[: i + 1]) for i in range(len(pieces))]
            if f.name_mode == "late" and not pieces:
                pieces = [""]
            out = [self.chunk(choice, entry(True, head_name, "", cid))]
            for i, p in enumerate(pieces):
                name: Any = None
                if rest_names and i == 0:
                    name = rest_names[0]
                elif f.name_mode == "late" and i == 0:
                    name = call.name
                elif f.name_mode == "repeat":
                    name = call.name
                elif f.name_mode in ("empty", "ids"):
                    name = ""
                id_ = ("null" if i % 2 else "toolcall0") if f.name_mode == "ids" else None
                out.append(self.chunk(choice, entry(False, name, p, id_)))
            if rest_names and not pieces:
                out.append(self.chunk(choice, entry(False, rest_names[0], None)))
        if f.resend and args_text:
            out.append(self.chunk(choice, entry(False, call.name, args_text, cid)))
        return out

    def finish(self, c: Choice, structured: list[Call], out: list[dict[str, Any]]) -> list[dict[str, Any]]:
        f = self.f
        reason = "tool_calls" if c.calls else "stop"
        if f.finish_mode == "stop":
            reason = "stop"
        if f.merge_finish and structured and not f.resend and "tool_calls" in out[-1]["choices"][0]["delta"]:
            out[-1]["choices"][0]["finish_reason"] = reason  # C18: last delta carries the finish
            tail: list[dict[str, Any]] = []
        else:
            tail = [self.chunk(c.index, {}, reason)]
        if f.finish_mode == "dup":
            tail.append(self.chunk(c.index, {"content": None}, "stop"))
        if f.finish_mode == "empty":  # C34: a legacy function_call stub rides on the terminal chunk
            stub = {"function_call": {"name": "", "arguments": ""}}
            if tail:
                tail[-1]["choices"][0]["delta"] = stub
            else:
                tail = [self.chunk(c.index, stub)]
        return tail


def leak_markup(family: str, call: Call) -> str:
    args = json.dumps(call.args, ensure_ascii=False)
    if family == "hermes":
        return f'<tool_call>\n{{"name": "{call.name}", "arguments": {args}}}\n</tool_call>'
    if family == "deepseek":
        return (f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{call.name}\n```json\n{args}\n```"
                "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    if family == "kimi":
        return (f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{call.name}:0"
                f"<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>")
    if family == "minimax":
        params = "".join(f'<parameter name="{k}">{v if isinstance(v, str) else json.dumps(v)}</parameter>\n'
                         for k, v in call.args.items())
        return f'<minimax:tool_call>\n<invoke name="{call.name}">\n{params}</invoke>\n</minimax:tool_call>'
    return f"<function={call.name}>{args}</function>"


def minimax_safe(call: Call) -> bool:
    """MiniMax parameters are raw text: values framed by newlines cannot round-trip."""
    return all(not (isinstance(v, str) and (v.startswith("\n") or v.endswith("\n"))) for v in call.args.values())


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Choice], Faults, bytes, list[int]]:
    n = draw(st.integers(1, 2))
    cs = [draw(choices(i)) for i in range(n)]
    f = draw(faults())
    m = Mangler(f, draw)
    per_choice = []
    for c in cs:
        leaked = c.calls[-1:] if f.leak != "none" and c.calls else []
        if f.leak == "minimax" and leaked and not minimax_safe(leaked[0]):
            leaked = []
        per_choice.append(m.choice_deltas(c, leaked))
    frames = interleave(draw, per_choice)
    frames = apply_envelope_faults(f, frames, draw)
    body = render(f, frames)
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=6)))
    return cs, f, body, cuts


def interleave(draw: st.DrawFn, streams: list[list[dict[str, Any]]]) -> list[Any]:
    out: list[Any] = []
    queues = [list(s) for s in streams]
    while any(queues):
        live = [q for q in queues if q]
        out.append(live[draw(st.integers(0, len(live) - 1))].pop(0))
    return out


def apply_envelope_faults(f: Faults, frames: list[Any], draw: st.DrawFn) -> list[Any]:
    if f.filter_chunks:
        frames.insert(0, {"choices": [], "created": 0, "id": "", "model": "", "object": "",
                          "prompt_filter_results": [{"prompt_index": 0}]})
        at = draw(st.integers(1, len(frames)))
        frames.insert(at, {"choices": [{"index": 0, "finish_reason": None, "content_filter_results": {}}],
                           "id": "", "object": ""})
    if f.usage:
        frames.append({"id": "chatcmpl-p", "object": "chat.completion.chunk", "choices": [],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})
    if f.fatal == "truncate":
        frames = truncate(frames)
    elif f.fatal == "error":
        frames.append({"id": "chatcmpl-p", "error": {"message": "provider died", "code": 502}, "choices": []})
    elif f.fatal == "fused":
        at = draw(st.integers(0, len(frames) - 1))
        frames[at] = '{"id":"chatcmpl-p","object":"chat.c' + "data: " + json.dumps(frames[at])
    elif f.fatal == "regenerate":
        frames.append({"id": "chatcmpl-q", "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": {"content": "again"}, "finish_reason": None}]})
    if not f.no_done and f.fatal != "error":
        frames.append("[DONE]")
    return frames


def truncate(frames: list[Any]) -> list[Any]:
    """C24: drop the last argument fragment of the last structured call; finish with ``length``."""
    for i in range(len(frames) - 1, -1, -1):
        fr = frames[i]
        delta = fr.get("choices", [{}])[0].get("delta", {}) if isinstance(fr, dict) and fr.get("choices") else {}
        calls = delta.get("tool_calls") if isinstance(delta, dict) else None
        args = calls[0]["function"].get("arguments") if calls else None
        if calls and isinstance(args, str) and len(args.strip()) > 1:
            index = fr["choices"][0]["index"]
            calls[0]["function"]["arguments"] = args.strip()[:-1]
            cut = [x for x in frames[: i + 1] if not (isinstance(x, dict) and x.get("choices")
                                                      and x["choices"][0].get("index") == index
                                                      and x["choices"][0].get("finish_reason") and x is not fr)]
            fr["choices"][0]["finish_reason"] = None
            fr["truncated"] = True  # marks the cut for the assertion (ignored by the guard)
            return [*cut, {"id": "chatcmpl-p", "object": "chat.completion.chunk",
                           "choices": [{"index": index, "delta": {}, "finish_reason": "length"}]}]
    return frames


def render(f: Faults, frames: list[Any]) -> bytes:
    eol = "\r\n" if f.crlf else "\n"
    sep = "data:" if f.no_space else "data: "
    out = []
    for fr in frames:
        if f.comments:
            out.append(": keepalive" + eol + eol)
        out.append(sep + (fr if isinstance(fr, str) else json.dumps(fr)) + eol + eol)
    return "".join(out).encode()


def decide(body: bytes, cuts: list[int], n: int) -> Decision:
    guard = AttemptGuard(RequestSpec(tools=TOOLS, n=n), POLICY)
    bounds = [0, *cuts, len(body)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        guard.feed(body[a:b])
    done = guard.finish()[-1]
    assert isinstance(done, Done)
    return done.decision


def truncated(body: bytes) -> bool:
    """Whether the truncation fault found an argument fragment to cut."""
    return b'"truncated": true' in body


@SETTINGS
@given(scenarios())
def test_it_recovers_mangled_turns_exactly(scenario: tuple[list[Choice], Faults, bytes, list[int]]) -> None:
    """Any combination of absorbable faults yields the original turn; fatal ones yield a retry."""
    cs, f, body, cuts = scenario
    d = decide(body, cuts, len(cs))
    assert FindingKind.GUARD_INTERNAL_ERROR not in {x.kind for x in d.findings}
    if f.fatal in ("error", "fused", "regenerate") or truncated(body):
        assert d.outcome in (Outcome.RETRY, Outcome.UPSTREAM_ERROR), d
        return
    assert d.usable, (d.reason, body)
    assert d.turn is not None
    got = {c.index: c for c in d.turn.choices}
    for c in cs:
        out = got[c.index]
        assert out.content == (c.content or None)
        assert out.reasoning == c.reasoning
        assert [(t.name, json.loads(t.arguments)) for t in out.tool_calls] == [(k.name, k.args) for k in c.calls]
        assert out.finish_reason == ("tool_calls" if c.calls else "stop")
        assert len({t.id for t in out.tool_calls}) == len(out.tool_calls)
    if not f.anomalies:
        assert d.outcome is Outcome.CLEAN, d.findings
    if any(x.kind.value.endswith("-in-content") for x in d.findings):
        assert f.leak != "none" and d.outcome is Outcome.REPAIRED


@SETTINGS
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=4))
def test_it_never_raises_on_arbitrary_bytes(body: bytes, cuts: list[int]) -> None:
    """Garbage in, a decision out: no exception, exactly one Done, no internal error."""
    d = decide(body, sorted(c for c in cuts if c <= len(body)), 1)
    assert FindingKind.GUARD_INTERNAL_ERROR not in {x.kind for x in d.findings}
    assert decide_completion(body, RequestSpec(tools=TOOLS), POLICY) is not None


JSON_LEAF = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "null", "x", "get_time", "{"])
KEYS = st.sampled_from(["id", "index", "choices", "delta", "tool_calls", "function", "name", "arguments", "type",
                        "content", "reasoning_content", "finish_reason", "error", "usage", "role", "refusal",
                        "function_call", "message"])
JSONISH = st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(KEYS, inner, max_size=4), max_leaves=12)


@SETTINGS
@given(st.lists(JSONISH, max_size=6), st.booleans())
def test_it_never_fails_on_arbitrary_chunk_shapes(frames: list[Any], done: bool) -> None:
    """Chunks of any JSON shape with the protocol's key names: a decision, never a guard error."""
    body = render(Faults(no_done=not done), [*frames, *(["[DONE]"] if done else [])])
    d = decide(body, [], 1)
    assert FindingKind.GUARD_INTERNAL_ERROR not in {x.kind for x in d.findings}
    completion = json.dumps({"choices": frames}).encode()
    d = decide_completion(completion, RequestSpec(tools=TOOLS), POLICY)
    assert FindingKind.GUARD_INTERNAL_ERROR not in {x.kind for x in d.findings}
