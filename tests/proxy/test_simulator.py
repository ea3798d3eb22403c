"""The fault-injecting upstream simulator, driven over real sockets with httpx and openai-python."""

from __future__ import annotations

import hashlib
import json
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from proxy.simulator import FAULTS, RunningSimulator, start_in_thread
from proxy.simulator.cases import CaseLibrary, default_cases_dir
from proxy.simulator.schemagen import generate_arguments

REPO = Path(__file__).resolve().parents[2]


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": schema}}


READ_FILE = _tool("read_file", {"path": {"type": "string"}}, ["path"])
WRITE_FILE = _tool("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"])
SET_TODOS = _tool("set_todos", {"todos": {"type": "array", "items": {"type": "string"}}}, ["todos"])
GET_TIME = _tool("get_time", {}, [])
SEARCH = _tool(
    "search",
    {
        "query": {"type": "string", "minLength": 3},
        "mode": {"type": "string", "enum": ["fast", "deep"]},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        "filters": {
            "type": "object",
            "properties": {
                "paths": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4},
                "since": {"type": "string", "format": "date"},
                "weights": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}},
            },
            "required": ["paths"],
            "additionalProperties": False,
        },
        "edits": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"line": {"type": "integer"}, "replace": {"type": "boolean"}},
                "required": ["line", "replace"],
            },
        },
    },
    ["query", "mode", "filters", "edits"],
)
ALL_TOOLS = [READ_FILE, WRITE_FILE, SET_TODOS, GET_TIME]
DECLARED = {t["function"]["name"] for t in ALL_TOOLS}


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningSimulator]:
    with start_in_thread() as running:
        yield running


@pytest.fixture
def client(sim: RunningSimulator) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=10) as http:
        yield http


def _body(tag: str, *, tools: list[dict[str, Any]] | None = None, stream: bool = True, **extra: Any) -> dict[str, Any]:
    """A request whose messages are unique to ``tag`` (attempt counters are per messages)."""
    body: dict[str, Any] = {"model": "sim", "stream": stream, "messages": [{"role": "user", "content": tag}]}
    if tools:
        body["tools"] = tools
    return {**body, **extra}


def _chat(client: httpx.Client, scenario: str, body: dict[str, Any]) -> httpx.Response:
    return client.post("/chat/completions", json=body, headers={"x-sim-scenario": scenario})


def _stream(client: httpx.Client, scenario: str, body: dict[str, Any]) -> Any:
    return client.stream("POST", "/chat/completions", json=body, headers={"x-sim-scenario": scenario})


def _events(raw: bytes) -> list[str]:
    """SSE ``data`` payloads per the WHATWG rules (optional space, comments, unterminated tail dropped)."""
    events, data = [], []
    for line in re.split(r"\r\n|\r|\n", raw.decode("utf-8")):
        if not line:
            if data:
                events.append("\n".join(data))
            data = []
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    return events


def _chunks(raw: bytes) -> list[dict[str, Any]]:
    """The events that parse as JSON objects."""
    out = []
    for event in _events(raw):
        try:
            parsed = json.loads(event)
        except json.JSONDecodeError:
            continue
        if isinstance(parsed, dict):
            out.append(parsed)
    return out


def _entries(raw: bytes) -> list[dict[str, Any]]:
    return [
        e for c in _chunks(raw) for ch in c.get("choices") or [] for e in ch.get("delta", {}).get("tool_calls") or []
    ]


def _accumulate(raw: bytes) -> dict[str, Any]:
    """A canonical stream's turn: text, calls by index (name, parsed arguments), finish reasons."""
    events = _events(raw)
    assert events[-1] == "[DONE]"
    calls: dict[int, dict[str, Any]] = {}
    turn: dict[str, Any] = {"content": "", "reasoning": "", "finish": [], "usage": None}
    for chunk in _chunks(raw):
        turn["usage"] = chunk.get("usage") or turn["usage"]
        for choice in chunk["choices"]:
            delta = choice["delta"]
            turn["content"] += delta.get("content") or ""
            turn["reasoning"] += delta.get("reasoning_content") or ""
            if choice["finish_reason"]:
                turn["finish"].append(choice["finish_reason"])
            for entry in delta.get("tool_calls") or []:
                slot = calls.setdefault(entry["index"], {"id": "", "name": "", "arguments": ""})
                slot["id"] += entry.get("id") or ""
                slot["name"] += entry["function"].get("name") or ""
                slot["arguments"] += entry["function"].get("arguments") or ""
    turn["calls"] = [
        {"id": c["id"], "name": c["name"], "arguments": json.loads(c["arguments"])} for _, c in sorted(calls.items())
    ]
    return turn


def _schema_of(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(t["function"]["parameters"] for t in tools if t["function"]["name"] == name)


def _record(sim: RunningSimulator, tag: str) -> dict[str, Any]:
    """The newest stats record of the request whose message is ``tag``."""
    records = [r for r in sim.stats()["requests"] if (r["body"] or {}).get("messages", [{}])[0].get("content") == tag]
    return records[-1]


# --- case replay ---------------------------------------------------------------------------------


def test_it_replays_every_fault_case_byte_for_byte(client: httpx.Client) -> None:
    library = CaseLibrary(default_cases_dir())
    assert len(library.ids()) >= 35
    for case_id in library.ids():
        case = library.get(case_id)
        response = _chat(client, f"case:{case_id}", _body(f"replay {case_id}", tools=case["request_tools"]))
        if case.get("upstream_http"):
            assert response.status_code == case["upstream_http"]["status"]
            assert response.headers["content-type"] == case["upstream_http"]["content_type"]
            assert response.json() == case["upstream_http"]["body"]
        elif case.get("raw_sse") is not None:
            assert response.content == case["raw_sse"].encode()
        else:
            assert response.content == b"".join(b"data: " + c.encode() + b"\n\n" for c in case["upstream_chunks"])
        assert response.headers["x-sim-fault"] == case["kind"], case_id


def test_it_selects_the_scenario_by_model_name_when_no_header_is_sent(client: httpx.Client) -> None:
    case = CaseLibrary(default_cases_dir()).get("C38")
    response = client.post("/chat/completions?api-version=1", json=_body("by model", model="case:C38"))
    assert response.content == case["raw_sse"].encode()
    header_wins = _chat(client, "text:2", _body("header wins", model="case:C38"))
    assert _accumulate(header_wins.content)["content"] and "x-sim-fault" not in header_wins.headers


def test_it_serves_the_broken_stream_then_the_clean_expected_turn(sim: RunningSimulator, client: httpx.Client) -> None:
    case = CaseLibrary(default_cases_dir()).get("C14")
    broken = b"".join(b"data: " + c.encode() + b"\n\n" for c in case["upstream_chunks"])
    body = _body("broken then clean", tools=case["request_tools"])

    assert _chat(client, "case:C14:broken=1", body).content == broken
    for _ in range(2):
        clean = _accumulate(_chat(client, "case:C14:broken=1", body).content)
        delivered = [{"name": c["name"], "arguments": c["arguments"]} for c in clean["calls"]]
        assert delivered == case["expected"]["tool_calls"]
        assert clean["finish"] == ["tool_calls"]
    # Other messages are another request: their first attempt is broken again.
    assert _chat(client, "case:C14:broken=1", _body("other messages", tools=case["request_tools"])).content == broken
    assert [r["attempt"] for r in sim.stats()["requests"][-4:]] == [1, 2, 3, 1]

    sim.reset()
    assert sim.stats() == {"requests": [], "counters": {}}
    assert _chat(client, "case:C14:broken=1", body).content == broken


def test_it_builds_the_clean_turn_of_a_retry_case_from_its_declared_tools(client: httpx.Client) -> None:
    case = CaseLibrary(default_cases_dir()).get("C41")
    body = _body("retry case", tools=case["request_tools"])
    assert _chat(client, "case:C41:broken=2", body).headers["x-sim-fault"] == "mid-stream-error-chunk"
    assert _chat(client, "case:C41:broken=2", body).headers["x-sim-fault"] == "mid-stream-error-chunk"
    clean = _accumulate(_chat(client, "case:C41:broken=2", body).content)
    assert [c["name"] for c in clean["calls"]] == ["write_file"]
    jsonschema.validate(clean["calls"][0]["arguments"], _schema_of(case["request_tools"], "write_file"))
    assert clean["finish"] == ["tool_calls"]

    http_case = _body("pre-stream retry case", tools=case["request_tools"])
    assert _chat(client, "case:C47:broken=1", http_case).status_code == 400
    assert _chat(client, "case:C47:broken=1", http_case).status_code == 200


# --- generated turns -----------------------------------------------------------------------------


def test_it_generates_tool_calls_that_validate_against_the_request_schemas(client: httpx.Client) -> None:
    tools = [*ALL_TOOLS, SEARCH]
    for seed in range(12):
        raw = _chat(client, f"gen:corrupt=0:calls=3:seed={seed}", _body(f"valid {seed}", tools=tools)).content
        turn = _accumulate(raw)
        assert len(turn["calls"]) == 3 and turn["finish"] == ["tool_calls"]
        assert turn["content"], "a text preamble comes before the calls by default"
        assert len({c["id"] for c in turn["calls"]}) == 3
        for call in turn["calls"]:
            jsonschema.validate(call["arguments"], _schema_of(tools, call["name"]))


def test_it_honours_tool_choice_and_text_and_reasoning_options(client: httpx.Client) -> None:
    named = {"type": "function", "function": {"name": "search"}}
    body = _body("choice", tools=[*ALL_TOOLS, SEARCH], tool_choice=named)
    turn = _accumulate(_chat(client, "gen:calls=2:text=0:reasoning=1", body).content)
    assert [c["name"] for c in turn["calls"]] == ["search", "search"]
    assert turn["content"] == "" and turn["reasoning"]

    none = _accumulate(_chat(client, "gen", _body("choice none", tools=ALL_TOOLS, tool_choice="none")).content)
    assert none["calls"] == [] and none["content"] and none["finish"] == ["stop"]


def test_it_streams_text_only_with_usage_when_the_request_has_no_tools(client: httpx.Client) -> None:
    raw = _chat(client, "gen:frames=7", _body("no tools", stream_options={"include_usage": True})).content
    turn = _accumulate(raw)
    assert turn["calls"] == [] and turn["finish"] == ["stop"]
    chunks = _chunks(raw)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])
    assert len([c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]) == 7


def test_it_serves_openai_python_streaming_and_non_stream_clients(sim: RunningSimulator) -> None:
    messages: Any = [{"role": "user", "content": "openai sdk"}]
    tools: Any = [*ALL_TOOLS, SEARCH]
    with openai.OpenAI(base_url=sim.url, api_key="x", max_retries=0) as sdk:
        calls: dict[int, dict[str, str]] = {}
        with sdk.chat.completions.create(
            model="gen:seed=5:calls=2", messages=messages, tools=tools, stream=True
        ) as stream:
            for chunk in stream:
                for entry in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    assert entry.function is not None
                    slot = calls.setdefault(entry.index, {"name": "", "arguments": ""})
                    slot["name"] += entry.function.name or ""
                    slot["arguments"] += entry.function.arguments or ""
        assert len(calls) == 2
        for call in calls.values():
            jsonschema.validate(json.loads(call["arguments"]), _schema_of(tools, call["name"]))

        # The SDK's own accumulator (ChatCompletionStreamState) accepts the canonical shape.
        with sdk.chat.completions.stream(model="gen:seed=6", messages=messages, tools=tools) as helper:
            final = helper.get_final_completion()
        assert final.choices[0].finish_reason == "tool_calls"
        assert all(json.loads(c.function.arguments) is not None for c in final.choices[0].message.tool_calls or [])

        completion = sdk.chat.completions.create(model="gen:seed=7", messages=messages, tools=tools)
        tool_calls: Any = completion.choices[0].message.tool_calls
        assert len(tool_calls) == 2
        for tool_call in tool_calls:
            jsonschema.validate(json.loads(tool_call.function.arguments), _schema_of(tools, tool_call.function.name))

        text = sdk.chat.completions.create(model="text:5", messages=messages, stream=True)
        with text:
            assert len([c for c in text if c.choices and c.choices[0].delta.content]) == 5


# --- corruption ----------------------------------------------------------------------------------


def _names_by_index(raw: bytes) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for entry in _entries(raw):
        name = (entry.get("function") or {}).get("name")
        if name:
            names.setdefault(entry.get("index", -1), []).append(name)
    return names


def _arguments_by_index(raw: bytes) -> dict[int, list[Any]]:
    arguments: dict[int, list[Any]] = {}
    for entry in _entries(raw):
        value = (entry.get("function") or {}).get("arguments")
        if value not in (None, ""):
            arguments.setdefault(entry.get("index", -1), []).append(value)
    return arguments


def _finishes(raw: bytes) -> list[Any]:
    return [ch["finish_reason"] for c in _chunks(raw) for ch in c.get("choices") or [] if ch.get("finish_reason")]


def _content(raw: bytes) -> str:
    return "".join(ch.get("delta", {}).get("content") or "" for c in _chunks(raw) for ch in c.get("choices") or [])


def _loads(text: str, **kwargs: Any) -> Any:
    try:
        return json.loads(text, **kwargs)
    except json.JSONDecodeError:
        return None


def _is_cumulative(parts: list[Any]) -> bool:
    return len(parts) >= 2 and all(b.startswith(a) and len(b) > len(a) for a, b in zip(parts, parts[1:], strict=False))


def _resent(parts: list[Any]) -> bool:
    return len(parts) >= 2 and parts[-1] == "".join(parts[:-1]) and _loads(parts[-1]) is not None


SIGNATURES: dict[str, Callable[[httpx.Response], bool]] = {
    "empty-name-on-continuation": lambda r: any(
        "id" not in e and e["function"].get("name") == "" for e in _entries(r.content)
    ),
    "name-repeated-every-chunk": lambda r: any(
        len(n) > 1 and len(set(n)) == 1 for n in _names_by_index(r.content).values()
    ),
    "name-arrives-late": lambda r: (
        any(e.get("id") and e["function"]["name"] == "" for e in _entries(r.content))
        and all("".join(n) in DECLARED for n in _names_by_index(r.content).values())
    ),
    "name-split-across-chunks": lambda r: any(
        len(n) == 2 and "".join(n) in DECLARED and n[0] not in DECLARED for n in _names_by_index(r.content).values()
    ),
    "tool-call-id-changes-mid-stream": lambda r: any(
        len({e["id"] for e in _entries(r.content) if e.get("id") and e["index"] == i}) == 2 for i in range(2)
    ),
    "tool-call-id-missing": lambda r: bool(_entries(r.content)) and not any("id" in e for e in _entries(r.content)),
    "parallel-calls-share-index-0": lambda r: (
        {e["index"] for e in _entries(r.content)} == {0} and len({e["id"] for e in _entries(r.content)}) == 2
    ),
    "tool-call-index-missing": lambda r: (
        bool(_entries(r.content)) and all("index" not in e for e in _entries(r.content))
    ),
    "tool-call-type-missing": lambda r: bool(_entries(r.content)) and all("type" not in e for e in _entries(r.content)),
    "arguments-as-json-object": lambda r: any(
        isinstance(a, dict) for p in _arguments_by_index(r.content).values() for a in p
    ),
    "cumulative-arguments-snapshots": lambda r: any(_is_cumulative(p) for p in _arguments_by_index(r.content).values()),
    "full-arguments-resent-at-end": lambda r: any(_resent(p) for p in _arguments_by_index(r.content).values()),
    "single-chunk-complete-call": lambda r: all(
        e.get("id") and _loads(e["function"]["arguments"]) is not None for e in _entries(r.content)
    ),
    "final-chunk-repeats-metadata-with-finish": lambda r: any(
        c["choices"][0].get("finish_reason") and c["choices"][0]["delta"].get("tool_calls", [{}])[0].get("id")
        for c in _chunks(r.content)
        if c["choices"]
    ),
    "empty-arguments-for-no-arg-tool": lambda r: any(
        n == ["get_time"] and i not in _arguments_by_index(r.content) for i, n in _names_by_index(r.content).items()
    ),
    "nested-values-double-encoded": lambda r: any(
        isinstance((_loads("".join(p)) or {}).get("todos"), str) for p in _arguments_by_index(r.content).values()
    ),
    "raw-control-characters-in-arguments": lambda r: any(
        "\n" in "".join(p) and _loads("".join(p)) is None and _loads("".join(p), strict=False) is not None
        for p in _arguments_by_index(r.content).values()
    ),
    "code-fence-prefix-in-arguments": lambda r: any(
        "".join(p).startswith("```json\n") for p in _arguments_by_index(r.content).values()
    ),
    "truncated-arguments-length": lambda r: (
        _finishes(r.content) == ["length"]
        and _loads("".join(_arguments_by_index(r.content)[max(_arguments_by_index(r.content))])) is None
    ),
    "hermes-tool-call-tags-in-content": lambda r: "<tool_call>" in _content(r.content) and not _entries(r.content),
    "deepseek-special-tokens-in-content": lambda r: "<\uff5ctool\u2581calls\u2581begin\uff5c>" in _content(r.content),
    "kimi-section-tokens-in-content": lambda r: "<|tool_calls_section_begin|>" in _content(r.content),
    "minimax-xml-in-content": lambda r: (
        "<minimax:tool_call>" in _content(r.content) and "<invoke name=" in _content(r.content)
    ),
    "finish-reason-stop-with-tool-calls": lambda r: bool(_entries(r.content)) and _finishes(r.content) == ["stop"],
    "duplicate-terminal-finish-reason": lambda r: _finishes(r.content) == ["tool_calls", "stop"],
    "empty-string-finish-reason-and-legacy-stub": lambda r: (
        any(c["choices"][0].get("finish_reason") == "" for c in _chunks(r.content) if c["choices"])
        and any("function_call" in c["choices"][0]["delta"] for c in _chunks(r.content) if c["choices"])
    ),
    "usage-only-chunk-empty-choices": lambda r: (
        _chunks(r.content)[-1]["choices"] == [] and "usage" in _chunks(r.content)[-1]
    ),
    "content-filter-annotation-chunks": lambda r: (
        "prompt_filter_results" in _chunks(r.content)[0]
        and any("content_filter_offsets" in ch for c in _chunks(r.content) for ch in c["choices"])
    ),
    "sse-data-without-space": lambda r: r.content.startswith(b"data:{") and b"data: " not in r.content,
    "sse-comment-keepalives": lambda r: (
        r.content.startswith(b": OPENROUTER PROCESSING\n\n") and r.content.count(b": OPENROUTER PROCESSING\n\n") > 2
    ),
    "mid-stream-error-chunk": lambda r: (
        "error" in (_loads(_events(r.content)[-1]) or {})
        and _finishes(r.content) == ["error"]
        and b"[DONE]" not in r.content
    ),
    "nonstandard-sse-error-field": lambda r: r.content.startswith(b"error: {") and _events(r.content) == ["[DONE]"],
    "fused-truncated-sse-frames": lambda r: (
        any(_loads(e) is None and "data: {" in e for e in _events(r.content))
        and len({c["id"] for c in _chunks(r.content)}) == 2
    ),
    "undeclared-or-prefixed-tool-name": lambda r: any(
        n[0] not in DECLARED for n in _names_by_index(r.content).values()
    ),
    "pre-stream-tool-use-failed": lambda r: r.status_code == 400 and r.json()["error"]["code"] == "tool_use_failed",
}


def test_it_corrupts_generated_streams_with_the_signature_of_every_kind(
    sim: RunningSimulator, client: httpx.Client
) -> None:
    assert set(SIGNATURES) == set(FAULTS)
    body = _body("corrupt me", tools=ALL_TOOLS)
    clean = _chat(client, "gen:corrupt=0:seed=11:frames=3", body)
    assert _accumulate(clean.content)["calls"] and "x-sim-fault" not in clean.headers
    for kind, signature in SIGNATURES.items():
        response = _chat(client, f"gen:corrupt=1:kinds={kind}:seed=11:frames=3", body)
        assert response.headers["x-sim-fault"] == kind
        assert response.content != clean.content, kind
        assert signature(response), kind
        assert not signature(clean), kind
        assert sim.stats()["requests"][-1]["fault"] == kind


def test_it_draws_both_variants_of_the_undeclared_name_fault(client: httpx.Client) -> None:
    body = _body("variants", tools=ALL_TOOLS)
    kind = "undeclared-or-prefixed-tool-name"
    prefixed = _names_by_index(_chat(client, f"gen:corrupt=1:kinds={kind}/prefixed", body).content)
    invented = _names_by_index(_chat(client, f"gen:corrupt=1:kinds={kind}/invented", body).content)
    assert any(n[0].startswith("functions.") and n[0].removeprefix("functions.") in DECLARED for n in prefixed.values())
    assert any(n[0] not in DECLARED and not n[0].startswith("functions.") for n in invented.values())


def test_it_corrupts_non_stream_answers_with_turn_level_kinds(client: httpx.Client) -> None:
    body = _body("non stream", tools=ALL_TOOLS, stream=False)
    message = _chat(client, "gen:corrupt=1:kinds=arguments-as-json-object", body).json()["choices"][0]["message"]
    assert any(isinstance(c["function"]["arguments"], dict) for c in message["tool_calls"])
    # A stream-only kind cannot apply to a JSON answer: the answer stays clean.
    clean = _chat(client, "gen:corrupt=1:kinds=sse-data-without-space", body)
    assert "x-sim-fault" not in clean.headers and clean.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_it_corrupts_the_first_attempts_only_with_gen_broken(client: httpx.Client) -> None:
    body = _body("gen broken", tools=ALL_TOOLS)
    first = _chat(client, "gen:broken=1:kinds=mid-stream-error-chunk", body)
    assert first.headers["x-sim-fault"] == "mid-stream-error-chunk"
    second = _chat(client, "gen:broken=1:kinds=mid-stream-error-chunk", body)
    assert "x-sim-fault" not in second.headers and _accumulate(second.content)["finish"] == ["tool_calls"]


def test_it_applies_server_default_corruption_to_any_model_name() -> None:
    with (
        start_in_thread(corruption_rate=1.0, kinds="sse-comment-keepalives") as sim,
        httpx.Client(base_url=sim.url) as http,
    ):
        response = http.post("/chat/completions", json=_body("demo", model="deepseek-chat"))
        assert response.headers["x-sim-fault"] == "sse-comment-keepalives"
        assert sim.stats()["requests"][0]["mode"] == "gen"


# --- failure scenarios ---------------------------------------------------------------------------


def test_it_answers_http_failure_scenarios(client: httpx.Client) -> None:
    limited = _chat(client, "http:429:retry-after=2", _body("429"))
    assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert _chat(client, "http:500", _body("500")).json()["error"]["type"] == "server_error"
    assert _chat(client, "http:503", _body("503")).status_code == 503
    invalid = _chat(client, "http:400", _body("400"))
    assert invalid.status_code == 400 and invalid.json()["error"]["type"] == "invalid_request_error"

    body = _body("500 then clean", tools=ALL_TOOLS)
    assert _chat(client, "http:500:broken=1", body).status_code == 500
    recovered = _chat(client, "http:500:broken=1", body)
    assert recovered.status_code == 200 and _accumulate(recovered.content)["finish"] == ["tool_calls"]


def test_it_applies_a_failure_mode_to_a_gen_turn_with_its_options(client: httpx.Client) -> None:
    body = _body("gen then failure", tools=ALL_TOOLS)
    assert _chat(client, "gen:calls=1:http:503:broken=1", body).status_code == 503
    turn = _accumulate(_chat(client, "gen:calls=1:http:503:broken=1", body).content)
    assert len(turn["calls"]) == 1
    text_only = _accumulate(_chat(client, "gen:calls=0:frames=3", _body("calls zero", tools=ALL_TOOLS)).content)
    assert text_only["calls"] == [] and text_only["finish"] == ["stop"]


def test_it_stalls_before_the_first_byte(sim: RunningSimulator, client: httpx.Client) -> None:
    started = time.monotonic()
    response = _chat(client, "stall-first-byte=300", _body("stall first"))
    assert time.monotonic() - started >= 0.3
    assert _accumulate(response.content)["finish"] == ["stop"]
    record = _record(sim, "stall first")
    assert record["first_byte_monotonic"] - record["started_monotonic"] >= 0.3


def test_it_stalls_after_k_frames(client: httpx.Client) -> None:
    arrivals = []
    with _stream(client, "stall-after=2:ms=300", _body("stall after")) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic())
    assert arrivals[2] - arrivals[1] >= 0.28
    assert arrivals[1] - arrivals[0] < 0.2 and arrivals[-1] - arrivals[2] < 0.2


def test_it_drops_the_connection_after_k_frames(sim: RunningSimulator, client: httpx.Client) -> None:
    lines = []
    with pytest.raises(httpx.RemoteProtocolError):
        with _stream(client, "drop-after=3", _body("drop")) as response:
            for line in response.iter_lines():
                lines.append(line)
    assert len([x for x in lines if x.startswith("data: ")]) == 3 and "data: [DONE]" not in lines
    record = _record(sim, "drop")
    assert record["frames_sent"] == 3 and not record["completed"] and record["client_closed_at"] is None


def test_it_records_a_client_close_mid_slow_stream_within_half_a_second(
    sim: RunningSimulator, client: httpx.Client
) -> None:
    with _stream(client, "slow:100:frame=100", _body("walk away")) as response:
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen == 3:
                break
    closed = time.monotonic()
    deadline = closed + 2
    while (record := _record(sim, "walk away"))["client_closed_at"] is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert record["client_closed_at"] is not None and record["client_closed_at"] - closed < 0.5
    assert not record["completed"] and record["frames_sent"] < 10


# --- protocol details ----------------------------------------------------------------------------


def test_it_lists_models(client: httpx.Client) -> None:
    models = client.get("/models").json()
    assert models["object"] == "list"
    assert {"gen", "text:30", "case:C14"} <= {m["id"] for m in models["data"]}


def test_it_keeps_connections_alive(sim: RunningSimulator, client: httpx.Client) -> None:
    for number in range(3):
        assert _chat(client, "text:2", _body(f"keep alive {number}")).status_code == 200
    assert len({_record(sim, f"keep alive {n}")["connection"] for n in range(3)}) == 1


def test_it_requires_the_configured_key_and_records_only_its_digest() -> None:
    with (
        start_in_thread(require_key="sk-upstream-A", reject_stream_options=True) as sim,
        httpx.Client(base_url=sim.url) as http,
    ):
        assert http.post("/chat/completions", json=_body("no key")).status_code == 401
        wrong = http.post("/chat/completions", json=_body("wrong"), headers={"authorization": "Bearer sk-other"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        right = http.post("/chat/completions", json=_body("right"), headers={"authorization": "Bearer sk-upstream-A"})
        assert right.status_code == 200
        rejected = http.post(
            "/chat/completions",
            json=_body("options", stream_options={"include_usage": True}),
            headers={"authorization": "Bearer sk-upstream-A"},
        )
        assert rejected.status_code == 400 and rejected.json()["error"]["param"] == "stream_options"

        stats = sim.stats()
        record = _record(sim, "right")
        assert record["authorization_present"] and record["headers"]["authorization"] == "[redacted]"
        assert record["authorization_sha256"] == hashlib.sha256(b"sk-upstream-A").hexdigest()[:16]
        assert _record(sim, "no key")["authorization_sha256"] is None
        assert "sk-upstream-A" not in json.dumps(stats) and "sk-other" not in json.dumps(stats)


def test_it_answers_bad_scenarios_with_a_400(client: httpx.Client) -> None:
    bad = ("gen:bogus=1", "gen:oops", "case:C99", "gen:corrupt=1:kinds=no-such-kind", "http:200", "text:many")
    for scenario in (*bad, "gen:corrupt=1:http:500", "drop-after=x"):
        response = _chat(client, scenario, _body(f"bad {scenario}", tools=ALL_TOOLS))
        assert response.status_code == 400 and response.json()["error"]["code"] == "bad_scenario", scenario


def test_it_generates_schema_valid_arguments_for_varied_schemas() -> None:
    schemas = [
        SEARCH["function"]["parameters"],
        {
            "type": "object",
            "properties": {"n": {"type": ["integer", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 3}},
        },
        {
            "type": "object",
            "$defs": {"step": {"type": "object", "properties": {"op": {"const": "add"}}, "required": ["op"]}},
            "properties": {
                "steps": {"type": "array", "items": {"$ref": "#/$defs/step"}, "minItems": 2, "uniqueItems": False}
            },
            "required": ["steps"],
        },
        {
            "type": "object",
            "properties": {"x": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 4}]}},
            "required": ["x"],
        },
        {"allOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}]},
    ]
    for schema in schemas:
        for seed in range(25):
            jsonschema.validate(generate_arguments(schema, random.Random(seed)), schema)


def test_it_runs_as_a_management_command() -> None:
    command = [sys.executable, "manage.py", "simulate_upstream", "--port", "0", "--kinds", "sse-data-without-space"]
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:  # noqa: S603
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            url = re.search(r"listening on (http://\S+)", line)
            assert url, line
            with httpx.Client(base_url=url.group(1), timeout=10) as http:
                assert http.get("/models").status_code == 200
        finally:
            process.terminate()
            process.wait(timeout=10)


# --- agent loops end ----------------------------------------------------------------------------


def _history(tag: str, rounds: int) -> list[dict[str, Any]]:
    """A conversation with ``rounds`` answered tool rounds after the user's message ``tag``."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": tag}]
    for n in range(rounds):
        call = {"id": f"call_{n}", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{n}", "content": "file text"}]
    return messages


def test_it_ends_every_generated_conversation_with_text_after_one_or_two_tool_rounds(client: httpx.Client) -> None:
    """An agent loop on plain ``gen`` finishes: tool calls first, then after 1 or 2 answered rounds a
    text turn with finish ``stop`` (each conversation keeps its own limit)."""
    limits = set()
    for n in range(12):
        tag = f"agent loop {n}"
        bodies = [{**_body(tag, tools=ALL_TOOLS), "messages": _history(tag, r)} for r in range(3)]
        turns = [_accumulate(_chat(client, "gen", body).content) for body in bodies]
        assert turns[0]["calls"] and turns[0]["finish"] == ["tool_calls"]
        ended = next(r for r, turn in enumerate(turns) if not turn["calls"])
        assert ended in (1, 2) and turns[ended]["content"] and turns[ended]["finish"] == ["stop"]
        assert all(not turn["calls"] for turn in turns[ended:])
        limits.add(ended)
    assert limits == {1, 2}


def test_it_takes_the_round_limit_from_the_scenario_and_obeys_a_required_tool_choice(client: httpx.Client) -> None:
    """``rounds=N`` sets the limit; ``tool_choice: "required"`` (or a named tool) never gets a text answer."""
    tag = "rounds option"
    body = {**_body(tag, tools=ALL_TOOLS), "messages": _history(tag, 3)}
    assert _accumulate(_chat(client, "gen:rounds=4", body).content)["calls"]
    assert not _accumulate(_chat(client, "gen:rounds=3", body).content)["calls"]
    assert _accumulate(_chat(client, "gen:rounds=1", {**body, "tool_choice": "required"}).content)["calls"]
    assert not _accumulate(_chat(client, "gen:rounds=0", _body("rounds zero", tools=ALL_TOOLS)).content)["calls"]
