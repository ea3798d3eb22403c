"""Anthropic Messages request -> chat.completions request (PROTOCOLS.md 2.1, 2.6, 2.8, 4.3).

Request shapes follow anthropic-python's ``MessageCreateParams`` and what Claude Code 2.1.332 was
seen to send (PROTOCOLS.md 4.3); the expected chat shapes follow 1.1 and 2.6.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.protocols.tool_history import MISSING_RESULT
from proxy.guard.protocols.translate import TranslationError, upstream_tool_name
from proxy.guard.protocols.translate_anthropic import count_tokens_body, translate_messages
from tests.protocol_grammar import assert_tool_pairing

WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def request(**fields: Any) -> dict[str, Any]:
    """A minimal valid request with ``fields`` merged in."""
    return {"model": "my-model", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}], **fields}


def test_it_maps_a_string_system_to_the_first_system_message() -> None:
    body = translate_messages(request(system="Be brief.")).body
    assert body["messages"][:2] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_it_drops_claude_codes_billing_header_block_and_joins_the_other_system_blocks() -> None:
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332; cc_entrypoint=sdk-cli;"},
              {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Use tools."}]
    result = translate_messages(request(system=system))
    assert result.body["messages"][0] == {"role": "system", "content": "You are Claude Code.\n\nUse tools."}
    assert result.dropped == ()


def test_it_keeps_system_blocks_without_the_billing_header() -> None:
    body = translate_messages(request(system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}])).body
    assert body["messages"][0] == {"role": "system", "content": "A\n\nB"}


def test_it_maps_mid_conversation_system_messages_at_their_position() -> None:
    """Claude Code sends ``role: "system"`` inside ``messages`` (PROTOCOLS.md section 0 item 13)."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                             {"type": "text", "text": "fix the bug"}]},
                {"role": "system", "content": [{"type": "text", "text": "Mode: plan"}]},
                {"role": "assistant", "content": "ok"},
                {"role": "system", "content": "Be careful"},
                {"role": "user", "content": "go"}]
    body = translate_messages(request(messages=messages)).body
    assert body["messages"] == [
        {"role": "user", "content": "<system-reminder>x</system-reminder>\n\nfix the bug"},
        {"role": "system", "content": "Mode: plan"},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "Be careful"},
        {"role": "user", "content": "go"},
    ]


def test_it_maps_images_to_image_url_parts() -> None:
    content = [{"type": "text", "text": "what is this?"},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
               {"type": "image", "source": {"type": "url", "url": "https://example.org/a.jpg"}}]
    body = translate_messages(request(messages=[{"role": "user", "content": content}])).body
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.org/a.jpg"}},
    ]}]


def test_it_emits_tool_results_as_tool_messages_before_the_users_text() -> None:
    messages = [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "<tool_use_error>down</tool_use_error>"}],
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "thanks"},
        ]},
    ]
    body = translate_messages(request(messages=messages, tools=[WEATHER])).body
    assert body["messages"][1:] == [
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "toolu_2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
        ]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "<tool_use_error>down</tool_use_error>"},
        {"role": "user", "content": "thanks"},
    ]


def test_it_sends_a_tool_only_assistant_message_with_null_content() -> None:
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                   "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]
    body = translate_messages(request(messages=messages, tools=[WEATHER])).body
    assert body["messages"][1]["content"] is None
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "t1", "content": ""}


def test_it_echoes_thinking_blocks_back_as_reasoning_content() -> None:
    """DeepSeek thinking mode needs ``reasoning_content`` back on tool-call turns (PROTOCOLS.md 2.8)."""
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "The user wants ", "signature": "trly1abc"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]
    result = translate_messages(request(messages=messages, tools=[WEATHER]))
    assistant = result.body["messages"][1]
    assert assistant["reasoning_content"] == "The user wants "
    assert assistant["tool_calls"][0]["id"] == "t1"
    assert result.dropped == ("messages[1].content[1] (redacted_thinking)",)


def test_it_declares_custom_tools_as_functions_and_drops_server_tools_and_placeholders() -> None:
    tools = [WEATHER,
             {"type": "custom", "name": "Read", "input_schema": {"type": "object", "properties": {}}},
             {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
             {"name": "DeferredToolPlaceholder", "input_schema": {"type": "object"}, "defer_loading": True}]
    result = translate_messages(request(tools=tools))
    assert result.body["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                          "parameters": WEATHER["input_schema"]}},
        {"type": "function", "function": {"name": "Read", "parameters": {"type": "object", "properties": {}}}},
    ]
    assert result.dropped == ("tools[2] (web_search_20250305)", "tools[3] (defer_loading DeferredToolPlaceholder)")


def test_it_shortens_long_tool_names_everywhere_and_maps_them_back() -> None:
    long_name = "mcp__a_very_long_server_name_for_testing__and_an_even_longer_tool_name_that_goes_on"
    assert len(long_name) > 64
    short = upstream_tool_name(long_name)
    assert len(short) == 64
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": long_name, "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]
    result = translate_messages(request(messages=messages, tools=[{**WEATHER, "name": long_name}],
                                        tool_choice={"type": "tool", "name": long_name}))
    assert result.body["tools"][0]["function"]["name"] == short
    assert result.body["messages"][1]["tool_calls"][0]["function"]["name"] == short
    assert result.body["tool_choice"] == {"type": "function", "function": {"name": short}}
    assert result.tool_names == {short: long_name}


@pytest.mark.parametrize(("choice", "expected", "parallel"), [
    ({"type": "auto"}, "auto", None),
    ({"type": "any"}, "required", None),
    ({"type": "none"}, "none", None),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}, None),
    ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
    ({"type": "any", "disable_parallel_tool_use": False}, "required", None),
])
def test_it_maps_tool_choice(choice: dict[str, Any], expected: Any, parallel: bool | None) -> None:
    body = translate_messages(request(tools=[WEATHER], tool_choice=choice)).body
    assert body["tool_choice"] == expected
    assert body.get("parallel_tool_calls") is parallel


def test_it_omits_tool_choice_when_no_tool_is_left() -> None:
    """OpenAI refuses ``tool_choice`` without ``tools``; a tool-less request also stays unguarded-free of tools."""
    body = translate_messages(request(tools=[], tool_choice={"type": "auto"})).body
    assert "tools" not in body and "tool_choice" not in body


def test_it_maps_generation_parameters() -> None:
    result = translate_messages(request(max_tokens=32000, stop_sequences=["a", "b", "c", "d", "e"], temperature=0.2,
                                        top_p=0.9, top_k=40))
    body = result.body
    assert (body["max_tokens"], body["stop"], body["temperature"], body["top_p"]) == (32000, ["a", "b", "c", "d"],
                                                                                       0.2, 0.9)
    assert "top_k" not in body
    assert set(result.dropped) == {"stop_sequences[4:]", "top_k"}


def test_it_asks_for_usage_when_streaming_and_only_then() -> None:
    streamed = translate_messages(request(stream=True)).body
    assert streamed["stream"] is True and streamed["stream_options"] == {"include_usage": True}
    plain = translate_messages(request(stream=False)).body
    assert "stream" not in plain and "stream_options" not in plain


@pytest.mark.parametrize(("thinking", "config", "effort"), [
    ({"type": "enabled", "budget_tokens": 1024}, None, "low"),
    ({"type": "enabled", "budget_tokens": 8000}, None, "medium"),
    ({"type": "enabled", "budget_tokens": 31999}, None, "high"),
    ({"type": "enabled", "budget_tokens": 1024}, {"effort": "high"}, "high"),
    ({"type": "adaptive", "display": "updates"}, {"effort": "medium"}, None),
    ({"type": "disabled"}, None, None),
])
def test_it_maps_enabled_thinking_to_reasoning_effort(thinking: dict[str, Any], config: Any, effort: str | None
                                                      ) -> None:
    fields: dict[str, Any] = {"thinking": thinking}
    if config is not None:
        fields["output_config"] = config
    assert translate_messages(request(**fields)).body.get("reasoning_effort") == effort


def test_it_maps_structured_output_to_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = translate_messages(request(output_config={"format": {"type": "json_schema", "schema": schema}})).body
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": schema, "strict": True}}


def test_it_reports_unknown_fields_and_ignores_caching_and_transport_hints() -> None:
    result = translate_messages(request(metadata={"user_id": "{}"}, cache_control={"type": "ephemeral"},
                                        context_management={"edits": []}, service_tier="auto", mcp_servers=[],
                                        surprise=1))
    assert set(result.dropped) == {"mcp_servers", "surprise"}
    assert set(result.body) == {"model", "messages", "max_tokens"}


def test_it_translates_a_claude_code_request() -> None:
    """The request shape Claude Code 2.1.332 sends (PROTOCOLS.md 4.3)."""
    body = {
        "model": "my-model", "max_tokens": 32000, "stream": True,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332; cc_entrypoint=sdk-cli;"},
                   {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>r</system-reminder>"},
                                                  {"type": "text", "text": "list files",
                                                   "cache_control": {"type": "ephemeral"}}]},
                     {"role": "system", "content": "mid-conversation context"}],
        "tools": [{"name": "Bash", "description": "Run",
                   "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
                  {"name": "DeferredToolPlaceholder", "input_schema": {"type": "object"}, "defer_loading": True}],
        "thinking": {"type": "adaptive", "display": "updates"}, "output_config": {"effort": "medium"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": json.dumps({"device_id": "d"})},
    }
    result = translate_messages(body)
    assert [m["role"] for m in result.body["messages"]] == ["system", "user", "system"]
    assert [t["function"]["name"] for t in result.body["tools"]] == ["Bash"]
    assert result.body["stream_options"] == {"include_usage": True}
    assert result.dropped == ("tools[1] (defer_loading DeferredToolPlaceholder)",)


def test_it_counts_tokens_over_a_request_without_max_tokens() -> None:
    body = count_tokens_body({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]})
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["tools"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize(("body", "param"), [
    ({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}, "model"),
    (request(model=""), "model"),
    (request(max_tokens=None), "max_tokens"),
    (request(max_tokens=0), "max_tokens"),
    (request(max_tokens=True), "max_tokens"),
    (request(messages="hi"), "messages"),
    (request(messages=[]), "messages"),
    (request(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
    (request(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (request(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages[0].content[0].text"),
    (request(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "nope"}}]}]),
     "messages[0].content[0].source.type"),
    (request(messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "b",
                                                          "input": "[]"}]}]), "messages[0].content[0].input"),
    (request(messages=[{"role": "user", "content": [{"type": "tool_result"}]}]),
     "messages[0].content[0].tool_use_id"),
    (request(system=5), "system"),
    (request(system=[{"type": "image"}]), "system[0].type"),
    (request(tools=[{"input_schema": {}}]), "tools[0].name"),
    (request(tools=[{"name": "a", "input_schema": []}]), "tools[0].input_schema"),
    (request(tools="x"), "tools"),
    (request(tools=[WEATHER], tool_choice={"type": "some"}), "tool_choice.type"),
    (request(tools=[WEATHER], tool_choice={"type": "tool"}), "tool_choice.name"),
    (request(temperature="hot"), "temperature"),
    (request(stop_sequences="STOP"), "stop_sequences"),
    (request(stream="yes"), "stream"),
    (request(thinking={"type": "sometimes"}), "thinking.type"),
])
def test_it_refuses_malformed_requests_with_the_offending_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(TranslationError) as caught:
        translate_messages(body)
    assert caught.value.param == param
    assert caught.value.message


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3), max_leaves=12)
_block = st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking",
                                                         "document", "other"])},
                               optional={"text": _json, "source": _json, "id": _json, "name": _json, "input": _json,
                                         "tool_use_id": _json, "content": _json, "thinking": _json})
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "x"]),
                                  "content": st.one_of(st.text(max_size=5), st.lists(_block, max_size=3), _json)})


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(_message, max_size=4), extra=st.dictionaries(
    st.sampled_from(["system", "tools", "tool_choice", "stop_sequences", "thinking", "temperature", "output_config"]),
    _json, max_size=3))
def test_it_never_raises_anything_but_translation_error(messages: list[Any], extra: dict[str, Any]) -> None:
    try:
        result = translate_messages(request(messages=messages, **extra))
    except TranslationError:
        return
    json.dumps(result.body)


# -- tool results: one string per tool_use_id, right after its assistant message (issue 13) -----------

PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def _tool_turn(content: Any, **extra: Any) -> dict[str, Any]:
    """A request whose last user message answers one Read call with a tool_result of ``content``."""
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": "toolu_1", **extra}
    if content is not _ABSENT:
        result["content"] = content
    return request(tools=[WEATHER], messages=[
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "x"}}]},
        {"role": "user", "content": [result]}])


_ABSENT: Any = object()


@pytest.mark.parametrize(("content", "text"), [
    ("18 C", "18 C"),
    (_ABSENT, ""),
    (None, ""),
    ([], ""),
    ([{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}], "a\n\nb"),
    ([{"type": "tool_reference", "tool_name": "mcp__db__q"}], '{"type":"tool_reference","tool_name":"mcp__db__q"}'),
    ([{"type": "text", "text": "found:"}, {"type": "search_result", "source": "s", "title": "t", "content": []}],
     'found:\n\n{"type":"search_result","source":"s","title":"t","content":[]}'),
    ([{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc body"},
       "title": "README"}], "README\n\ndoc body"),
    ([{"type": "mystery", "x": [1, "é"]}], '{"type":"mystery","x":[1,"é"]}'),
])
def test_it_sends_every_tool_result_content_shape_as_one_string(content: Any, text: str) -> None:
    messages = translate_messages(_tool_turn(content)).body["messages"]
    assert messages[1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "x"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": text}]


def test_it_carries_tool_result_images_in_a_user_message_after_the_tool_messages() -> None:
    """A chat ``tool`` message holds text only: the image is named there and sent right after."""
    messages = translate_messages(_tool_turn([{"type": "text", "text": "screenshot:"}, PNG])).body["messages"]
    tool, user = messages[2], messages[3]
    assert tool == {"role": "tool", "tool_call_id": "toolu_1",
                    "content": "screenshot:\n\n[attachment 1: image] (sent after the tool results)"}
    assert user == {"role": "user", "content": [
        {"type": "text", "text": "[attachment 1: image] from the result of tool call toolu_1:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}


def test_it_keeps_the_users_own_text_after_attachments_of_the_same_message() -> None:
    body = _tool_turn([PNG])
    body["messages"][-1]["content"].append({"type": "text", "text": "what do you see?"})
    user = translate_messages(body).body["messages"][-1]
    assert [p["type"] for p in user["content"]] == ["text", "image_url", "text"]
    assert user["content"][-1] == {"type": "text", "text": "what do you see?"}


def test_it_refuses_a_tool_result_content_that_is_neither_string_nor_list() -> None:
    with pytest.raises(TranslationError) as caught:
        translate_messages(_tool_turn({"type": "text", "text": "x"}))
    assert caught.value.param == "messages[2].content[0].content"


def test_it_moves_a_system_message_between_a_call_and_its_result_after_the_tool_messages() -> None:
    """Claude Code puts ``role: "system"`` messages anywhere (section 0 item 13)."""
    body = _tool_turn("ok")
    body["messages"].insert(2, {"role": "system", "content": "reminder"})
    roles = [(m["role"], m.get("tool_call_id")) for m in translate_messages(body).body["messages"]]
    assert roles == [("user", None), ("assistant", None), ("tool", "toolu_1"), ("system", None)]


def test_it_merges_consecutive_assistant_messages_so_reasoning_sits_on_the_tool_call_turn() -> None:
    """DeepSeek thinking mode wants ``reasoning_content`` on the message with the tool calls (2.8)."""
    body = request(tools=[WEATHER], messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan", "signature": "trly1x"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}])
    messages = translate_messages(body).body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert (messages[1]["content"], messages[1]["reasoning_content"]) == ("Checking.", "plan")
    assert messages[1]["tool_calls"][0]["id"] == "t1"


def test_it_answers_a_call_without_result_and_reports_a_result_without_call() -> None:
    body = request(tools=[WEATHER], messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}},
                                          {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "b"},
                                     {"type": "tool_result", "tool_use_id": "t9", "content": "stray"}]}])
    result = translate_messages(body)
    assert result.body["messages"][2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": MISSING_RESULT},
        {"role": "tool", "tool_call_id": "t2", "content": "b"},
        {"role": "user", "content": "[result of tool call t9]\nstray"}]
    assert any("t1" in d for d in result.dropped) and any("t9" in d for d in result.dropped)


_ids = st.sampled_from(["a", "b", "c"])
_result = st.builds(lambda i, c: {"type": "tool_result", "tool_use_id": i, "content": c}, _ids,
                    st.one_of(st.text(max_size=3), st.just([]), st.just([{"type": "text", "text": "t"}]),
                              st.just([PNG]), st.just([{"type": "tool_reference", "tool_name": "x"}])))
_user_block = st.one_of(_result, _result, st.just({"type": "text", "text": "u"}), st.just(PNG))
_turn = st.one_of(
    st.builds(lambda ids: {"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": "get_weather",
                                                             "input": {}} for i in ids]},
              st.lists(_ids, min_size=1, max_size=3, unique=True)),
    st.just({"role": "assistant", "content": "text only"}),
    st.builds(lambda blocks: {"role": "user", "content": blocks}, st.lists(_user_block, min_size=1, max_size=4)),
    st.just({"role": "system", "content": "sys"}),
)


@settings(max_examples=300, deadline=None)
@given(turns=st.lists(_turn, min_size=1, max_size=7))
def test_every_call_is_followed_at_once_by_exactly_one_string_tool_message_per_id(turns: list[Any]) -> None:
    """Whatever the order of results, system messages, duplicates and gaps (issue 13 item 2)."""
    messages = translate_messages(request(tools=[WEATHER], messages=[{"role": "user", "content": "go"}, *turns]
                                          )).body["messages"]
    assert_tool_pairing(messages)


# -- documents and images: carried or refused, never dropped in silence ----------------------------


def _user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return request(messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, *blocks]}])


def test_it_carries_a_base64_pdf_as_an_openai_file_part() -> None:
    pdf = {"type": "document", "title": "spec.pdf",
           "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}}
    content = translate_messages(_user(pdf)).body["messages"][0]["content"]
    assert content[1] == {"type": "file", "file": {"filename": "spec.pdf",
                                                  "file_data": "data:application/pdf;base64,JVBERi0x"}}


def test_it_carries_text_and_content_documents_as_text() -> None:
    docs = [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain"},
             "context": "from the wiki"},
            {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "part"}, PNG]}}]
    content = translate_messages(_user(*docs)).body["messages"][0]["content"]
    assert content[1:] == [{"type": "text", "text": "from the wiki\n\nplain"}, {"type": "text", "text": "part"},
                           {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]


@pytest.mark.parametrize("block", [
    {"type": "document", "source": {"type": "url", "url": "https://example.org/a.pdf"}},
    {"type": "document", "source": {"type": "file", "file_id": "file_1"}},
    {"type": "document", "source": {"type": "base64", "media_type": "text/csv", "data": "YSxi"}},
    {"type": "image", "source": {"type": "file", "file_id": "file_2"}},
])
def test_it_refuses_blocks_a_chat_upstream_cannot_be_given_naming_the_block(block: dict[str, Any]) -> None:
    with pytest.raises(TranslationError) as caught:
        translate_messages(_user(block))
    assert caught.value.param == "messages[0].content[1]"
    assert "messages[0].content[1]" in caught.value.message and "cannot be carried" in caught.value.message


def test_it_refuses_an_uncarriable_image_inside_a_tool_result() -> None:
    with pytest.raises(TranslationError) as caught:
        translate_messages(_tool_turn([{"type": "image", "source": {"type": "file", "file_id": "f"}}]))
    assert caught.value.param == "messages[2].content[0].content[0]"


def test_it_serialises_unknown_user_blocks_instead_of_dropping_them() -> None:
    result = translate_messages(_user({"type": "container_upload", "file_id": "f", "cache_control": {"x": 1}}))
    assert result.body["messages"][0]["content"] == 'see\n\n{"type":"container_upload","file_id":"f"}'
    assert result.dropped == ()


# -- tools: server tools left out and reported, tool_choice and parallel calls ------------------------

SERVER_TOOLS = [
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    {"type": "web_fetch_20250910", "name": "web_fetch"},
    {"type": "code_execution_20250825", "name": "code_execution"},
    {"type": "bash_20250124", "name": "bash"},
    {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    {"type": "computer_20250124", "name": "computer", "display_width_px": 1024, "display_height_px": 768},
    {"type": "memory_20250818", "name": "memory"},
    {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"},
]


@pytest.mark.parametrize("server_tool", SERVER_TOOLS, ids=[t["type"] for t in SERVER_TOOLS])
def test_it_leaves_server_tools_out_and_reports_them(server_tool: dict[str, Any]) -> None:
    result = translate_messages(request(tools=[server_tool, WEATHER]))
    assert [t["function"]["name"] for t in result.body["tools"]] == ["get_weather"]
    assert result.dropped == (f"tools[0] ({server_tool['type']})",)


def test_it_refuses_a_tool_choice_that_names_a_server_tool() -> None:
    with pytest.raises(TranslationError) as caught:
        translate_messages(request(tools=[SERVER_TOOLS[0], WEATHER],
                                   tool_choice={"type": "tool", "name": "web_search"}))
    assert caught.value.param == "tool_choice.name" and "web_search" in caught.value.message


def test_it_reports_a_tool_choice_left_without_tools() -> None:
    result = translate_messages(request(tools=[SERVER_TOOLS[0]], tool_choice={"type": "any"}))
    assert "tools" not in result.body and "tool_choice" not in result.body
    assert result.dropped == ("tools[0] (web_search_20250305)", "tool_choice (no tool left to choose)")


@pytest.mark.parametrize(("choice", "expected", "parallel"), [
    ({"type": "none", "disable_parallel_tool_use": True}, "none", None),
    ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
     {"type": "function", "function": {"name": "get_weather"}}, False),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
])
def test_it_maps_disable_parallel_tool_use_with_each_tool_choice(choice: dict[str, Any], expected: Any,
                                                                 parallel: bool | None) -> None:
    body = translate_messages(request(tools=[WEATHER], tool_choice=choice)).body
    assert (body["tool_choice"], body.get("parallel_tool_calls")) == (expected, parallel)


def test_it_declares_a_deferred_tool_once_a_tool_reference_loaded_it() -> None:
    """Claude Code's ToolSearch answers with ``tool_reference`` blocks; the Anthropic API then exposes
    the deferred tool, so the chat upstream must see it declared."""
    deferred = {"name": "mcp__db__query", "input_schema": {"type": "object"}, "defer_loading": True}
    body = _tool_turn([{"type": "tool_reference", "tool_name": "mcp__db__query"}])
    body["tools"] = [WEATHER, deferred, {**deferred, "name": "mcp__db__other"}]
    result = translate_messages(body)
    assert [t["function"]["name"] for t in result.body["tools"]] == ["get_weather", "mcp__db__query"]
    assert result.dropped == ("tools[2] (defer_loading mcp__db__other)",)
