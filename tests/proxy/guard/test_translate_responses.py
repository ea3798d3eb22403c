"""OpenAI Responses request -> chat.completions request (PROTOCOLS.md 3.3, 1.1).

Request shapes follow openai-python's ``ResponseCreateParams`` / ``ResponseInputItemParam`` and what
Codex CLI 0.171.0 was seen to send (PROTOCOLS.md 3.3).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.protocols.responses_tools import ClientTool
from proxy.guard.protocols.translate import TranslationError
from proxy.guard.protocols.translate_responses import flat_tool_name, translate_responses

EXEC = {"type": "function", "name": "exec_command", "description": "Run a command", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
MULTI_AGENT = {"type": "namespace", "name": "multi_agent_v1", "description": "Agents", "tools": [
    {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {
        "message": {"type": "string"}}}},
    {"type": "function", "name": "wait", "parameters": None}]}


def request(**fields: Any) -> dict[str, Any]:
    return {"model": "my-model", "input": "hi", **fields}


def test_it_maps_a_string_input_and_instructions() -> None:
    body = translate_responses(request(instructions="Be brief.")).body
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_it_maps_message_items_by_role() -> None:
    items = [{"type": "message", "id": "m0", "role": "developer",
              "content": [{"type": "input_text", "text": "You are Codex."}]},
             {"role": "system", "content": "Sandbox: read-only"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env>x</env>"},
                                                              {"type": "input_text", "text": "list files"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
             {"role": "user", "content": "thanks"}]
    body = translate_responses(request(input=items)).body
    assert body["messages"] == [
        {"role": "system", "content": "You are Codex."},
        {"role": "system", "content": "Sandbox: read-only"},
        {"role": "user", "content": "<env>x</env>\n\nlist files"},
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "thanks"},
    ]


def test_it_maps_input_images_and_files() -> None:
    items = [{"role": "user", "content": [{"type": "input_text", "text": "look"},
                                          {"type": "input_image", "image_url": "data:image/png;base64,AAAA",
                                           "detail": "high"},
                                          {"type": "input_file", "filename": "a.pdf",
                                           "file_data": "data:application/pdf;base64,JVBE"}]}]
    result = translate_responses(request(input=items))
    assert result.body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "high"}},
        {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBE"}}]}]
    assert result.dropped == ()


@pytest.mark.parametrize("part", [{"type": "input_image", "file_id": "file-1"},
                                  {"type": "input_file", "file_url": "https://example.org/a.pdf"}])
def test_it_refuses_files_it_cannot_carry_naming_the_part(part: dict[str, Any]) -> None:
    with pytest.raises(TranslationError) as caught:
        translate_responses(request(input=[{"role": "user", "content": [{"type": "input_text", "text": "x"}, part]}]))
    assert caught.value.param == "input[0].content[1]" and "input[0].content[1]" in caught.value.message


def test_it_groups_reasoning_text_and_function_calls_into_one_assistant_message() -> None:
    """Codex re-sends the whole history with ``store: false`` (PROTOCOLS.md 3.3)."""
    items = [{"role": "user", "content": "weather in Paris and Rome?"},
             {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "Two cities."}], "encrypted_content": None},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
             {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec_command",
              "arguments": '{"cmd":"weather Paris"}', "status": "completed"},
             {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "exec_command",
              "arguments": '{"cmd":"weather Rome"}', "status": "completed"},
             {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
             {"type": "function_call_output", "call_id": "call_2",
              "output": [{"type": "input_text", "text": "20 C"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Warm."}]}]
    body = translate_responses(request(input=items, tools=[EXEC])).body
    assert body["messages"][1:] == [
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Two cities.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "exec_command",
                                                              "arguments": '{"cmd":"weather Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "exec_command",
                                                              "arguments": '{"cmd":"weather Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "20 C"},
        {"role": "assistant", "content": "Warm."},
    ]


def test_it_uses_a_reasoning_summary_when_there_is_no_reasoning_text() -> None:
    items = [{"role": "user", "content": "x"},
             {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "thought"}]},
             {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c", "output": "ok"}]
    body = translate_responses(request(input=items, tools=[EXEC])).body
    assert body["messages"][1]["reasoning_content"] == "thought"
    assert body["messages"][1]["content"] is None


def test_it_declares_function_tools_flattens_namespaces_and_drops_hosted_tools() -> None:
    tools = [EXEC, MULTI_AGENT, {"type": "web_search", "external_web_access": False},
             {"type": "file_search", "vector_store_ids": ["v"]}]
    result = translate_responses(request(tools=tools))
    assert result.body["tools"] == [
        {"type": "function", "function": {"name": "exec_command", "description": "Run a command",
                                          "parameters": EXEC["parameters"]}},
        {"type": "function", "function": {"name": "multi_agent_v1__spawn_agent",
                                          "parameters": MULTI_AGENT["tools"][0]["parameters"]}},
        {"type": "function", "function": {"name": "multi_agent_v1__wait",
                                          "parameters": {"type": "object", "properties": {}}}},
    ]
    assert result.tool_names == {"multi_agent_v1__spawn_agent": ClientTool("multi_agent_v1", "spawn_agent"),
                                 "multi_agent_v1__wait": ClientTool("multi_agent_v1", "wait")}
    assert result.dropped == ("tools[2] (web_search)", "tools[3] (file_search)")


def test_it_maps_namespaced_calls_in_history_to_the_flattened_names() -> None:
    items = [{"role": "user", "content": "x"},
             {"type": "function_call", "call_id": "c", "name": "wait", "namespace": "multi_agent_v1",
              "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c", "output": "done"}]
    body = translate_responses(request(input=items, tools=[MULTI_AGENT])).body
    assert body["messages"][1]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__wait"


def test_it_shortens_long_flattened_names_and_maps_them_back() -> None:
    namespace = {"type": "namespace", "name": "n" * 40, "description": "", "tools": [
        {"type": "function", "name": "t" * 40, "parameters": {"type": "object"}}]}
    result = translate_responses(request(tools=[namespace]))
    name = result.body["tools"][0]["function"]["name"]
    assert len(name) == 64 and name == flat_tool_name("n" * 40, "t" * 40)
    assert result.tool_names[name] == ClientTool("n" * 40, "t" * 40)


@pytest.mark.parametrize(("choice", "expected"), [
    ("auto", "auto"), ("none", "none"), ("required", "required"),
    ({"type": "function", "name": "exec_command"}, {"type": "function", "function": {"name": "exec_command"}}),
    ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "exec_command"}]},
     "required"),
    ({"type": "web_search"}, None),
])
def test_it_maps_tool_choice(choice: Any, expected: Any) -> None:
    body = translate_responses(request(tools=[EXEC], tool_choice=choice, parallel_tool_calls=False)).body
    assert body.get("tool_choice") == expected
    assert body["parallel_tool_calls"] is False


def test_it_maps_codex_generation_fields_and_ignores_its_transport_fields() -> None:
    """Codex 0.171.0's body keys (PROTOCOLS.md 3.3)."""
    result = translate_responses(request(
        tools=[EXEC], tool_choice="auto", parallel_tool_calls=True, reasoning={"summary": "auto", "effort": "high"},
        store=False, stream=True, include=["reasoning.encrypted_content"], prompt_cache_key="k",
        client_metadata={"a": "b"}, max_output_tokens=2000, temperature=0.1, top_p=1))
    body = result.body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["reasoning_effort"]) == (2000, 0.1, 1, "high")
    assert body["parallel_tool_calls"] is True and body["tool_choice"] == "auto"
    assert result.dropped == ()
    assert "store" not in body and "include" not in body


def test_it_maps_text_formats_to_response_format() -> None:
    schema = {"type": "object", "properties": {}}
    body = translate_responses(request(text={"format": {"type": "json_schema", "name": "out", "schema": schema,
                                                        "strict": True}})).body
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "out", "schema": schema, "strict": True}}
    assert translate_responses(request(text={"format": {"type": "json_object"}})).body["response_format"] == {
        "type": "json_object"}
    assert "response_format" not in translate_responses(request(text={"format": {"type": "text"}})).body


def test_it_reports_unknown_fields_unsupported_items_and_store_true() -> None:
    items = [{"role": "user", "content": "x"}, {"type": "web_search_call", "id": "ws_1", "action": {}}]
    result = translate_responses(request(input=items, store=True, background=True))
    assert set(result.dropped) == {"input[1] (web_search_call)", "store", "background"}


def test_it_refuses_item_references_it_cannot_resolve() -> None:
    with pytest.raises(TranslationError) as caught:
        translate_responses(request(input=[{"role": "user", "content": "x"}, {"type": "item_reference", "id": "m"}]))
    assert caught.value.param == "input[1]"


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x"}, "model"),
    (request(previous_response_id="resp_1"), "previous_response_id"),
    (request(conversation="conv_1"), "conversation"),
    (request(input=5), "input"),
    (request(input=[]), "input"),
    (request(input=[{"role": "tool", "content": "x"}]), "input[0].role"),
    (request(input=[{"role": "user", "content": 3}]), "input[0].content"),
    (request(input=[{"role": "user", "content": [{"type": "input_text"}]}]), "input[0].content[0].text"),
    (request(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]), "input[0].call_id"),
    (request(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]),
     "input[0].arguments"),
    (request(input=[{"type": "function_call_output", "call_id": "c", "output": 5}]), "input[0].output"),
    (request(instructions=5), "instructions"),
    (request(tools=[{"type": "function"}]), "tools[0].name"),
    (request(tools=[{"type": "function", "name": "f", "parameters": "x"}]), "tools[0].parameters"),
    (request(tools=[EXEC], tool_choice="sometimes"), "tool_choice"),
    (request(tools=[EXEC], tool_choice={"type": "function"}), "tool_choice.name"),
    (request(max_output_tokens=-1), "max_output_tokens"),
    (request(temperature="x"), "temperature"),
    (request(parallel_tool_calls="yes"), "parallel_tool_calls"),
    (request(reasoning={"effort": "huge"}), "reasoning.effort"),
    (request(text={"format": {"type": "yaml"}}), "text.format.type"),
    (request(stream=1), "stream"),
])
def test_it_refuses_malformed_requests_with_the_offending_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(TranslationError) as caught:
        translate_responses(body)
    assert caught.value.param == param


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3), max_leaves=12)
_item = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "other",
                             "custom_tool_call", "custom_tool_call_output", "local_shell_call",
                             "local_shell_call_output", "item_reference"]),
    "role": st.sampled_from(["user", "assistant", "developer", "system", "x"]),
    "content": _json, "call_id": _json, "name": _json, "arguments": _json, "output": _json, "summary": _json,
    "namespace": _json, "input": _json, "action": _json, "id": _json, "encrypted_content": _json})


@settings(max_examples=300, deadline=None)
@given(items=st.lists(_item, max_size=5), extra=st.dictionaries(
    st.sampled_from(["instructions", "tools", "tool_choice", "reasoning", "text", "parallel_tool_calls"]), _json,
    max_size=3))
def test_it_never_raises_anything_but_translation_error(items: list[Any], extra: dict[str, Any]) -> None:
    try:
        result = translate_responses(request(input=items, **extra))
    except TranslationError:
        return
    json.dumps(result.body)
