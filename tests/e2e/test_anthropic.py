"""Anthropic Messages through the running proxy: anthropic-python over real sockets, Daphne, the simulator.

The fault corpus (../shared/fault-cases) through ``messages.stream`` and ``messages.create``; a
multi-turn tool loop; error shapes; and the points of PROTOCOLS.md section 0 that concern Anthropic
clients: event names (2), blank-line framing (5), ping keep-alives (6), usage in ``message_delta``
(9), block-start payloads (10), contiguous block indexes (11), the ``error`` event (12),
``role: "system"`` inside ``messages`` (13), ``/v1/messages?beta=true`` (14) and
``x-should-retry: false`` on errors (15); no ``[DONE]`` in Anthropic streams (5.3).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.e2e.corpus import (
    MAX_RETRIES,
    cases_by_action,
    expected_calls,
    upstream_calls,
)
from tests.protocol_grammar import anthropic_content

WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json"}


def _tools(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The case's OpenAI ``tools`` as Anthropic tools."""
    tools = []
    for tool in case["request_tools"]:
        fn = tool["function"]
        tools.append({"name": fn["name"], "description": fn.get("description", ""),
                      "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}})
    return tools


def _messages(text: str = "What is the weather in Paris?") -> tuple[list[dict[str, Any]], str]:
    marker = uuid.uuid4().hex
    return [{"role": "user", "content": f"{text} [{marker}]"}], marker


def _tool_uses(message: Any) -> list[tuple[str, Any]]:
    return [(b.name, b.input) for b in message.content if b.type == "tool_use"]


def _text(message: Any) -> str | None:
    return "".join(b.text for b in message.content if b.type == "text") or None


def _client(proxy_server: Any, tenant: Any, **kwargs: Any) -> anthropic.Anthropic:
    """anthropic-python pointed at the proxy as Claude Code is: base URL without ``/v1`` (PROTOCOLS.md 4.1)."""
    return anthropic.Anthropic(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0, timeout=30,
                               **kwargs)


def _raw_events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each event of a raw SSE body, asserting the framing on the way."""
    body = response.text
    assert body.endswith("\n\n"), "every event ends with a blank line (PROTOCOLS.md section 0 item 5)"
    assert "[DONE]" not in body, "Anthropic streams never carry [DONE] (PROTOCOLS.md 5.3)"
    out = []
    for raw in body.split("\n\n")[:-1]:
        lines = raw.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ") and len(lines) == 2, raw
        data = json.loads(lines[1][6:])
        assert data["type"] == lines[0][7:], "the event name is the data's type (PROTOCOLS.md section 0 item 2)"
        out.append((lines[0][7:], data))
    return out


def _post(proxy_server: Any, tenant: Any, body: dict[str, Any], path: str = "/v1/messages",
          **headers: str) -> httpx.Response:
    return httpx.post(f"{proxy_server.url}{path}", json=body, timeout=30,
                      headers={**HEADERS, "x-api-key": tenant.api_key, **headers})


# -- the corpus -------------------------------------------------------------------------------------


def _stop_reason(case: dict[str, Any]) -> str:
    """Anthropic's stop reason for the case's expected turn: ``tool_use`` with calls, else ``end_turn`` (the
    field corpus has text-only turns, e.g. D136, D141)."""
    return "tool_use" if expected_calls(case) else "end_turn"


@pytest.mark.parametrize("case", cases_by_action("emit", "emit_after_repair"))
def test_it_delivers_recoverable_cases_through_messages_stream(case: dict[str, Any], make_tenant: Any,
                                                               proxy_server: Any, simulator: Any, audit_rows: Any,
                                                               django_db_blocker: Any,
        assert_case_audited: Any) -> None:
    tenant = make_tenant()
    messages, marker = _messages()
    with _client(proxy_server, tenant) as client, client.messages.stream(
            model=f"case:{case['id']}", max_tokens=1024, messages=messages, tools=_tools(case)) as stream:
        message = stream.get_final_message()
        request_id = stream.response.headers["x-request-id"]
    assert _tool_uses(message) == expected_calls(case)
    assert _text(message) == case["expected"]["content"]
    assert message.stop_reason == _stop_reason(case)
    assert message.usage.output_tokens >= 0
    assert len(upstream_calls(simulator, marker)) == 1
    row = audit_rows(request_id)
    assert row.client_protocol == "anthropic-messages"
    assert row.outcome in ("clean", "normalized", "repaired")
    assert_case_audited(case, request_id)


@pytest.mark.parametrize("case", cases_by_action("emit", "emit_after_repair"))
def test_it_delivers_recoverable_cases_as_canonical_events_to_messages_create(case: dict[str, Any],
                                                                               make_tenant: Any,
                                                                               proxy_server: Any) -> None:
    """``messages.create(stream=True)`` yields the raw events: block order, indexes and payloads are
    checked one by one (PROTOCOLS.md section 0 items 9-11)."""
    tenant = make_tenant()
    messages, _ = _messages()
    with _client(proxy_server, tenant) as client:
        events = list(client.messages.create(model=f"case:{case['id']}", max_tokens=1024, messages=messages,
                                             tools=_tools(case), stream=True))
    assert events[0].type == "message_start" and events[0].message.usage is not None
    assert [e.type for e in events[-2:]] == ["message_delta", "message_stop"]
    starts = [e for e in events if e.type == "content_block_start"]
    assert [e.index for e in starts] == list(range(len(starts)))
    calls: dict[int, tuple[str, str]] = {}
    for event in events:
        if event.type == "content_block_start" and event.content_block.type == "tool_use":
            assert event.content_block.input == {}
            calls[event.index] = (event.content_block.name, "")
        elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            name, partial = calls[event.index]
            calls[event.index] = (name, partial + event.delta.partial_json)
    assert [(name, json.loads(arguments)) for name, arguments in calls.values()] == expected_calls(case)
    assert events[-2].delta.stop_reason == _stop_reason(case) and events[-2].usage.output_tokens >= 0
    content, _ = anthropic_content([(e.type, e.to_dict()) for e in events])  # the grammar of PROTOCOLS.md 2.3
    assert [(b["name"], b["input"]) for b in content if b["type"] == "tool_use"] == expected_calls(case)


@pytest.mark.parametrize("case", cases_by_action("retry"))
def test_it_recovers_retry_cases_after_a_broken_attempt(case: dict[str, Any], make_tenant: Any, proxy_server: Any,
                                                        simulator: Any, audit_rows: Any) -> None:
    tenant = make_tenant()
    messages, marker = _messages()
    with _client(proxy_server, tenant) as client, client.messages.stream(
            model=f"case:{case['id']}:broken=1", max_tokens=1024, messages=messages, tools=_tools(case)) as stream:
        message = stream.get_final_message()
        request_id = stream.response.headers["x-request-id"]
    uses = _tool_uses(message)
    assert uses, "the clean attempt's tool_use reaches the client"
    assert all(isinstance(arguments, dict) for _, arguments in uses)
    assert message.stop_reason == "tool_use"
    assert len(upstream_calls(simulator, marker)) == 2
    row = audit_rows(request_id)
    assert (row.outcome, row.attempts, row.client_protocol) == ("recovered-by-retry", 2, "anthropic-messages")


@pytest.mark.parametrize("case", cases_by_action("retry"))
def test_it_recovers_retry_cases_in_a_non_stream_message(case: dict[str, Any], make_tenant: Any,
                                                         proxy_server: Any, simulator: Any) -> None:
    tenant = make_tenant()
    messages, marker = _messages()
    with _client(proxy_server, tenant) as client:
        message = client.messages.create(model=f"case:{case['id']}:broken=1", max_tokens=1024, messages=messages,
                                         tools=_tools(case))
    assert _tool_uses(message) and message.stop_reason == "tool_use"
    assert len(upstream_calls(simulator, marker)) == 2


@pytest.mark.parametrize("case", cases_by_action("retry"))
def test_it_ends_an_always_broken_turn_with_the_terminal_error(case: dict[str, Any], make_tenant: Any,
                                                               proxy_server: Any, simulator: Any,
                                                               audit_rows: Any) -> None:
    """The default exhaustion policy ``fail``: after a content block, ``event: error`` of type
    ``invalid_request_error`` (anthropic-python raises; Claude Code shows it once, does not retry, and
    ``claude -p`` exits 1), no ``message_stop`` and no tool_use block."""
    tenant = make_tenant()
    messages, marker = _messages()
    raw = httpx.post(f"{proxy_server.url}/v1/messages", timeout=30,
                     headers={"x-api-key": tenant.api_key, "anthropic-version": "2023-06-01"},
                     json={"model": f"case:{case['id']}", "max_tokens": 1024, "messages": messages,
                           "tools": _tools(case), "stream": True})
    request_id = raw.headers["x-request-id"]
    events = [line[7:] for line in raw.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and "content_block_start" in events and events[-1] == "error"
    assert "message_stop" not in events and '"tool_use"' not in raw.text
    error = json.loads(raw.text.rstrip().splitlines()[-1][6:])["error"]
    assert error["type"] == "invalid_request_error"
    assert "[toolrelay]" in error["message"] and request_id in error["message"]
    assert len(upstream_calls(simulator, marker)) == 1 + MAX_RETRIES
    assert audit_rows(request_id).outcome == "exhausted"
    with _client(proxy_server, tenant) as client, pytest.raises(anthropic.APIError) as caught, \
            client.messages.stream(model=f"case:{case['id']}", max_tokens=1024, messages=_messages()[0],
                                   tools=_tools(case)) as stream:
        stream.get_final_message()
    assert "[toolrelay]" in str(caught.value)


@pytest.mark.parametrize("case", cases_by_action("retry")[:2])
def test_it_answers_exhaustion_with_an_end_turn_message_when_the_policy_says_so(
        case: dict[str, Any], make_tenant: Any, proxy_server: Any, simulator: Any, audit_rows: Any) -> None:
    tenant = make_tenant(exhaustion="message")
    messages, marker = _messages()
    with _client(proxy_server, tenant) as client, client.messages.stream(
            model=f"case:{case['id']}", max_tokens=1024, messages=messages, tools=_tools(case)) as stream:
        message = stream.get_final_message()
        request_id = stream.response.headers["x-request-id"]
    assert not _tool_uses(message)
    assert message.stop_reason == "end_turn"
    text = _text(message) or ""
    assert "[toolrelay]" in text and request_id in text
    assert len(upstream_calls(simulator, marker)) == 1 + MAX_RETRIES
    assert audit_rows(request_id).outcome == "exhausted"


@pytest.mark.parametrize("case", cases_by_action("error_to_client"))
def test_it_passes_non_retryable_errors_in_anthropic_shape(case: dict[str, Any], make_tenant: Any,
                                                           proxy_server: Any, simulator: Any) -> None:
    tenant = make_tenant()
    messages, marker = _messages()
    with pytest.raises(anthropic.APIStatusError) as caught:
        with _client(proxy_server, tenant) as client, client.messages.stream(
            model=f"case:{case['id']}", max_tokens=1024, messages=messages, tools=_tools(case)) as stream:
            stream.get_final_message()
    error = caught.value
    assert 400 <= error.status_code < 500
    assert error.body["type"] == "error" and error.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert error.response.headers["x-should-retry"] == "false"
    assert len(upstream_calls(simulator, marker)) == 1


# -- the agent loop and the request translation -----------------------------------------------------


def test_it_runs_a_multi_turn_tool_loop(make_tenant: Any, proxy_server: Any, simulator: Any) -> None:
    """tool_use -> tool_result -> answer; thinking and ids round-trip (PROTOCOLS.md 2.8, 4.3)."""
    tenant = make_tenant()
    messages, marker = _messages()
    with _client(proxy_server, tenant) as client:
        first = client.messages.create(model="gen:calls=1:reasoning=1", max_tokens=1024, messages=messages,
                                       tools=[WEATHER])
    assert [b.type for b in first.content][0] == "thinking" and first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input["city"], str)
    messages += [{"role": "assistant", "content": [b.to_dict() for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}]}]
    with _client(proxy_server, tenant) as client, client.messages.stream(
            model="gen:calls=0", max_tokens=1024, messages=messages, tools=[WEATHER]) as stream:
        second = stream.get_final_message()
    assert second.stop_reason == "end_turn" and _text(second)
    upstream = upstream_calls(simulator, marker)[-1]["body"]["messages"]
    assert [m["role"] for m in upstream] == ["user", "assistant", "tool"]
    assert upstream[1]["tool_calls"][0]["id"] == use.id and upstream[2]["tool_call_id"] == use.id
    assert upstream[1]["reasoning_content"] == first.content[0].thinking  # type: ignore[union-attr]


def test_it_maps_system_blocks_and_mid_conversation_system_messages(make_tenant: Any, proxy_server: Any,
                                                                    simulator: Any) -> None:
    """Claude Code's request: billing header block, ``role: "system"`` inside ``messages`` (section 0
    item 13), ``?beta=true`` (item 14), Bearer auth (``ANTHROPIC_AUTH_TOKEN``), betas accepted."""
    tenant = make_tenant()
    messages, marker = _messages()
    body = {"model": "gen:calls=0", "max_tokens": 32000, "stream": True,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332;"},
                       {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
            "messages": [*messages, {"role": "system", "content": "mid-conversation context"}],
            "thinking": {"type": "adaptive", "display": "updates"}, "metadata": {"user_id": "{}"},
            "context_management": {"edits": []}, "tools": [WEATHER, {"name": "DeferredToolPlaceholder",
                                                                     "input_schema": {"type": "object"},
                                                                     "defer_loading": True}],
            "tool_choice": {"type": "none"}}
    response = httpx.post(f"{proxy_server.url}/v1/messages?beta=true", json=body, timeout=30,
                          headers={**HEADERS, "authorization": f"Bearer {tenant.api_key}",
                                   "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _raw_events(response)
    assert events[-1][0] == "message_stop"
    upstream = upstream_calls(simulator, marker)[0]["body"]
    assert upstream["messages"][0] == {"role": "system", "content": "You are Claude Code."}
    assert upstream["messages"][2] == {"role": "system", "content": "mid-conversation context"}
    assert [t["function"]["name"] for t in upstream["tools"]] == ["get_weather"]
    assert upstream["stream_options"] == {"include_usage": True}


def test_it_streams_tool_less_text_live_through_the_guard(make_tenant: Any, proxy_server: Any,
                                                          audit_rows: Any) -> None:
    """No pass-through for Anthropic clients: the guarded path translates and streams text live."""
    tenant = make_tenant()
    messages, _ = _messages("Tell me a story.")
    started = time.monotonic()
    first_text = None
    with _client(proxy_server, tenant) as client, client.messages.stream(
            model="gen:calls=0:frames=15:frame=100", max_tokens=1024, messages=messages) as stream:
        for event in stream:
            if first_text is None and event.type == "text":
                first_text = time.monotonic() - started
        message = stream.get_final_message()
        request_id = stream.response.headers["x-request-id"]
    total = time.monotonic() - started
    assert first_text is not None and first_text < total - 1.0
    assert message.stop_reason == "end_turn" and _text(message)
    row = audit_rows(request_id)
    assert (row.path, row.client_protocol) == ("guarded", "anthropic-messages")


def test_it_sends_canonical_events_for_text_and_tool_use(make_tenant: Any, proxy_server: Any) -> None:
    """PROTOCOLS.md section 0 items 2, 5, 9, 10, 11 and 5.3, on the bytes."""
    tenant = make_tenant()
    messages, _ = _messages()
    response = _post(proxy_server, tenant, {"model": "gen:calls=2:reasoning=1", "max_tokens": 1024,
                                            "stream": True, "messages": messages, "tools": [WEATHER]})
    events = _raw_events(response)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert {"input_tokens", "output_tokens"} <= set(events[0][1]["message"]["usage"])
    starts = [data for name, data in events if name == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2, 3]
    assert starts[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert starts[1]["content_block"] == {"type": "text", "text": ""}
    assert starts[2]["content_block"]["input"] == {} and starts[2]["content_block"]["type"] == "tool_use"
    thinking = [d["delta"]["type"] for n, d in events if n == "content_block_delta" and d["index"] == 0]
    assert thinking[-1] == "signature_delta" and set(thinking[:-1]) == {"thinking_delta"}
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use" and isinstance(delta["usage"]["output_tokens"], int)


def test_it_sends_ping_events_while_holding_a_tool_call(make_tenant: Any, proxy_server: Any) -> None:
    """The commit deadline passes while the upstream is silent: message_start, then ``event: ping``
    with ``data: {"type":"ping"}`` (PROTOCOLS.md section 0 item 6)."""
    tenant = make_tenant()
    messages, _ = _messages()
    response = _post(proxy_server, tenant, {"model": "gen:calls=1:text=0:ttft=6000", "max_tokens": 1024,
                                            "stream": True, "messages": messages, "tools": [WEATHER]})
    names = [name for name, _ in _raw_events(response)]
    assert names[:2] == ["message_start", "ping"]
    assert "event: ping\ndata: {\"type\":\"ping\"}\n\n" in response.text
    assert names[-1] == "message_stop"


def test_it_ends_a_committed_stream_with_an_error_event_under_the_error_policy(make_tenant: Any,
                                                                                proxy_server: Any) -> None:
    """PROTOCOLS.md section 0 item 12: text already streamed, every attempt broken, policy ``error``."""
    tenant = make_tenant(exhaustion="error")
    messages, _ = _messages()
    with pytest.raises(anthropic.APIStatusError) as caught:
        with _client(proxy_server, tenant) as client, client.messages.stream(
                model="gen:calls=1:corrupt=1:kinds=mid-stream-error-chunk", max_tokens=1024, messages=messages,
                tools=[WEATHER]) as stream:
            stream.get_final_message()
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    response = _post(proxy_server, tenant, {"model": "gen:calls=1:corrupt=1:kinds=mid-stream-error-chunk",
                                            "max_tokens": 1024, "stream": True, "messages": messages,
                                            "tools": [WEATHER]})
    events = _raw_events(response)
    assert events[-1][0] == "error" and events[-1][1]["error"]["message"]
    assert "message_stop" not in [name for name, _ in events]


def test_it_counts_tokens(make_tenant: Any, proxy_server: Any) -> None:
    tenant = make_tenant()
    with _client(proxy_server, tenant) as client:
        small = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
        large = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "word " * 400}],
                                             tools=[WEATHER])
    assert 0 < small.input_tokens < large.input_tokens
    assert 400 <= large.input_tokens <= 1000


def test_count_tokens_is_within_five_percent_of_the_families_tokenizer(make_tenant: Any, proxy_server: Any) -> None:
    """Held-out text (tests/fixtures/token_counts.json: each family's own count), the English one and
    the three the estimate is furthest off on (Russian, traditional Chinese, JSON), through the endpoint
    under a model of each family with a tokenizer here, plus the 7 tokens of template framing added."""
    fixture = json.loads((Path(__file__).parents[1] / "fixtures/token_counts.json").read_text(encoding="utf-8"))
    cases = [c for c in fixture["texts"]
             if c["name"] in ("english-readme", "russian", "chinese-traditional", "json-corpus")]
    tenant = make_tenant()
    with _client(proxy_server, tenant) as client:
        for model, family in (("deepseek-v4-flash", "deepseek"), ("qwen2.5-72b-instruct", "qwen2"),
                              ("qwen3.6-27b", "qwen3"), ("gpt-4-turbo", "cl100k")):
            for case in cases:
                got = client.messages.count_tokens(model=model, messages=[{"role": "user", "content": case["text"]}])
                real = case["counts"][family] + 7
                assert abs(got.input_tokens - real) <= 0.05 * real, (model, case["name"], got.input_tokens, real)


def test_it_lists_models_in_anthropic_format(make_tenant: Any, proxy_server: Any) -> None:
    """Claude Code's gateway model discovery (PROTOCOLS.md 4.1)."""
    tenant = make_tenant()
    with _client(proxy_server, tenant) as client:
        page = client.models.list()
    assert page.has_more is False
    assert all(m.type == "model" for m in page.data)


# -- errors -----------------------------------------------------------------------------------------


def _assert_anthropic_error(response: httpx.Response, status: int, kind: str, *,
                            should_retry: str = "false") -> dict[str, Any]:
    assert response.status_code == status
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind
    assert response.headers["x-should-retry"] == should_retry
    assert response.headers["x-request-id"] in body["error"]["message"]
    return body


def test_it_refuses_a_bad_key_in_anthropic_shape(proxy_server: Any) -> None:
    with anthropic.Anthropic(base_url=proxy_server.url, api_key="tr-wrong", max_retries=0) as client, \
            pytest.raises(anthropic.AuthenticationError) as caught:
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    _assert_anthropic_error(caught.value.response, 401, "authentication_error")  # type: ignore[arg-type]
    with anthropic.Anthropic(base_url=proxy_server.url, auth_token="tr-wrong", max_retries=0) as bearer, \
            pytest.raises(anthropic.AuthenticationError):
        bearer.messages.count_tokens(model="m", messages=[{"role": "user", "content": "x"}])


def test_it_refuses_an_unrouted_model_in_anthropic_shape(make_tenant: Any, proxy_server: Any,
                                                         django_db_blocker: Any) -> None:
    tenant = make_tenant()
    with django_db_blocker.unblock():
        tenant.tenant.default_upstream = None
        tenant.tenant.save()
    time.sleep(1.2)  # the key cache (AUTH_CACHE_SECONDS=1)
    with _client(proxy_server, tenant) as client, pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="nowhere", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    body = _assert_anthropic_error(caught.value.response, 404, "not_found_error")  # type: ignore[arg-type]
    assert "nowhere" in body["error"]["message"]


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 10, "messages": "x"}, "messages"),
    ({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}, "model"),
])
def test_it_refuses_malformed_requests_in_anthropic_shape(body: dict[str, Any], param: str, make_tenant: Any,
                                                          proxy_server: Any) -> None:
    tenant = make_tenant()
    response = _post(proxy_server, tenant, body)
    error = _assert_anthropic_error(response, 400, "invalid_request_error")
    assert param in error["error"]["message"]
    not_json = httpx.post(f"{proxy_server.url}/v1/messages", content=b"{nope", timeout=30,
                          headers={**HEADERS, "x-api-key": tenant.api_key})
    _assert_anthropic_error(not_json, 400, "invalid_request_error")


@pytest.mark.parametrize(("scenario", "status", "kind", "should_retry"), [
    ("http:500", 502, "api_error", "true"),  # an upstream that keeps failing: worth retrying later
    ("http:429:retry-after=0.1", 429, "rate_limit_error", "true"),
    ("http:400", 400, "invalid_request_error", "false"),  # the request itself is wrong
])
def test_it_reports_upstream_failures_in_anthropic_shape(scenario: str, status: int, kind: str, should_retry: str,
                                                         make_tenant: Any, proxy_server: Any,
                                                         audit_rows: Any) -> None:
    tenant = make_tenant()
    messages, _ = _messages()
    response = _post(proxy_server, tenant, {"model": f"gen:calls=1:{scenario}", "max_tokens": 100,
                                            "stream": True, "messages": messages, "tools": [WEATHER]})
    _assert_anthropic_error(response, status, kind, should_retry=should_retry)
    assert audit_rows(response.headers["x-request-id"]).client_protocol == "anthropic-messages"
