"""OpenAI Responses through the running proxy: openai-python over real sockets, Daphne, the simulator.

The fault corpus (../shared/fault-cases) through ``responses.stream`` and ``responses.create``; a
multi-turn tool loop; Codex's request shape and namespace tools; error shapes; and the points of
PROTOCOLS.md section 0 that concern Responses clients: dispatch on ``data.type`` with harmless
``event:`` lines, ``response.output_item.done`` with the full item, ``response.completed`` with
``id`` (3), blank-line framing (5), comment keep-alives (6), and ``x-should-retry: false`` on errors.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.corpus import (
    MAX_RETRIES,
    cases_by_action,
    expected_calls,
    upstream_calls,
)
from tests.protocol_grammar import responses_output

EXEC = {"type": "function", "name": "exec_command", "description": "Run a command", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
MULTI_AGENT = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents", "tools": [
    {"type": "function", "name": "spawn_agent", "description": "Spawn", "strict": False,
     "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}]}


def _tools(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The case's OpenAI Chat ``tools`` as Responses function tools (flat, PROTOCOLS.md 3.3)."""
    return [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description", ""),
             "parameters": t["function"].get("parameters") or {"type": "object", "properties": {}}, "strict": False}
            for t in case["request_tools"]]


def _input(text: str = "What is the weather in Paris?") -> tuple[list[dict[str, Any]], str]:
    marker = uuid.uuid4().hex
    return [{"role": "user", "content": f"{text} [{marker}]"}], marker


def _calls(response: Any) -> list[tuple[str, Any]]:
    return [(i.name, json.loads(i.arguments)) for i in response.output if i.type == "function_call"]


def _client(tenant: Any) -> openai.OpenAI:
    """openai-python pointed at the proxy as Codex is: base URL ending in ``/v1`` (PROTOCOLS.md 3.2)."""
    return openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30)


def _stream(tenant: Any, **kwargs: Any) -> tuple[Any, str]:
    """The final Response of ``responses.stream(**kwargs)`` and the request id."""
    with _client(tenant) as client, client.responses.stream(**kwargs) as stream:
        for _ in stream:
            pass
        return stream.get_final_response(), stream._response.headers["x-request-id"]


def _post(tenant: Any, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{tenant.base_url}/responses", json=body, timeout=30,
                      headers={"authorization": f"Bearer {tenant.api_key}", **headers})


def _raw_events(response: httpx.Response) -> list[dict[str, Any]]:
    """The data of each event of a raw SSE body (comments skipped), asserting the framing on the way."""
    assert response.text.endswith("\n\n"), "every event ends with a blank line (PROTOCOLS.md section 0 item 5)"
    out = []
    for raw in response.text.split("\n\n")[:-1]:
        lines = [line for line in raw.split("\n") if not line.startswith(":")]
        if not lines:
            continue
        name, data = lines[0], lines[1]
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        out.append(event)
    return out


# -- the corpus -------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", cases_by_action("emit", "emit_after_repair"))
def test_it_delivers_recoverable_cases_through_responses_stream(case: dict[str, Any], make_tenant: Any,
                                                                simulator: Any, audit_rows: Any,
                                                                django_db_blocker: Any,
        assert_case_audited: Any) -> None:
    tenant = make_tenant()
    items, marker = _input()
    response, request_id = _stream(tenant, model=f"case:{case['id']}", input=items, tools=_tools(case))
    assert _calls(response) == expected_calls(case)
    assert (response.output_text or None) == case["expected"]["content"]
    assert response.status == "completed" and response.id.startswith("resp_")
    assert len(upstream_calls(simulator, marker)) == 1
    row = audit_rows(request_id)
    assert row.client_protocol == "openai-responses"
    assert row.outcome in ("clean", "normalized", "repaired")
    assert_case_audited(case, request_id)


@pytest.mark.parametrize("case", cases_by_action("emit", "emit_after_repair"))
def test_it_delivers_recoverable_cases_as_events_to_responses_create(case: dict[str, Any],
                                                                     make_tenant: Any) -> None:
    """``responses.create(stream=True)`` yields the raw events: sequence numbers, full items in
    ``output_item.done``, ``response.completed`` with id, output and usage (PROTOCOLS.md section 0 item 3)."""
    tenant = make_tenant()
    items, _ = _input()
    with _client(tenant) as client:
        events = list(client.responses.create(model=f"case:{case['id']}", input=items, tools=_tools(case),
                                              stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    arguments: dict[str, str] = {}
    for event in events:
        if event.type == "response.function_call_arguments.delta":
            arguments[event.item_id] = arguments.get(event.item_id, "") + event.delta
    done = [e.item for e in events if e.type == "response.output_item.done"]
    calls = [item for item in done if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == expected_calls(case)
    assert all(arguments[c.id] == c.arguments and c.status == "completed" for c in calls)  # type: ignore[index]
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.id == events[0].response.id  # type: ignore[union-attr]
    assert [i.id for i in completed.response.output] == [i.id for i in done]  # type: ignore[union-attr]
    usage = completed.response.usage  # type: ignore[union-attr]
    assert usage is not None and usage.total_tokens == usage.input_tokens + usage.output_tokens
    responses_output([e.to_dict() for e in events])  # the grammar of PROTOCOLS.md 3.4


@pytest.mark.parametrize("case", cases_by_action("retry"))
def test_it_recovers_retry_cases_after_a_broken_attempt(case: dict[str, Any], make_tenant: Any, simulator: Any,
                                                        audit_rows: Any) -> None:
    tenant = make_tenant()
    items, marker = _input()
    response, request_id = _stream(tenant, model=f"case:{case['id']}:broken=1", input=items, tools=_tools(case))
    calls = _calls(response)
    assert calls and all(isinstance(arguments, dict) for _, arguments in calls)
    assert len(upstream_calls(simulator, marker)) == 2
    row = audit_rows(request_id)
    assert (row.outcome, row.attempts, row.client_protocol) == ("recovered-by-retry", 2, "openai-responses")


@pytest.mark.parametrize("case", cases_by_action("retry"))
def test_it_recovers_retry_cases_in_a_non_stream_response(case: dict[str, Any], make_tenant: Any,
                                                          simulator: Any) -> None:
    tenant = make_tenant()
    items, marker = _input()
    with _client(tenant) as client:
        response = client.responses.create(model=f"case:{case['id']}:broken=1", input=items, tools=_tools(case))
    assert _calls(response) and response.status == "completed"
    assert len(upstream_calls(simulator, marker)) == 2


@pytest.mark.parametrize("case", cases_by_action("retry"))
def test_it_ends_an_always_broken_turn_with_response_failed(case: dict[str, Any], make_tenant: Any,
                                                            simulator: Any, audit_rows: Any) -> None:
    """The default exhaustion policy ``fail``: ``response.failed`` with code ``invalid_prompt`` and
    toolrelay's message (Codex shows it, does not reconnect, and ``codex exec`` exits 1), no call item."""
    tenant = make_tenant()
    items, marker = _input()
    with _client(tenant) as client, client.responses.stream(model=f"case:{case['id']}", input=items,
                                                           tools=_tools(case)) as stream:
        events = list(stream)
        request_id = stream._response.headers["x-request-id"]
    assert events[-1].type == "response.failed"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error is not None and failed.error.code == "invalid_prompt"
    assert "[toolrelay]" in failed.error.message and request_id in failed.error.message
    assert not [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(upstream_calls(simulator, marker)) == 1 + MAX_RETRIES
    assert audit_rows(request_id).outcome == "exhausted"


@pytest.mark.parametrize("case", cases_by_action("retry")[:2])
def test_it_answers_exhaustion_with_a_completed_message_when_the_policy_says_so(
        case: dict[str, Any], make_tenant: Any, simulator: Any, audit_rows: Any) -> None:
    tenant = make_tenant(exhaustion="message")
    items, marker = _input()
    response, request_id = _stream(tenant, model=f"case:{case['id']}", input=items, tools=_tools(case))
    assert not _calls(response)
    assert response.status == "completed"
    assert "[toolrelay]" in response.output_text and request_id in response.output_text
    assert len(upstream_calls(simulator, marker)) == 1 + MAX_RETRIES
    assert audit_rows(request_id).outcome == "exhausted"


@pytest.mark.parametrize("case", cases_by_action("error_to_client"))
def test_it_passes_non_retryable_errors_in_openai_shape(case: dict[str, Any], make_tenant: Any,
                                                        simulator: Any) -> None:
    """A streamed context overflow reaches a Responses client as ``response.failed`` with the code
    ``context_length_exceeded``: the only place Codex reads it (codex-rs/codex-api/src/sse/responses.rs)."""
    tenant = make_tenant()
    items, marker = _input()
    with _client(tenant) as client, client.responses.create(model=f"case:{case['id']}", input=items,
                                                            tools=_tools(case), stream=True) as events:
        kinds = [(e.type, e) for e in events]
    assert kinds[-1][0] == "response.failed"
    failed = kinds[-1][1].response  # type: ignore[union-attr]
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "context_length_exceeded"
    assert len(upstream_calls(simulator, marker)) == 1


# -- the agent loop and the request translation -----------------------------------------------------


def test_it_runs_a_multi_turn_tool_loop(make_tenant: Any, simulator: Any) -> None:
    """function_call -> function_call_output -> answer, with the whole history re-sent (``store: false``)."""
    tenant = make_tenant()
    items, marker = _input()
    with _client(tenant) as client:
        first = client.responses.create(model="gen:calls=1:reasoning=1", input=items, tools=[EXEC], store=False)
        assert [i.type for i in first.output][0] == "reasoning"
        [call] = [i for i in first.output if i.type == "function_call"]
        assert call.name == "exec_command" and isinstance(json.loads(call.arguments)["cmd"], str)
        history = [*items, *[i.model_dump(exclude_none=True) for i in first.output],
                   {"type": "function_call_output", "call_id": call.call_id, "output": "file.txt"}]
        with client.responses.stream(model="gen:calls=0", input=history, tools=[EXEC], store=False) as stream:
            second = stream.get_final_response()
    assert second.output_text and not _calls(second)
    upstream = upstream_calls(simulator, marker)[-1]["body"]["messages"]
    assert [m["role"] for m in upstream] == ["user", "assistant", "tool"]
    assert upstream[1]["tool_calls"][0]["id"] == call.call_id and upstream[2]["tool_call_id"] == call.call_id
    reasoning = first.output[0].content[0].text  # type: ignore[union-attr,index]
    assert upstream[1]["reasoning_content"] == reasoning


def test_it_flattens_namespace_tools_and_restores_the_namespace_on_the_call(make_tenant: Any,
                                                                            simulator: Any) -> None:
    tenant = make_tenant()
    items, marker = _input("Spawn a helper.")
    response, _ = _stream(tenant, model="gen:calls=1", input=items, tools=[MULTI_AGENT])
    [call] = [i for i in response.output if i.type == "function_call"]
    assert (call.name, call.namespace) == ("spawn_agent", "multi_agent_v1")
    upstream = upstream_calls(simulator, marker)[0]["body"]
    assert [t["function"]["name"] for t in upstream["tools"]] == ["multi_agent_v1__spawn_agent"]


def test_it_accepts_codexs_request(make_tenant: Any, simulator: Any, audit_rows: Any, django_db_blocker: Any) -> None:
    """The body Codex CLI 0.171.0 sends (PROTOCOLS.md 3.3): developer message, hosted tool, transport fields."""
    tenant = make_tenant()
    marker = uuid.uuid4().hex
    body = {"model": "gen:calls=1", "stream": True, "store": False, "tool_choice": "auto",
            "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "k", "client_metadata": {"x": "y"},
            "input": [{"type": "message", "role": "developer",
                       "content": [{"type": "input_text", "text": "You are Codex."}]},
                      {"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": f"ls [{marker}]"}]}],
            "tools": [EXEC, MULTI_AGENT, {"type": "web_search", "external_web_access": False}]}
    response = _post(tenant, body, accept="text/event-stream", originator="codex_exec")
    assert response.status_code == 200
    events = _raw_events(response)
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["id"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done and done[-1]["type"] == "function_call" and done[-1]["arguments"]
    upstream = upstream_calls(simulator, marker)[0]["body"]
    assert upstream["messages"][0] == {"role": "system", "content": "You are Codex."}
    assert [t["function"]["name"] for t in upstream["tools"]] == ["exec_command", "multi_agent_v1__spawn_agent"]
    assert "store" not in upstream and "include" not in upstream
    audit_rows(response.headers["x-request-id"])
    from audit.models import Finding

    with django_db_blocker.unblock():
        notes = list(Finding.objects.filter(request_id=response.headers["x-request-id"], attempt=None)
                     .values_list("kind", "detail"))
    assert ("request-field-not-forwarded", "not forwarded upstream: tools[2] (web_search)") in notes, notes


def test_it_streams_tool_less_text_live_through_the_guard(make_tenant: Any, audit_rows: Any) -> None:
    tenant = make_tenant()
    items, _ = _input("Tell me a story.")
    started = time.monotonic()
    first_text = None
    with _client(tenant) as client, client.responses.stream(model="gen:calls=0:frames=15:frame=100",
                                                            input=items) as stream:
        for event in stream:
            if first_text is None and event.type == "response.output_text.delta":
                first_text = time.monotonic() - started
        response = stream.get_final_response()
        request_id = stream._response.headers["x-request-id"]
    total = time.monotonic() - started
    assert first_text is not None and first_text < total - 1.0
    assert response.output_text
    row = audit_rows(request_id)
    assert (row.path, row.client_protocol) == ("guarded", "openai-responses")


def test_it_sends_comment_keepalives_while_holding_a_function_call(make_tenant: Any) -> None:
    """PROTOCOLS.md section 0 item 6: SSE comments, never an event without data."""
    tenant = make_tenant()
    items, _ = _input()
    response = _post(tenant, {"model": "gen:calls=1:text=0:ttft=6000", "stream": True, "input": items,
                              "tools": [EXEC]})
    head = response.text.split("event: response.output_item.added", 1)[0]
    assert "\n: keepalive\n\n" in head
    assert _raw_events(response)[-1]["type"] == "response.completed"


def test_it_ends_a_committed_stream_with_response_failed_under_the_error_policy(make_tenant: Any) -> None:
    tenant = make_tenant(exhaustion="error")
    items, _ = _input()
    response = _post(tenant, {"model": "gen:calls=1:corrupt=1:kinds=mid-stream-error-chunk", "stream": True,
                              "input": items, "tools": [EXEC]})
    events = _raw_events(response)
    failed = events[-1]
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] and failed["response"]["error"]["message"]
    assert not any(e["type"] == "response.completed" for e in events)


# -- errors -----------------------------------------------------------------------------------------


def _assert_openai_error(response: Any, status: int, *, should_retry: str = "false") -> dict[str, Any]:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert response.headers["x-should-retry"] == should_retry
    assert response.headers["x-request-id"] in error["message"]
    return dict(error)


def test_it_refuses_a_bad_key_in_openai_shape(proxy_server: Any) -> None:
    with openai.OpenAI(base_url=proxy_server.v1, api_key="tr-wrong", max_retries=0) as client, \
            pytest.raises(openai.AuthenticationError) as caught:
        client.responses.create(model="m", input="x")
    assert _assert_openai_error(caught.value.response, 401)["type"] == "authentication_error"


def test_it_refuses_an_unrouted_model_in_openai_shape(make_tenant: Any, django_db_blocker: Any) -> None:
    tenant = make_tenant()
    with django_db_blocker.unblock():
        tenant.tenant.default_upstream = None
        tenant.tenant.save()
    time.sleep(1.2)  # the key cache (AUTH_CACHE_SECONDS=1)
    with _client(tenant) as client, pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="nowhere", input="x")
    error = _assert_openai_error(caught.value.response, 404)
    assert (error["code"], error["param"]) == ("model_not_found", "model")


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x"}, "model"),
    ({"model": "m", "input": 5}, "input"),
    ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
])
def test_it_refuses_malformed_requests_in_openai_shape(body: dict[str, Any], param: str, make_tenant: Any) -> None:
    tenant = make_tenant()
    error = _assert_openai_error(_post(tenant, body), 400)
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    not_json = httpx.post(f"{tenant.base_url}/responses", content=b"{nope", timeout=30,
                          headers={"authorization": f"Bearer {tenant.api_key}"})
    _assert_openai_error(not_json, 400)


@pytest.mark.parametrize(("scenario", "status", "exception", "should_retry"), [
    ("http:500", 502, openai.InternalServerError, "true"),  # an upstream that keeps failing: retry later
    ("http:429:retry-after=0.1", 429, openai.RateLimitError, "true"),
    ("http:400", 400, openai.BadRequestError, "false"),  # the request itself is wrong
])
def test_it_reports_upstream_failures_in_openai_shape(scenario: str, status: int, exception: type[Exception],
                                                      should_retry: str, make_tenant: Any, audit_rows: Any) -> None:
    tenant = make_tenant()
    items, _ = _input()
    with pytest.raises(exception) as caught:
        _stream(tenant, model=f"gen:calls=1:{scenario}", input=items, tools=[EXEC])
    response = caught.value.response  # type: ignore[attr-defined]
    _assert_openai_error(response, status, should_retry=should_retry)
    assert audit_rows(response.headers["x-request-id"]).client_protocol == "openai-responses"
