"""Protocol fidelity through the running proxy (issue 13 items 1-3): real Daphne, a simulator, the SDKs.

Upstream streams of chosen shapes (blank text before a tool call; reasoning, text and tool calls
in one chunk; ``length`` and ``content_filter`` finishes; a stream cut off; calls to custom and
local_shell tools) are served by a simulator of this module whose case directory is written here
(they are shapes every upstream may send, not faults, so they stay out of the fault corpus). Each
answer is read by anthropic-python (``messages.stream``) or openai-python
(``responses.create(stream=True)``) and, raw, checked against the grammars written from
PROTOCOLS.md 2.3 and 3.4 (``tests.protocol_grammar``). Request shapes (Claude Code's tool results
with images and ``tool_reference`` blocks, PDFs, server tools; Codex's custom tools, reasoning
items with ``encrypted_content``) are checked on what the upstream received.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.simulator import start_in_thread
from tests.e2e.conftest import TenantFixture
from tests.e2e.corpus import upstream_calls
from tests.protocol_grammar import anthropic_content, assert_tool_pairing, responses_output

READ = {"name": "Read", "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello \"world\"\n*** End Patch\n"
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
               "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" LF'}}
EXEC = {"type": "function", "name": "exec_command", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
HEADERS = {"anthropic-version": "2023-06-01"}
USAGE = {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30}


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return json.dumps({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1700000000, "model": "m",
                       "choices": choices, **extra})


def _call(index: int, call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def _done(finish: str) -> list[str]:
    return [_chunk({}, finish), _chunk(None, usage=USAGE), "[DONE]"]


#: Upstream streams by case id (what the simulator replays for ``case:<id>``).
SHAPES: dict[str, list[str]] = {
    # Blank text before a tool call (Claude Code renders a blank text block, issue 13).
    "C901": [_chunk({"role": "assistant", "content": "\n\n"}), _chunk({"content": " "}),
             _chunk({"tool_calls": [_call(0, "call_r1", "Read", {"path": "a.txt"})]}), *_done("tool_calls")],
    # Reasoning, text, more reasoning, then text, two calls and the finish in one chunk.
    "C902": [_chunk({"role": "assistant", "reasoning_content": "Plan: "}),
             _chunk({"reasoning_content": "read both.", "content": "Reading"}),
             _chunk({"reasoning_content": " (a first)"}),
             _chunk({"content": " two files.", "tool_calls": [_call(0, "call_a", "Read", {"path": "a"}),
                                                              _call(1, "call_b", "Read", {"path": "b"})]},
                    "tool_calls"),
             _chunk(None, usage=USAGE), "[DONE]"],
    # Cut by the output budget, and by a content filter.
    "C903": [_chunk({"role": "assistant", "content": "Once upon a"}), *_done("length")],
    "C904": [_chunk({"role": "assistant", "content": "I will not"}), *_done("content_filter")],
    # A custom (freeform) tool call and a local_shell call, as a chat upstream makes them.
    "C905": [_chunk({"role": "assistant", "content": "Patching."}),
             _chunk({"tool_calls": [_call(0, "call_p", "apply_patch", {"input": PATCH})]}), *_done("tool_calls")],
    "C906": [_chunk({"tool_calls": [_call(0, "call_s", "local_shell", {"command": ["ls", "-la"]})]}),
             *_done("tool_calls")],
    # Text, then the stream stops: no finish reason, no [DONE].
    "C907": [_chunk({"role": "assistant", "content": "Half an ans"})],
}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A simulator replaying ``SHAPES``."""
    directory: Path = tmp_path_factory.mktemp("shapes")
    for case_id, chunks in SHAPES.items():
        (directory / f"{case_id}.json").write_text(json.dumps({"id": case_id, "kind": "shape",
                                                               "upstream_chunks": chunks}))
    sim = start_in_thread(host="127.0.0.1", port=0, cases_dir=directory)
    yield sim
    sim.stop()


@pytest.fixture
def shape_tenant(proxy_server: Any, shapes: Any, django_db_blocker: Any) -> Callable[..., TenantFixture]:
    """A fresh tenant whose default upstream is the ``shapes`` simulator."""

    def make(**policy: Any) -> TenantFixture:
        from tenants.services import provision

        with django_db_blocker.unblock():
            done = provision(tenant_name=f"s-{uuid.uuid4().hex[:10]}", upstream_url=shapes.url, upstream_key="k")
            for name, value in policy.items():
                setattr(done.tenant, name, value)
            if policy:
                done.tenant.save()
        return TenantFixture(done.tenant, done.raw_key or "", proxy_server.v1, done.upstream)

    return make


def _anthropic_raw(proxy_server: Any, tenant: TenantFixture, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    response = httpx.post(f"{proxy_server.url}/v1/messages?beta=true", json={"max_tokens": 1024, "stream": True,
                                                                             **body},
                          headers={**HEADERS, "x-api-key": tenant.api_key}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.text.endswith("\n\n") and "data: [DONE]" not in response.text
    out = []
    for raw in response.text.split("\n\n")[:-1]:
        name, data = raw.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def _responses_raw(tenant: TenantFixture, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = httpx.post(f"{tenant.base_url}/responses", json={"stream": True, **body}, timeout=30,
                          headers={"authorization": f"Bearer {tenant.api_key}"})
    assert response.status_code == 200, response.text
    events = []
    for raw in response.text.split("\n\n")[:-1]:
        lines = [line for line in raw.split("\n") if not line.startswith(":")]
        if lines:
            events.append(json.loads(lines[-1].removeprefix("data: ")))
    return events


def _messages(text: str = "go") -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{text} [{uuid.uuid4().hex}]"}]


# -- Anthropic Messages, stream side (item 1) -------------------------------------------------------


def test_claude_code_gets_no_blank_text_block_before_a_tool_use(shape_tenant: Any, proxy_server: Any) -> None:
    tenant = shape_tenant()
    events = _anthropic_raw(proxy_server, tenant, {"model": "case:C901", "messages": _messages(), "tools": [READ]})
    content, reason = anthropic_content(events)
    assert content == [{"type": "tool_use", "id": "call_r1", "name": "Read", "input": {"path": "a.txt"}}]
    assert reason == "tool_use"
    with anthropic.Anthropic(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0) as client, \
            client.messages.stream(model="case:C901", max_tokens=1024, messages=_messages(), tools=[READ]) as s:
        message = s.get_final_message()
    assert [b.type for b in message.content] == ["tool_use"]


def test_reasoning_text_and_calls_in_one_chunk_become_ordered_blocks(shape_tenant: Any, proxy_server: Any) -> None:
    """Each kind of delta in its own block, one block at a time, calls last, usage in ``message_delta``.

    (Within one delta the guard releases ``content`` before ``reasoning_content``
    (``proxy.guard.stream.accumulate._TEXT_KEYS``), so "Reading" opens a text block before "read both."
    goes on as thinking; the emitter renders that order faithfully. The assertions here hold for
    either order.)"""
    tenant = shape_tenant()
    events = _anthropic_raw(proxy_server, tenant, {"model": "case:C902", "messages": _messages(), "tools": [READ]})
    content, reason = anthropic_content(events)
    kinds = [b["type"] for b in content]
    assert "".join(b["thinking"] for b in content if b["type"] == "thinking") == "Plan: read both. (a first)"
    assert "".join(b["text"] for b in content if b["type"] == "text") == "Reading two files."
    assert [b["input"] for b in content if b["type"] == "tool_use"] == [{"path": "a"}, {"path": "b"}]
    assert kinds[-2:] == ["tool_use", "tool_use"] and kinds[0] == "thinking"
    assert all(a != b for a, b in zip(kinds[:-2], kinds[1:-1], strict=False)), "a new block only on a change of kind"
    assert reason == "tool_use" and events[-2][1]["usage"]["output_tokens"] == USAGE["completion_tokens"]
    with anthropic.Anthropic(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0) as client, \
            client.messages.stream(model="case:C902", max_tokens=1024, messages=_messages(), tools=[READ]) as s:
        message = s.get_final_message()
    assert [b.type for b in message.content] == kinds
    assert message.content[0].signature == content[0]["signature"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("case", "reason"), [("C903", "max_tokens"), ("C904", "refusal")])
def test_cut_turns_end_with_the_matching_stop_reason(case: str, reason: str, shape_tenant: Any,
                                                     proxy_server: Any) -> None:
    events = _anthropic_raw(proxy_server, shape_tenant(), {"model": f"case:{case}", "messages": _messages()})
    assert anthropic_content(events)[1] == reason


def test_thinking_signatures_round_trip_into_reasoning_content(shape_tenant: Any, proxy_server: Any,
                                                               shapes: Any) -> None:
    """The assistant message Claude Code echoes back (signatures included, PROTOCOLS.md 4.3) reaches
    the upstream as one assistant message with ``reasoning_content`` and both calls (2.8)."""
    tenant = shape_tenant()
    messages = _messages()
    with anthropic.Anthropic(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0) as client:
        first = client.messages.create(model="case:C902", max_tokens=1024, messages=messages, tools=[READ],
                                       stream=True)
        blocks = [e for e in first]
    content, _ = anthropic_content([(e.type, e.to_dict()) for e in blocks])
    history = [*messages, {"role": "assistant", "content": content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_a", "content": "A"},
                                            {"type": "tool_result", "tool_use_id": "call_b", "content": "B"}]}]
    _anthropic_raw(proxy_server, tenant, {"model": "case:C903", "messages": history, "tools": [READ]})
    marker = messages[0]["content"].rsplit("[", 1)[1].rstrip("]")
    upstream = upstream_calls(shapes, marker)[-1]["body"]["messages"]
    assert [m["role"] for m in upstream] == ["user", "assistant", "tool", "tool"]
    assert upstream[1]["reasoning_content"] == "Plan: read both. (a first)"
    assert upstream[1]["content"].replace("\n\n", "") == "Reading two files."
    assert [c["id"] for c in upstream[1]["tool_calls"]] == ["call_a", "call_b"]


# -- Anthropic Messages, request side (item 2) ------------------------------------------------------


def test_claude_code_tool_results_reach_the_upstream_as_one_string_per_call(make_tenant: Any, proxy_server: Any,
                                                                            simulator: Any) -> None:
    """Images, ``tool_reference`` blocks, empty lists and a system message in between (section 0 item 13)."""
    tenant = make_tenant()
    messages = _messages("look")
    png = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    history = [*messages,
               {"role": "assistant", "content": [
                   {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "shot.png"}},
                   {"type": "tool_use", "id": "toolu_2", "name": "ToolSearch", "input": {"query": "db"}},
                   {"type": "tool_use", "id": "toolu_3", "name": "Read", "input": {"path": "empty"}}]},
               {"role": "system", "content": "reminder"},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": "toolu_2",
                    "content": [{"type": "tool_reference", "tool_name": "mcp__db__query"}]},
                   {"type": "tool_result", "tool_use_id": "toolu_1", "content": [png]},
                   {"type": "tool_result", "tool_use_id": "toolu_3", "content": []},
                   {"type": "text", "text": "what now?"}]}]
    tools = [READ, {"name": "ToolSearch", "input_schema": {"type": "object"}},
             {"name": "mcp__db__query", "input_schema": {"type": "object"}, "defer_loading": True},
             {"type": "web_search_20250305", "name": "web_search"}]
    with anthropic.Anthropic(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0) as client, \
            client.messages.stream(model="gen:calls=0", max_tokens=1024, messages=history, tools=tools) as s:
        assert s.get_final_message().stop_reason == "end_turn"
    body = upstream_calls(simulator, messages[0]["content"].rsplit("[", 1)[1].rstrip("]"))[-1]["body"]
    upstream = body["messages"]
    assert_tool_pairing(upstream)
    assert [(m["role"], m.get("tool_call_id")) for m in upstream] == [
        ("user", None), ("assistant", None), ("tool", "toolu_1"), ("tool", "toolu_2"), ("tool", "toolu_3"),
        ("system", None), ("user", None)]
    assert upstream[3]["content"] == '{"type":"tool_reference","tool_name":"mcp__db__query"}'
    assert upstream[4]["content"] == ""
    assert upstream[6]["content"][1]["image_url"]["url"] == "data:image/png;base64,iVBORw0KGgo="
    assert [t["function"]["name"] for t in body["tools"]] == ["Read", "ToolSearch", "mcp__db__query"]


def test_a_pdf_goes_up_as_a_file_part_and_a_url_document_is_refused_naming_the_block(
        make_tenant: Any, proxy_server: Any, simulator: Any) -> None:
    tenant = make_tenant()
    messages = _messages("summarise")
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}}
    with anthropic.Anthropic(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0) as client:
        client.messages.create(model="gen:calls=0", max_tokens=64, messages=[
            {"role": "user", "content": [{"type": "text", "text": messages[0]["content"]}, pdf]}])
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model="gen:calls=0", max_tokens=64, messages=[{"role": "user", "content": [
                {"type": "text", "text": "x"},
                {"type": "document", "source": {"type": "url", "url": "https://example.org/a.pdf"}}]}])
    upstream = upstream_calls(simulator, messages[0]["content"].rsplit("[", 1)[1].rstrip("]"))[-1]["body"]
    assert upstream["messages"][0]["content"][1] == {
        "type": "file", "file": {"filename": "document.pdf", "file_data": "data:application/pdf;base64,JVBERi0x"}}
    assert "messages[0].content[1]" in caught.value.message
    assert caught.value.response.headers["x-should-retry"] == "false"


# -- OpenAI Responses (item 3) ----------------------------------------------------------------------


def test_codex_gets_a_custom_tool_call_with_the_raw_patch(shape_tenant: Any) -> None:
    tenant = shape_tenant()
    body = {"model": "case:C905", "input": _messages("add hello.txt"), "tools": [APPLY_PATCH, EXEC]}
    done, terminal = responses_output(_responses_raw(tenant, body))
    call = done[-1]
    assert (call["type"], call["name"], call["input"], call["call_id"]) == ("custom_tool_call", "apply_patch", PATCH,
                                                                          "call_p")
    assert terminal["status"] == "completed"
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0) as client:
        events = list(client.responses.create(stream=True, **body))  # type: ignore[call-overload]
    deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    assert deltas == PATCH and events[-1].type == "response.completed"
    assert events[-1].response.output[-1].input == PATCH


def test_codex_custom_tools_are_declared_upstream_with_one_string_parameter(make_tenant: Any,
                                                                            simulator: Any) -> None:
    tenant = make_tenant()
    items = _messages("patch it")
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0) as client:
        events = list(client.responses.create(model="gen:calls=1:text=0", input=items, tools=[APPLY_PATCH],
                                              tool_choice={"type": "custom", "name": "apply_patch"}, stream=True))
    [item] = [e.item for e in events if e.type == "response.output_item.done"]
    assert item.type == "custom_tool_call" and isinstance(item.input, str) and item.input
    upstream = upstream_calls(simulator, items[0]["content"].rsplit("[", 1)[1].rstrip("]"))[0]["body"]
    assert upstream["tools"][0]["function"]["parameters"]["required"] == ["input"]
    assert upstream["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}


def test_codex_gets_local_shell_call_items(shape_tenant: Any) -> None:
    tenant = shape_tenant()
    done, _ = responses_output(_responses_raw(tenant, {"model": "case:C906", "input": _messages(),
                                                       "tools": [{"type": "local_shell"}]}))
    assert done[0]["type"] == "local_shell_call" and done[0]["action"]["command"] == ["ls", "-la"]


@pytest.mark.parametrize(("case", "reason"), [("C903", "max_output_tokens"), ("C904", "content_filter")])
def test_a_cut_turn_ends_with_response_incomplete_never_completed(case: str, reason: str, shape_tenant: Any) -> None:
    tenant = shape_tenant()
    events = _responses_raw(tenant, {"model": f"case:{case}", "input": _messages(), "max_output_tokens": 16})
    _, terminal = responses_output(events)
    assert events[-1]["type"] == "response.incomplete" and terminal["incomplete_details"] == {"reason": reason}
    assert not any(e["type"] == "response.completed" for e in events)
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0) as client:
        last = list(client.responses.create(model=f"case:{case}", input=_messages(), stream=True))[-1]
    assert last.type == "response.incomplete" and last.response.incomplete_details.reason == reason  # type: ignore[union-attr]


def test_a_stream_cut_off_never_ends_with_response_completed(shape_tenant: Any) -> None:
    """No finish reason, no ``[DONE]``: under the ``error`` exhaustion policy the client gets
    ``response.failed`` (Anthropic: ``event: error``), never a completed half answer."""
    tenant = shape_tenant(exhaustion="error", max_retries=0)
    events = _responses_raw(tenant, {"model": "case:C907", "input": _messages()})
    _, terminal = responses_output(events)
    assert events[-1]["type"] == "response.failed" and terminal["error"]["message"]


def test_a_stream_cut_off_ends_the_anthropic_stream_with_an_error_event(shape_tenant: Any,
                                                                        proxy_server: Any) -> None:
    tenant = shape_tenant(exhaustion="error", max_retries=0)
    events = _anthropic_raw(proxy_server, tenant, {"model": "case:C907", "messages": _messages()})
    assert anthropic_content(events)[1] is None and events[-1][0] == "error"


def test_codex_history_with_reasoning_custom_calls_and_outputs_is_accepted(make_tenant: Any,
                                                                          simulator: Any) -> None:
    """Codex re-sends everything with ``store: false``: reasoning with ``encrypted_content``,
    ``custom_tool_call`` / ``custom_tool_call_output``, a ``text.format``; never a 400 (PROTOCOLS.md 3.3)."""
    tenant = make_tenant()
    items = [*_messages("add hello.txt"),
             {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Use apply_patch."}],
              "encrypted_content": "gAAAA-opaque"},
             {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": PATCH},
             {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success. Updated hello.txt"}]
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0) as client:
        events = list(client.responses.create(model="gen:calls=0", input=items, tools=[APPLY_PATCH, EXEC],
                                              include=["reasoning.encrypted_content"], store=False,
                                              max_output_tokens=512, parallel_tool_calls=False, stream=True,
                                              text={"format": {"type": "json_object"}}))
    assert events[-1].type == "response.completed"
    upstream = upstream_calls(simulator, items[0]["content"].rsplit("[", 1)[1].rstrip("]"))[0]["body"]
    assert_tool_pairing(upstream["messages"])
    assistant = upstream["messages"][1]
    assert assistant["reasoning_content"] == "Use apply_patch."
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"input": PATCH}
    assert (upstream["max_tokens"], upstream["parallel_tool_calls"], upstream["response_format"]) == (
        512, False, {"type": "json_object"})
