"""Corruption generators: one per fault kind of the regression corpus (``fault-cases/CNN.json``).

Each :class:`Fault` reproduces the *shape* its corpus case describes on any generated turn (other
names, arguments, splits and positions than the fixture). A fault changes the turn before it is
framed (``on_turn``: argument text, names, finish reason, leaked markup, a pre-stream HTTP error),
or rewrites the framed stream (``on_stream``: identity fields, indexes, framing, comments,
truncation). Turn-level faults also apply to non-stream answers.

This module fakes upstream bugs; it must never share code with the guard that detects them.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.simulator.frames import (
    ANNOTATION,
    CALL_ARGS,
    CALL_HEAD,
    COMMENT,
    CONTENT,
    DONE,
    ERROR,
    FINISH,
    RAW,
    USAGE,
    Envelope,
    Frame,
    Stream,
    frame_bytes,
)
from proxy.simulator.schemagen import generate_value
from proxy.simulator.turns import ToolCall, Turn, new_call, split_text


@dataclass
class FaultContext:
    """What a fault may look at: the declared tools, a seeded RNG, the chosen variant."""

    tools: list[dict[str, Any]]
    rng: random.Random
    include_usage: bool = False
    variant: str | None = None


TurnHook = Callable[[Turn, FaultContext], None]
StreamHook = Callable[[Stream, Turn, FaultContext], None]


@dataclass(frozen=True)
class Fault:
    """A fault kind: when it applies, and how it changes the turn and/or the framed stream."""

    kind: str
    case: str
    applies: Callable[[Turn, FaultContext], bool]
    on_turn: TurnHook | None = None
    on_stream: StreamHook | None = None
    variants: tuple[str, ...] = ()

    @property
    def nonstream(self) -> bool:
        """Whether the fault can also corrupt a non-stream ``chat.completion`` answer."""
        return self.on_stream is None


# --- applicability -------------------------------------------------------------------------------


def _always(turn: Turn, ctx: FaultContext) -> bool:
    return True


def _has_calls(turn: Turn, ctx: FaultContext) -> bool:
    return bool(turn.calls)


def _two_calls(turn: Turn, ctx: FaultContext) -> bool:
    return len(turn.calls) >= 2


def _long_name(turn: Turn, ctx: FaultContext) -> bool:
    return any(len(c.name) >= 2 for c in turn.calls)


def _split_arguments(turn: Turn, ctx: FaultContext) -> bool:
    return any(len(c.fragments) >= 2 for c in turn.calls)


def _properties(tool: dict[str, Any]) -> dict[str, Any]:
    props = (tool.get("parameters") or {}).get("properties")
    return props if isinstance(props, dict) else {}


def _type_of(schema: Any) -> str | None:
    kind = schema.get("type") if isinstance(schema, dict) else None
    return next((t for t in kind if t != "null"), None) if isinstance(kind, list) else kind


def _nested_props(tool: dict[str, Any]) -> list[str]:
    return [k for k, s in _properties(tool).items() if _type_of(s) in ("array", "object")]


def _free_string_props(tool: dict[str, Any]) -> list[str]:
    """String properties without constraints that extra lines of text could break."""
    limits = ("enum", "const", "maxLength", "pattern", "format")
    return [k for k, s in _properties(tool).items() if _type_of(s) == "string" and not any(key in s for key in limits)]


def _no_arg(tool: dict[str, Any]) -> bool:
    return not _properties(tool)


def _tool_with(pick: Callable[[dict[str, Any]], Any]) -> Callable[[Turn, FaultContext], bool]:
    def applies(turn: Turn, ctx: FaultContext) -> bool:
        return bool(turn.calls) and any(pick(t) for t in ctx.tools)

    return applies


def _call_for(turn: Turn, ctx: FaultContext, pick: Callable[[dict[str, Any]], Any]) -> ToolCall:
    """A call of ``turn`` to a tool satisfying ``pick``; replaces the first call if none is."""
    by_name = {t["name"]: t for t in ctx.tools}
    for call in turn.calls:
        if call.name in by_name and pick(by_name[call.name]):
            return call
    tool = next(t for t in ctx.tools if pick(t))
    call = new_call(tool, ctx.rng, number=0)
    call.id = turn.calls[0].id
    turn.calls[0] = call
    return call


# --- turn-level faults ---------------------------------------------------------------------------


def _arguments_as_object(turn: Turn, ctx: FaultContext) -> None:
    """C13: ``function.arguments`` is the parsed object, not a JSON string."""
    call = ctx.rng.choice(turn.calls)
    call.set_wire(dict(call.arguments), ctx.rng)


def _empty_arguments(turn: Turn, ctx: FaultContext) -> None:
    """C19: a call to a parameterless tool whose arguments stay ``""``."""
    _call_for(turn, ctx, _no_arg).set_wire("", ctx.rng)


def _double_encoded(turn: Turn, ctx: FaultContext) -> None:
    """C20: an array/object argument sent as a JSON string holding that value."""
    call = _call_for(turn, ctx, _nested_props)
    tool = next(t for t in ctx.tools if t["name"] == call.name)
    key = ctx.rng.choice(_nested_props(tool))
    if key not in call.arguments:
        schema = _properties(tool)[key]
        call.arguments[key] = generate_value(schema, ctx.rng, name=key, root=tool["parameters"])
    wire = {**call.arguments, key: json.dumps(call.arguments[key], ensure_ascii=False)}
    call.set_wire(json.dumps(wire, ensure_ascii=False), ctx.rng)


def _raw_controls(turn: Turn, ctx: FaultContext) -> None:
    """C21: newlines inside a string argument sent raw (unescaped) in the JSON text."""
    call = _call_for(turn, ctx, _free_string_props)
    tool = next(t for t in ctx.tools if t["name"] == call.name)
    key = ctx.rng.choice(_free_string_props(tool))
    value = f"{call.arguments.get(key, 'update')}\n\nadds a parser module"
    call.arguments[key] = value
    marker = "@@toolrelay-sim-raw@@"
    text = json.dumps({**call.arguments, key: marker}, ensure_ascii=False)
    raw_value = json.dumps(value, ensure_ascii=False).replace("\\n", "\n")
    call.set_wire(text.replace(json.dumps(marker), raw_value), ctx.rng)


def _code_fence(turn: Turn, ctx: FaultContext) -> None:
    """C23: the arguments wrapped in a Markdown code fence, split like tokenizer output."""
    call = ctx.rng.choice(turn.calls)
    text = call.wire if isinstance(call.wire, str) else json.dumps(call.arguments)
    call.set_wire("```json\n" + text + "\n```", ctx.rng)
    call.fragments = ["```", "json\n", *split_text(text, ctx.rng), "\n```"]


def _truncated_length(turn: Turn, ctx: FaultContext) -> None:
    """C24: the last call's arguments cut short by the output limit; finish reason ``length``."""
    call = turn.calls[-1]
    text = call.wire if isinstance(call.wire, str) else json.dumps(call.arguments)
    cut = ctx.rng.randint(max(1, len(text) // 3), max(1, 2 * len(text) // 3))
    call.set_wire(text[:cut], ctx.rng)
    turn.finish_reason = "length"


def _leak(render: Callable[[list[ToolCall], random.Random], list[str]]) -> TurnHook:
    """Tool calls written into the text channel as model markup; finish reason ``stop``."""

    def hook(turn: Turn, ctx: FaultContext) -> None:
        turn.content = [*turn.content, *render(turn.calls, ctx.rng)]
        turn.calls = []
        turn.finish_reason = "stop"

    return hook


def _hermes_markup(calls: list[ToolCall], rng: random.Random) -> list[str]:
    """C26: ``<tool_call>{"name": …, "arguments": …}</tool_call>`` (Qwen / Hermes templates)."""
    out: list[str] = []
    for call in calls:
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        out += ["<tool_call>", "\n", *split_text(body, rng), "\n", "</tool_call>"]
    return out


_DS = {
    "calls_begin": "<\uff5ctool\u2581calls\u2581begin\uff5c>",
    "calls_end": "<\uff5ctool\u2581calls\u2581end\uff5c>",
    "call_begin": "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "call_end": "<\uff5ctool\u2581call\u2581end\uff5c>",
    "sep": "<\uff5ctool\u2581sep\uff5c>",
}


def _deepseek_markup(calls: list[ToolCall], rng: random.Random) -> list[str]:
    """C27: DeepSeek's special tool-call tokens with a fenced JSON body."""
    out = [_DS["calls_begin"]]
    for call in calls:
        body = json.dumps(call.arguments, ensure_ascii=False)
        out += [_DS["call_begin"], "function", _DS["sep"], call.name + "\n", "```json\n"]
        out += [*split_text(body, rng), "\n```", _DS["call_end"]]
    return [*out, _DS["calls_end"]]


def _kimi_markup(calls: list[ToolCall], rng: random.Random) -> list[str]:
    """C29: Kimi K2 section tokens with ``functions.<name>:<n>`` call ids."""
    out = ["<|tool_calls_section_begin|>"]
    for number, call in enumerate(calls):
        body = json.dumps(call.arguments, ensure_ascii=False)
        out += [f"<|tool_call_begin|>functions.{call.name}:{number}", "<|tool_call_argument_begin|>"]
        out += [*split_text(body, rng), "<|tool_call_end|>"]
    return [*out, "<|tool_calls_section_end|>"]


def _minimax_markup(calls: list[ToolCall], rng: random.Random) -> list[str]:
    """C31: MiniMax ``<minimax:tool_call><invoke name=…><parameter name=…>`` XML."""
    out = ["<minimax:tool_call>\n"]
    for call in calls:
        out.append(f'<invoke name="{call.name}">\n')
        for key, value in call.arguments.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            out.append(f'<parameter name="{key}">{text}</parameter>\n')
        out.append("</invoke>\n")
    return [*out, "</minimax:tool_call>"]


def _finish_stop(turn: Turn, ctx: FaultContext) -> None:
    """C32: tool calls, but finish reason ``stop``."""
    turn.finish_reason = "stop"


_NAME_VARIANTS = ("prefixed", "invented")
_INVENTED = ("toolbox.web.answer", "web_search_v2", "python_exec", "browser.open_url", "assistant_memory")


def _undeclared_name(turn: Turn, ctx: FaultContext) -> None:
    """C46: a call named with a template prefix (``functions.``) or a tool nobody declared."""
    variant = ctx.variant or ctx.rng.choice(_NAME_VARIANTS)
    call = ctx.rng.choice(turn.calls)
    if variant == "prefixed":
        call.name = "functions." + call.name
    else:
        declared = {t["name"] for t in ctx.tools}
        call.name = ctx.rng.choice([n for n in _INVENTED if n not in declared])


def _tool_use_failed(turn: Turn, ctx: FaultContext) -> None:
    """C47: HTTP 400 ``tool_use_failed`` (Groq) carrying the raw attempt in ``failed_generation``."""
    call = turn.calls[0]
    generation = f"<function={call.name}{json.dumps(call.arguments, ensure_ascii=False)}</function>"
    message = "Failed to call a function. Please adjust your prompt. See 'failed_generation' for more details."
    error = {"message": message, "type": "invalid_request_error", "code": "tool_use_failed"}
    turn.http_error = (400, {"error": {**error, "failed_generation": generation}})


# --- stream-level faults -------------------------------------------------------------------------


def _set_entry(frame: Frame, entry: dict[str, Any]) -> None:
    assert frame.chunk is not None
    frame.chunk["choices"][0]["delta"]["tool_calls"] = [entry]


def _full_entry(index: int, call: ToolCall, arguments: Any) -> dict[str, Any]:
    function = {"name": call.name, "arguments": arguments}
    return {"index": index, "id": call.id, "type": "function", "function": function}


def _name_on_continuations(name_of: Callable[[ToolCall], str]) -> StreamHook:
    """C01 / C03: every argument delta also carries ``function.name`` (``""`` or the name again)."""

    def hook(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
        for frame in stream.tagged(CALL_ARGS):
            for entry in frame.entries():
                entry["function"] = {"name": name_of(turn.calls[frame.call]), **entry["function"]}

    return hook


def _name_late(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C05: the header delta has ``name: ""``; the name arrives (with id/type) on the next delta."""
    for index, call in enumerate(turn.calls):
        stream.frames[stream.index_of(CALL_HEAD, index)].entries()[0]["function"]["name"] = ""
        first_args = stream.frames[stream.index_of(CALL_ARGS, index)]
        _set_entry(first_args, _full_entry(index, call, first_args.entries()[0]["function"]["arguments"]))


def _name_split(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C06: the name arrives in two pieces that must be concatenated."""
    for index, call in enumerate(turn.calls):
        if len(call.name) < 2:
            continue
        cut = ctx.rng.randint(1, len(call.name) - 1)
        stream.frames[stream.index_of(CALL_HEAD, index)].entries()[0]["function"]["name"] = call.name[:cut]
        entry = stream.frames[stream.index_of(CALL_ARGS, index)].entries()[0]
        entry["function"] = {"name": call.name[cut:], **entry["function"]}


def _id_changes(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C07: argument deltas carry a different id (and ``type``, ``name: ""``) than the header."""
    for frame in stream.tagged(CALL_ARGS):
        arguments = frame.entries()[0]["function"]["arguments"]
        entry = {"index": frame.call, "id": f"toolcall{frame.call}", "type": "function"}
        _set_entry(frame, {**entry, "function": {"name": "", "arguments": arguments}})


def _drop_from_headers(key: str) -> StreamHook:
    """C08 / C12: a required key (``id``, ``type``) missing from each call's header delta."""

    def hook(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
        for frame in stream.tagged(CALL_HEAD):
            frame.entries()[0].pop(key, None)

    return hook


def _index_missing(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C10: no ``index`` on tool-call entries; as Gemini sends them, each call complete in one delta."""
    _single_chunk(stream, turn, ctx)
    for frame in stream.tagged(CALL_HEAD):
        frame.entries()[0].pop("index", None)


def _share_index_0(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C09: parallel calls, each complete in one delta, all at ``index: 0``."""
    first = stream.index_of(CALL_HEAD)
    rest = [f for f in stream.frames if f.tag not in (CALL_HEAD, CALL_ARGS)]
    env = stream.envelope
    singles = []
    for number, call in enumerate(turn.calls):
        delta = {"role": "assistant", "content": "", "tool_calls": [_full_entry(0, call, call.wire)]}
        singles.append(Frame(CALL_HEAD, env.chunk(delta), call=number))
    stream.frames = rest[:first] + singles + rest[first:]


def _cumulative(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C14: each argument delta re-sends everything so far (snapshots, not deltas)."""
    so_far: dict[int, str] = {}
    for frame in stream.tagged(CALL_ARGS):
        function = frame.entries()[0]["function"]
        so_far[frame.call] = so_far.get(frame.call, "") + function["arguments"]
        function["arguments"] = so_far[frame.call]


def _resent_at_end(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C15: after the deltas, the complete call (id, name, full arguments) is sent once more."""
    for index in reversed(range(len(turn.calls))):
        call = turn.calls[index]
        after = max(stream.index_of(CALL_ARGS, index, last=True), stream.index_of(CALL_HEAD, index))
        chunk = stream.envelope.chunk({"tool_calls": [_full_entry(index, call, call.wire)]})
        stream.frames.insert(after + 1, Frame(CALL_ARGS, chunk, call=index))


def _single_chunk(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C17: each call complete in its header delta (no argument deltas)."""
    for index, call in enumerate(turn.calls):
        stream.frames[stream.index_of(CALL_HEAD, index)].entries()[0]["function"]["arguments"] = call.wire
    stream.frames = [f for f in stream.frames if f.tag != CALL_ARGS]


def _metadata_with_finish(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C18: the last argument delta repeats id/type/name and carries the finish reason."""
    index = len(turn.calls) - 1
    frame = stream.frames[stream.index_of(CALL_ARGS, index, last=True)]
    _set_entry(frame, _full_entry(index, turn.calls[index], frame.entries()[0]["function"]["arguments"]))
    assert frame.chunk is not None
    frame.chunk["choices"][0]["finish_reason"] = turn.finish_reason
    stream.frames = [f for f in stream.frames if f.tag != FINISH]


def _duplicate_finish(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C33: a second finish chunk with ``stop`` after the ``tool_calls`` one."""
    extra = Frame(FINISH, stream.envelope.chunk({"content": None}, "stop"))
    stream.frames.insert(stream.index_of(FINISH) + 1, extra)


def _empty_string_finish(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C34: ``finish_reason: ""`` on every chunk; the finish chunk carries a legacy ``function_call`` stub."""
    for frame in stream.frames:
        for choice in (frame.chunk or {}).get("choices") or []:
            if choice.get("finish_reason") is None:
                choice["finish_reason"] = ""
    finish = stream.frames[stream.index_of(FINISH)]
    assert finish.chunk is not None
    finish.chunk["choices"][0]["delta"] = {"function_call": {"name": "", "arguments": ""}}


def _usage_unasked(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C36: a ``choices: []`` usage chunk the client did not ask for."""
    stream.frames.insert(stream.index_of(DONE), Frame(USAGE, stream.envelope.usage_chunk(turn.usage)))


_FILTER_RESULTS = {
    name: {"filtered": False, "severity": "safe"} for name in ("hate", "self_harm", "sexual", "violence")
}


def _content_filter(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C37: Azure prompt-filter and annotation chunks (blank id/model/object, no ``delta``)."""
    blank = {"created": 0, "id": "", "model": "", "object": ""}
    filters = [{"prompt_index": 0, "content_filter_results": _FILTER_RESULTS}]
    prompt = {"choices": [], **blank, "prompt_filter_results": filters}
    offsets = {"check_offset": 12, "start_offset": 12, "end_offset": 48}
    choice: dict[str, Any] = {"index": 0, "finish_reason": None, "content_filter_results": _FILTER_RESULTS}
    choice["content_filter_offsets"] = offsets
    for frame in stream.frames:
        for c in (frame.chunk or {}).get("choices") or []:
            c["content_filter_results"] = {}
    stream.frames.insert(stream.index_of(FINISH), Frame(ANNOTATION, {"choices": [choice], **blank, "usage": None}))
    stream.frames.insert(0, Frame(ANNOTATION, prompt))


def _data_without_space(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C38: ``data:{…}`` (legal SSE, but literal ``data: `` matchers skip every event)."""
    stream.data_prefix = b"data:"


def _comment_keepalives(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C40: ``: OPENROUTER PROCESSING`` comment lines before and between events."""
    comment = b": OPENROUTER PROCESSING\n\n"
    frames = [Frame(COMMENT, raw=comment), Frame(COMMENT, raw=comment)]
    for number, frame in enumerate(stream.frames):
        frames.append(frame)
        if number % 3 == 1 and frame.tag != DONE:
            frames.append(Frame(COMMENT, raw=comment))
    stream.frames = frames


def _mid_stream_error(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C41: partial output, then a chunk with top-level ``error`` and ``finish_reason: error``; no ``[DONE]``."""
    cut = _cut_point(stream, turn, ctx.rng)
    env = stream.envelope
    error = {"code": "server_error", "message": "Provider disconnected unexpectedly"}
    chunk = {"id": env.completion_id, "object": "chat.completion.chunk", "created": env.created, "model": env.model}
    chunk |= {"error": error, "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]}
    stream.frames = [*stream.frames[:cut], Frame(ERROR, chunk)]


def _cut_point(stream: Stream, turn: Turn, rng: random.Random) -> int:
    """Where to break off: inside the last call's arguments, else halfway through the text."""
    if turn.calls:
        index = len(turn.calls) - 1
        args = [i for i, f in enumerate(stream.frames) if f.tag == CALL_ARGS and f.call == index]
        if len(args) >= 2:
            return args[rng.randint(1, len(args) - 1)]
        return args[0] if args else stream.index_of(CALL_HEAD, index) + 1
    text = [i for i, f in enumerate(stream.frames) if f.tag == CONTENT]
    return text[len(text) // 2] if text else stream.index_of(FINISH)


def _error_field(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C43: llama-server's non-SSE ``error:`` field, then ``data: [DONE]`` (HTTP 200)."""
    error = {"code": 400, "message": "the request exceeds the available context size, try increasing it"}
    line = json.dumps({**error, "type": "invalid_request_error"}, separators=(",", ":"))
    stream.frames = [Frame(RAW, raw=b"error: " + line.encode() + b"\n\n"), Frame(DONE)]


def _fused_frames(stream: Stream, turn: Turn, ctx: FaultContext) -> None:
    """C45: a frame cut mid-JSON fused with a restarted generation's first ``data:`` frame."""
    data = [i for i, f in enumerate(stream.frames) if f.chunk is not None and f.tag != USAGE]
    broken = data[ctx.rng.randint(1, len(data) - 1)]
    env = stream.envelope
    # The upstream reset and restarted generation: new completion id, much later ``created``.
    new_id = f"chatcmpl-{ctx.rng.getrandbits(96):024x}"
    restarted_env = Envelope(new_id, env.created + 90, env.model, env.include_usage)
    restart = _reidentify(stream.frames, restarted_env)
    whole = frame_bytes(stream.frames[broken], stream.data_prefix)
    cut = ctx.rng.randint(len(stream.data_prefix) + 2, len(whole) - 4)
    fused = whole[:cut] + frame_bytes(restart[0], stream.data_prefix)
    stream.frames = [*stream.frames[:broken], Frame(RAW, raw=fused), *restart[1:]]


def _reidentify(frames: Sequence[Frame], env: Envelope) -> list[Frame]:
    out = copy.deepcopy(list(frames))
    for frame in out:
        if frame.chunk is not None and frame.chunk.get("id"):
            frame.chunk.update(id=env.completion_id, created=env.created)
    return out


# --- registry ------------------------------------------------------------------------------------

FAULTS: dict[str, Fault] = {
    f.kind: f
    for f in (
        Fault("empty-name-on-continuation", "C01", _has_calls, on_stream=_name_on_continuations(lambda c: "")),
        Fault("name-repeated-every-chunk", "C03", _has_calls, on_stream=_name_on_continuations(lambda c: c.name)),
        Fault("name-arrives-late", "C05", _has_calls, on_stream=_name_late),
        Fault("name-split-across-chunks", "C06", _long_name, on_stream=_name_split),
        Fault("tool-call-id-changes-mid-stream", "C07", _has_calls, on_stream=_id_changes),
        Fault("tool-call-id-missing", "C08", _has_calls, on_stream=_drop_from_headers("id")),
        Fault("parallel-calls-share-index-0", "C09", _two_calls, on_stream=_share_index_0),
        Fault("tool-call-index-missing", "C10", _has_calls, on_stream=_index_missing),
        Fault("tool-call-type-missing", "C12", _has_calls, on_stream=_drop_from_headers("type")),
        Fault("arguments-as-json-object", "C13", _has_calls, on_turn=_arguments_as_object),
        Fault("cumulative-arguments-snapshots", "C14", _split_arguments, on_stream=_cumulative),
        Fault("full-arguments-resent-at-end", "C15", _has_calls, on_stream=_resent_at_end),
        Fault("single-chunk-complete-call", "C17", _has_calls, on_stream=_single_chunk),
        Fault("final-chunk-repeats-metadata-with-finish", "C18", _has_calls, on_stream=_metadata_with_finish),
        Fault("empty-arguments-for-no-arg-tool", "C19", _tool_with(_no_arg), on_turn=_empty_arguments),
        Fault("nested-values-double-encoded", "C20", _tool_with(_nested_props), on_turn=_double_encoded),
        Fault("raw-control-characters-in-arguments", "C21", _tool_with(_free_string_props), on_turn=_raw_controls),
        Fault("code-fence-prefix-in-arguments", "C23", _has_calls, on_turn=_code_fence),
        Fault("truncated-arguments-length", "C24", _has_calls, on_turn=_truncated_length),
        Fault("hermes-tool-call-tags-in-content", "C26", _has_calls, on_turn=_leak(_hermes_markup)),
        Fault("deepseek-special-tokens-in-content", "C27", _has_calls, on_turn=_leak(_deepseek_markup)),
        Fault("kimi-section-tokens-in-content", "C29", _has_calls, on_turn=_leak(_kimi_markup)),
        Fault("minimax-xml-in-content", "C31", _has_calls, on_turn=_leak(_minimax_markup)),
        Fault("finish-reason-stop-with-tool-calls", "C32", _has_calls, on_turn=_finish_stop),
        Fault("duplicate-terminal-finish-reason", "C33", _has_calls, on_stream=_duplicate_finish),
        Fault("empty-string-finish-reason-and-legacy-stub", "C34", _has_calls, on_stream=_empty_string_finish),
        Fault("usage-only-chunk-empty-choices", "C36", lambda t, ctx: not ctx.include_usage, on_stream=_usage_unasked),
        Fault("content-filter-annotation-chunks", "C37", _always, on_stream=_content_filter),
        Fault("sse-data-without-space", "C38", _always, on_stream=_data_without_space),
        Fault("sse-comment-keepalives", "C40", _always, on_stream=_comment_keepalives),
        Fault("mid-stream-error-chunk", "C41", _always, on_stream=_mid_stream_error),
        Fault("nonstandard-sse-error-field", "C43", _always, on_stream=_error_field),
        Fault("fused-truncated-sse-frames", "C45", _always, on_stream=_fused_frames),
        Fault("undeclared-or-prefixed-tool-name", "C46", _has_calls, on_turn=_undeclared_name, variants=_NAME_VARIANTS),
        Fault("pre-stream-tool-use-failed", "C47", _has_calls, on_turn=_tool_use_failed),
    )
}  # fmt: skip


def parse_kinds(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """Validate a kinds list (``"a,b"`` or a sequence; ``kind/variant`` allowed). Empty means all.

    Raises ``ValueError`` naming the unknown kind or variant.
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec or ())
    kinds = tuple(item.strip() for item in items if item.strip())
    for item in kinds:
        kind, _, variant = item.partition("/")
        if kind not in FAULTS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(FAULTS)}")
        if variant and variant not in FAULTS[kind].variants:
            raise ValueError(f"unknown variant {variant!r} of {kind}; known: {', '.join(FAULTS[kind].variants)}")
    return kinds or tuple(FAULTS)


def pick_fault(kinds: Sequence[str], turn: Turn, ctx: FaultContext, *, stream: bool) -> tuple[Fault, str | None] | None:
    """Draw one applicable fault (and its variant) from ``kinds`` for this turn, or None."""
    usable = []
    for item in kinds:
        kind, _, variant = item.partition("/")
        fault = FAULTS[kind]
        if fault.applies(turn, ctx) and (stream or fault.nonstream):
            usable.append((fault, variant or None))
    return ctx.rng.choice(usable) if usable else None
