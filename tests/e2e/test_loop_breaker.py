"""The loop breaker across requests, through the running proxy with the three real clients.

The simulator's ``gen:loop=1`` is an agent's model stuck in a loop: every turn replays the same tool
call whatever the tool result says. Each test plays the agent: it runs the call (the same result each
time), sends the whole history back, and asks again. The 4th identical call (the policy default) is
replaced by the terminal "agent seems stuck" message with a normal stop, and the request's audit row
carries an ``agent-loop`` finding. A result that changes (progress) is never stopped.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import anthropic
import openai
import pytest

from proxy.guard.decisions.loops import STUCK_PREFIX
from tests.e2e.conftest import running_proxy
from tests.e2e.test_limits import private_redis  # noqa: F401 - a fixture

LOOP = "gen:loop=1:calls=1:text=0"
BROKEN = "gen:broken=99:calls=1:kinds=mid-stream-error-chunk"
TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
ANTHROPIC_TOOL = {"name": "read_file", "description": "Read a file", "input_schema": TOOL["function"]["parameters"]}
RESPONSES_TOOL = {"type": "function", "name": "read_file", "description": "Read a file", "strict": False,
                  "parameters": TOOL["function"]["parameters"]}


def _task() -> str:
    return f"Fix the bug [{uuid.uuid4().hex}]"


def _findings(django_db_blocker: Any, tenant: Any, requests: int) -> list[str]:
    """The ``agent-loop`` findings of the tenant's requests, once its ``requests`` rows are finished."""
    from audit.models import Finding, ProxyRequest

    deadline = time.monotonic() + 15
    with django_db_blocker.unblock():
        while time.monotonic() < deadline:
            rows = ProxyRequest.objects.filter(tenant=tenant.tenant).exclude(outcome="pending")
            if rows.filter(finished__isnull=False).count() >= requests:
                break
            time.sleep(0.05)
        return list(Finding.objects.filter(tenant_id_copy=tenant.tenant.id, kind="agent-loop")
                    .values_list("detail", flat=True))


@pytest.mark.parametrize("stream", [True, False])
def test_openai_chat_stops_the_fourth_identical_call(make_tenant: Any, audit_rows: Any, django_db_blocker: Any,
                                                     stream: bool) -> None:
    tenant = make_tenant()
    messages: list[dict[str, Any]] = [{"role": "user", "content": _task()}]
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30) as client:
        for turn in range(1, 5):
            if turn == 4:
                break
            if stream:
                with client.chat.completions.stream(model=LOOP, messages=messages,  # type: ignore[arg-type]
                                                    tools=[TOOL]) as events:  # type: ignore[list-item]
                    completion = events.get_final_completion()
            else:
                completion = client.chat.completions.create(model=LOOP, messages=messages,  # type: ignore
                                                            tools=[TOOL])  # type: ignore[list-item]
            choice = completion.choices[0]
            if turn < 4:
                assert choice.finish_reason == "tool_calls", turn
                [call] = choice.message.tool_calls or []
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": call.id, "type": "function", "function": {"name": call.function.name,  # type: ignore
                                                                      "arguments": call.function.arguments}}]})  # type: ignore
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "ENOENT: no such file"})
        # The 4th: the default exhaustion policy ``fail`` ends the turn with the protocol's terminal error
        # (in-stream error chunk; non-stream HTTP 400 agent_loop_detected), so a headless agent run fails.
        with pytest.raises(openai.APIError) as caught:
            if stream:
                with client.chat.completions.stream(model=LOOP, messages=messages,  # type: ignore[arg-type]
                                                    tools=[TOOL]) as events:  # type: ignore[list-item]
                    events.get_final_completion()
            else:
                client.chat.completions.create(model=LOOP, messages=messages, tools=[TOOL])  # type: ignore
    said = caught.value.message
    assert STUCK_PREFIX in said and "4th time in a row" in said
    assert said.count("equest id") == 1, said
    if not stream:
        assert isinstance(caught.value, openai.BadRequestError)
        assert caught.value.response.headers["x-should-retry"] == "false"
        assert isinstance(caught.value.body, dict) and caught.value.body.get("code") == "agent_loop_detected"
    [detail] = _findings(django_db_blocker, tenant, 4)
    assert detail.startswith("repeat:") and "read_file:" in detail


def test_a_result_that_changes_is_never_stopped(make_tenant: Any) -> None:
    tenant = make_tenant(exhaustion="message")
    messages: list[dict[str, Any]] = [{"role": "user", "content": _task()}]
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30) as client:
        for turn in range(6):
            completion = client.chat.completions.create(model=LOOP, messages=messages, tools=[TOOL])  # type: ignore
            choice = completion.choices[0]
            assert choice.finish_reason == "tool_calls", turn
            [call] = choice.message.tool_calls or []
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.function.name,  # type: ignore
                                                                  "arguments": call.function.arguments}}]})  # type: ignore
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{turn} tests still fail"})


def test_anthropic_messages_stop_the_fourth_identical_call(make_tenant: Any, proxy_server: Any, audit_rows: Any,
                                                           django_db_blocker: Any) -> None:
    tenant = make_tenant(exhaustion="message")
    messages: list[dict[str, Any]] = [{"role": "user", "content": _task()}]
    session = {"x-claude-code-session-id": str(uuid.uuid4())}
    with anthropic.Anthropic(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0, timeout=30,
                             default_headers=session) as client:
        for turn in range(1, 5):
            with client.messages.stream(model=LOOP, max_tokens=512, messages=messages,  # type: ignore[arg-type]
                                        tools=[ANTHROPIC_TOOL]) as events:  # type: ignore[list-item]
                message = events.get_final_message()
            if turn < 4:
                assert message.stop_reason == "tool_use", turn
                uses = [b for b in message.content if b.type == "tool_use"]
                messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in uses]})
                messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                              "content": "ENOENT: no such file"}]})
    assert message.stop_reason == "end_turn" and [b.type for b in message.content] == ["text"]
    assert message.content[0].text.startswith(STUCK_PREFIX)  # type: ignore[union-attr]
    assert _findings(django_db_blocker, tenant, 4)


def test_responses_stop_the_fourth_identical_call(make_tenant: Any, audit_rows: Any,
                                                  django_db_blocker: Any) -> None:
    tenant = make_tenant(exhaustion="message")
    items: list[dict[str, Any]] = [{"role": "user", "content": _task()}]
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30,
                       default_headers={"session_id": str(uuid.uuid4())}) as client:
        for turn in range(1, 5):
            with client.responses.stream(model=LOOP, input=items, tools=[RESPONSES_TOOL],  # type: ignore[arg-type]
                                         store=False) as events:
                response = events.get_final_response()
            calls = [i for i in response.output if i.type == "function_call"]
            if turn < 4:
                assert len(calls) == 1, turn
                items += [i.model_dump(exclude_none=True) for i in response.output]
                items.append({"type": "function_call_output", "call_id": calls[0].call_id,
                              "output": json.dumps({"error": "no such file"})})
    assert response.status == "completed" and not calls
    assert response.output_text.startswith(STUCK_PREFIX)
    assert _findings(django_db_blocker, tenant, 4)


def test_session_state_stops_an_agent_that_sends_only_its_last_step(make_tenant: Any) -> None:
    """The history alone would never show three repeats: the session (Claude Code's header) remembers them."""
    tenant = make_tenant(exhaustion="message")
    task = _task()
    headers = {"x-claude-code-session-id": str(uuid.uuid4())}
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30,
                       default_headers=headers) as client:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for turn in range(1, 5):
            choice = client.chat.completions.create(model=LOOP, messages=messages,  # type: ignore[arg-type]
                                                    tools=[TOOL]).choices[0]  # type: ignore[list-item]
            if turn < 4:
                [call] = choice.message.tool_calls or []
                messages = [{"role": "user", "content": task},
                            {"role": "assistant", "content": None, "tool_calls": [
                                {"id": call.id, "type": "function",
                                 "function": {"name": call.function.name,  # type: ignore[union-attr]
                                              "arguments": call.function.arguments}}]},  # type: ignore[union-attr]
                            {"role": "tool", "tool_call_id": call.id, "content": "ENOENT"}]
    assert choice.finish_reason == "stop" and (choice.message.content or "").startswith(STUCK_PREFIX)


def test_two_processes_share_the_session_state_through_redis(e2e_database_url: str, tmp_path: Any,
                                                             make_tenant: Any, private_redis: Any) -> None:  # noqa: F811
    """A stateless agent (it sends only its last step) whose requests alternate between two Daphne processes:
    neither history nor either process alone sees three repeats; the session state in Redis does."""
    url, _ = private_redis
    env = {"REDIS_URL": url, "LIMITS_KEY_PREFIX": f"e2e:{uuid.uuid4().hex}:", "LIMITS_REDIS_TIMEOUT_SECONDS": "0.5"}
    tenant = make_tenant(exhaustion="message")
    task = _task()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    headers = {"x-claude-code-session-id": str(uuid.uuid4())}
    with running_proxy(e2e_database_url, tmp_path / "a" / "serve.log", **env) as one, \
            running_proxy(e2e_database_url, tmp_path / "b" / "serve.log", **env) as two:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for turn, server in enumerate((one, two, one, two), start=1):
            with openai.OpenAI(base_url=server.v1, api_key=tenant.api_key, max_retries=0, timeout=30,
                               default_headers=headers) as client:
                choice = client.chat.completions.create(model=LOOP, messages=messages,  # type: ignore[arg-type]
                                                        tools=[TOOL]).choices[0]  # type: ignore[list-item]
            if turn < 4:
                assert choice.finish_reason == "tool_calls", turn
                [call] = choice.message.tool_calls or []
                messages = [{"role": "user", "content": task},
                            {"role": "assistant", "content": None, "tool_calls": [
                                {"id": call.id, "type": "function",
                                 "function": {"name": call.function.name,  # type: ignore[union-attr]
                                              "arguments": call.function.arguments}}]},  # type: ignore[union-attr]
                            {"role": "tool", "tool_call_id": call.id, "content": "ENOENT"}]
    assert choice.finish_reason == "stop" and (choice.message.content or "").startswith(STUCK_PREFIX)


def test_the_third_exhausted_turn_in_a_row_is_answered_as_stuck(make_tenant: Any) -> None:
    """The user types "continue" into a turn that keeps failing: toolrelay's exhaustion answers in the history
    count, and the 3rd exhausted turn in a row gets the stuck answer instead."""
    tenant = make_tenant(exhaustion="message")
    messages: list[dict[str, Any]] = [{"role": "user", "content": _task()}]
    texts = []
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30) as client:
        for _ in range(3):
            with client.chat.completions.stream(model=BROKEN, messages=messages,  # type: ignore
                                                tools=[TOOL]) as events:  # type: ignore[list-item]
                choice = events.get_final_completion().choices[0]
            assert choice.finish_reason == "stop" and not choice.message.tool_calls
            texts.append(choice.message.content or "")
            messages += [{"role": "assistant", "content": texts[-1]}, {"role": "user", "content": "continue"}]
    assert all("[toolrelay] The upstream model could not produce a valid answer" in t for t in texts[:2])
    assert STUCK_PREFIX in texts[2] and "3 turns in a row" in texts[2]


def test_independent_conversations_with_one_opening_never_share_loop_state(make_tenant: Any) -> None:
    """Parallel CI jobs of one task (no session header, the same opening message): each of five first
    turns is exhausted on its own, and none is answered as a loop of the others (issue 23, item 2)."""
    tenant = make_tenant(exhaustion="message")
    opening = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": _task()}]
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30) as client:
        texts = []
        for _ in range(5):
            with client.chat.completions.stream(model=BROKEN, messages=list(opening),  # type: ignore
                                                tools=[TOOL]) as events:  # type: ignore[list-item]
                choice = events.get_final_completion().choices[0]
            texts.append(choice.message.content or "")
    assert all("[toolrelay] The upstream model could not produce a valid answer" in t for t in texts), texts
    assert not any(STUCK_PREFIX in t for t in texts)


def test_a_conversation_without_a_header_keeps_its_state_through_its_first_turn(make_tenant: Any) -> None:
    """Without a session header the chain is the conversation's first delivered turn: an agent that keeps
    its first turn and sends its latest step (a compacted middle) is still one session."""
    tenant = make_tenant(exhaustion="message")
    task = _task()
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30) as client:
        first: list[dict[str, Any]] = []
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for turn in range(1, 5):
            choice = client.chat.completions.create(model=LOOP, messages=messages,  # type: ignore[arg-type]
                                                    tools=[TOOL]).choices[0]  # type: ignore[list-item]
            if turn < 4:
                [call] = choice.message.tool_calls or []
                step = [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": call.id, "type": "function", "function": {"name": call.function.name,  # type: ignore
                                                                      "arguments": call.function.arguments}}]},  # type: ignore
                    {"role": "tool", "tool_call_id": call.id, "content": "ENOENT"}]
                first = first or step
                messages = [{"role": "user", "content": task}, *first, *([] if step is first else step)]
    assert choice.finish_reason == "stop" and (choice.message.content or "").startswith(STUCK_PREFIX)
