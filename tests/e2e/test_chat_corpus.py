"""The fault corpus through the running proxy: openai-python over real sockets, Daphne, the simulator.

For every case in ../shared/fault-cases and tests/corpus: recoverable cases give exactly the expected turn from one
upstream call; retry cases give the clean turn after a broken attempt, and the exhaustion answer
after exactly 1 + max_retries calls when always broken; error_to_client cases give a clean error
with no retry. The audit holds a finding of the case's kind.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import openai
import pytest

from tests.e2e.corpus import (
    MAX_RETRIES,
    cases_by_action,
    expected_calls,
    finding_kinds,
    upstream_calls,
)
from tests.fault_corpus import case as fault_case


def _messages() -> tuple[list[dict[str, str]], str]:
    marker = uuid.uuid4().hex
    return [{"role": "user", "content": f"What is the weather in Paris? [{marker}]"}], marker


def _calls(message: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in (message.tool_calls or [])]


def _client(tenant: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30)


@pytest.mark.parametrize("case", cases_by_action("emit", "emit_after_repair"))
def test_it_delivers_recoverable_cases_from_one_upstream_call(case: dict[str, Any], make_tenant: Any,
                                                              simulator: Any, audit_rows: Any,
                                                              django_db_blocker: Any, assert_case_audited: Any) -> None:
    tenant = make_tenant()
    messages, marker = _messages()
    with _client(tenant) as client, client.chat.completions.stream(model=f"case:{case['id']}", messages=messages,
                                                  tools=case["request_tools"]) as stream:
        for _ in stream:
            pass
        completion = stream.get_final_completion()
        request_id = stream._response.headers["x-request-id"]
    choice = completion.choices[0]
    assert _calls(choice.message) == expected_calls(case)
    assert (choice.message.content or None) == case["expected"]["content"]
    assert choice.finish_reason == case["expected"]["finish_reason"]
    assert len(upstream_calls(simulator, marker)) == 1
    row = audit_rows(request_id)
    assert row.outcome in ("clean", "normalized", "repaired")
    assert_case_audited(case, request_id)


@pytest.mark.parametrize("case", cases_by_action("emit", "emit_after_repair"))
def test_it_delivers_recoverable_cases_to_create_stream(case: dict[str, Any], make_tenant: Any) -> None:
    tenant = make_tenant()
    messages, _ = _messages()
    with _client(tenant) as client:
        chunks = list(client.chat.completions.create(model=f"case:{case['id']}", messages=messages,
                                                     tools=case["request_tools"], stream=True))
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    for chunk in chunks:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if call.function and call.function.name:
                assert call.index not in names, "a tool call's name must come once"
                names[call.index] = call.function.name
            arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
    got = [(names[i], json.loads(arguments[i])) for i in sorted(names)]
    assert got == expected_calls(case)
    assert finish == [case["expected"]["finish_reason"]]
    assert len({c.id for c in chunks}) == 1


@pytest.mark.parametrize("case", cases_by_action("retry"))
def test_it_recovers_retry_cases_after_a_broken_attempt(case: dict[str, Any], make_tenant: Any, simulator: Any,
                                                        audit_rows: Any, django_db_blocker: Any) -> None:
    tenant = make_tenant()
    messages, marker = _messages()
    scenario = f"case:{case['id']}:broken=1"
    with _client(tenant) as client, client.chat.completions.stream(model=scenario, messages=messages,
                                                  tools=case["request_tools"]) as stream:
        for _ in stream:
            pass
        completion = stream.get_final_completion()
        request_id = stream._response.headers["x-request-id"]
    message = completion.choices[0].message
    assert message.tool_calls, "the clean attempt's tool call reaches the client"
    for call in message.tool_calls:
        assert isinstance(json.loads(call.function.arguments), dict)
    assert completion.choices[0].finish_reason == "tool_calls"
    assert len(upstream_calls(simulator, marker)) == 2
    row = audit_rows(request_id)
    assert row.outcome == "recovered-by-retry"
    assert row.attempts == 2
    assert case["kind"] in finding_kinds(django_db_blocker, request_id)


@pytest.mark.parametrize("case", cases_by_action("retry"))
def test_it_ends_an_always_broken_turn_with_the_terminal_error(case: dict[str, Any], make_tenant: Any,
                                                               simulator: Any, audit_rows: Any) -> None:
    """The default exhaustion policy ``fail``: openai-python raises ``APIError`` on the error chunk (what
    makes OpenCode and Qwen Code exit 1 headless), carrying toolrelay's message; no tool call reached it."""
    tenant = make_tenant()
    messages, marker = _messages()
    calls = []
    with _client(tenant) as client, client.chat.completions.stream(model=f"case:{case['id']}", messages=messages,
                                                  tools=case["request_tools"]) as stream:
        request_id = stream._response.headers["x-request-id"]
        with pytest.raises(openai.APIError) as caught:
            for event in stream:
                calls += [event] if event.type == "tool_calls.function.arguments.done" else []
    assert not calls
    assert "[toolrelay]" in caught.value.message and request_id in caught.value.message
    assert isinstance(caught.value.body, dict) and caught.value.body.get("code") == "upstream_failed"
    assert len(upstream_calls(simulator, marker)) == 1 + MAX_RETRIES
    assert audit_rows(request_id).outcome == "exhausted"


@pytest.mark.parametrize("case", cases_by_action("retry")[:2])
def test_it_answers_exhaustion_with_a_terminal_message_when_the_policy_says_so(
        case: dict[str, Any], make_tenant: Any, simulator: Any, audit_rows: Any) -> None:
    tenant = make_tenant(exhaustion="message")
    messages, marker = _messages()
    with _client(tenant) as client, client.chat.completions.stream(model=f"case:{case['id']}", messages=messages,
                                                  tools=case["request_tools"]) as stream:
        for _ in stream:
            pass
        completion = stream.get_final_completion()
        request_id = stream._response.headers["x-request-id"]
    message = completion.choices[0].message
    assert not message.tool_calls
    assert completion.choices[0].finish_reason == "stop"
    assert "[toolrelay]" in (message.content or "")
    assert request_id in message.content
    assert len(upstream_calls(simulator, marker)) == 1 + MAX_RETRIES
    assert audit_rows(request_id).outcome == "exhausted"


@pytest.mark.parametrize("case", cases_by_action("error_to_client"))
def test_it_passes_non_retryable_errors_to_the_client(case: dict[str, Any], make_tenant: Any, simulator: Any,
                                                      audit_rows: Any, django_db_blocker: Any) -> None:
    tenant = make_tenant()
    messages, marker = _messages()
    with pytest.raises(openai.APIStatusError) as caught:
        with _client(tenant) as client, client.chat.completions.stream(model=f"case:{case['id']}", messages=messages,
                                                      tools=case["request_tools"]) as stream:
            for _ in stream:
                pass
    error = caught.value
    assert 400 <= error.status_code < 500
    assert error.response.headers.get("x-should-retry") == "false"
    assert "context" in str(error.message)
    assert len(upstream_calls(simulator, marker)) == 1
    request_id = error.response.headers["x-request-id"]
    assert audit_rows(request_id).outcome == "upstream-error"
    assert case["kind"] in finding_kinds(django_db_blocker, request_id)


@pytest.mark.parametrize("case_id", ["C14", "C46", "C15"])
def test_it_names_the_tool_a_finding_is_about(case_id: str, make_tenant: Any, audit_rows: Any,
                                             django_db_blocker: Any) -> None:
    from audit.models import Finding

    case = fault_case(case_id)
    tenant = make_tenant()
    messages, _ = _messages()
    with _client(tenant) as client, client.chat.completions.stream(
            model=f"case:{case_id}:broken=1", messages=messages, tools=case["request_tools"]) as stream:
        for _ in stream:
            pass
        request_id = stream._response.headers["x-request-id"]
    audit_rows(request_id)
    declared = {t["function"]["name"] for t in case["request_tools"]}
    with django_db_blocker.unblock():
        named = set(Finding.objects.filter(request_id=request_id, kind=case["kind"]).exclude(slot=None)
                    .values_list("tool_name", flat=True))
    assert named and named <= declared
