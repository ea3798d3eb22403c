"""Responses: custom (freeform) and local_shell tools, reasoning items, text formats, how a stream ends.

Translation is checked on the chat body; emission by openai-python's own event models and stream
state (``tests.proxy.guard.test_emit_responses``) and by the grammar written from PROTOCOLS.md 3.4
(``tests.protocol_grammar.responses_output``). A ``custom_tool_call`` / ``local_shell_call`` the
emitter produced, sent back as history the way Codex does, translates to the same call.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response

from proxy.guard.protocols.emit_responses import OpenAIResponsesEmitter
from proxy.guard.protocols.responses_tools import LOCAL_SHELL, LOCAL_SHELL_PARAMETERS, ClientTool
from proxy.guard.protocols.translate import TranslationError
from proxy.guard.protocols.translate_responses import translate_responses
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn, UpstreamError
from tests.protocol_grammar import assert_tool_pairing, responses_output
from tests.proxy.guard.test_emit_responses import events, final_response

GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF'
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
               "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR}}
EXEC = {"type": "function", "name": "exec_command", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hello \"world\"\n*** End Patch\n"
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def request(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": [{"role": "user", "content": "go"}], **fields}


def emit(translation: Any, turn: Turn, *texts: tuple[str, str], end: str = "close") -> bytes:
    em = OpenAIResponsesEmitter(model="m", request={}, response_id="resp_t", created_at=1,
                                tool_names=translation.tool_names)
    out = [em.open(), *(em.text(0, channel, text) for channel, text in texts)]  # type: ignore[arg-type]
    if end == "close":
        out.append(em.close(turn))
    elif end == "exhausted":
        out.append(em.close_exhausted("[toolrelay] gave up"))
    else:
        out.append(em.close_error(UpstreamError(502, "broke off")))
    return b"".join(out)


# -- custom (freeform) tools -----------------------------------------------------------------------


def test_it_declares_a_custom_tool_as_a_function_with_one_string_input() -> None:
    translation = translate_responses(request(tools=[APPLY_PATCH, EXEC]))
    function = translation.body["tools"][0]["function"]
    assert function["name"] == "apply_patch"
    assert function["parameters"]["properties"]["input"]["type"] == "string"
    assert function["parameters"]["required"] == ["input"] and function["parameters"]["additionalProperties"] is False
    assert function["description"].startswith("Edit files with a patch.") and GRAMMAR in function["description"]
    assert translation.tool_names == {"apply_patch": ClientTool(None, "apply_patch", "custom")}
    assert translation.dropped == ()


@pytest.mark.parametrize("fmt", [None, {"type": "text"}])
def test_it_declares_an_unconstrained_custom_tool(fmt: Any) -> None:
    tool: dict[str, Any] = {"type": "custom", "name": "note"}
    if fmt is not None:
        tool["format"] = fmt
    function = translate_responses(request(tools=[tool])).body["tools"][0]["function"]
    assert "description" not in function and function["parameters"]["required"] == ["input"]


def test_it_streams_a_custom_tool_call_with_the_raw_input() -> None:
    """openai-python ``ResponseCustomToolCall``; events ``response.custom_tool_call_input.delta/.done``."""
    translation = translate_responses(request(tools=[APPLY_PATCH]))
    arguments = json.dumps({"input": PATCH})
    data = emit(translation, Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("call_7", "apply_patch", arguments)],
                                                      finish_reason="tool_calls")], usage=USAGE),
                ("content", "Patching."))
    found = events(data)  # each validated against its openai-python event model
    kinds = [e["type"] for e in found]
    assert "response.custom_tool_call_input.delta" in kinds and "response.custom_tool_call_input.done" in kinds
    assert "response.function_call_arguments.delta" not in kinds
    done, terminal = responses_output(found)
    assert done[-1] == {"id": done[-1]["id"], "type": "custom_tool_call", "call_id": "call_7", "name": "apply_patch",
                        "input": PATCH, "status": "completed"}
    assert terminal["status"] == "completed"
    response = final_response(data)
    item = response.output[-1]
    assert (item.type, item.input, item.call_id) == ("custom_tool_call", PATCH, "call_7")  # type: ignore[union-attr]


def test_it_renders_a_custom_tool_call_in_a_non_stream_response() -> None:
    translation = translate_responses(request(tools=[APPLY_PATCH]))
    em = OpenAIResponsesEmitter(model="m", tool_names=translation.tool_names)
    body = em.complete(Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c", "apply_patch", json.dumps(
        {"input": PATCH}))], finish_reason="tool_calls")]))
    item = Response.model_validate(body).output[0]
    assert (item.type, item.input) == ("custom_tool_call", PATCH)  # type: ignore[union-attr]


def test_it_translates_custom_tool_calls_and_outputs_back_as_codex_sends_them() -> None:
    items = [{"role": "user", "content": "add a.txt"},
             {"type": "custom_tool_call", "call_id": "call_7", "name": "apply_patch", "input": PATCH},
             {"type": "custom_tool_call_output", "call_id": "call_7", "output": "Done!"}]
    body = translate_responses(request(input=items, tools=[APPLY_PATCH])).body
    assert body["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "apply_patch",
                                                              "arguments": json.dumps({"input": PATCH})}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "Done!"}]


def test_a_custom_tool_call_round_trips_through_the_emitter_and_the_translator() -> None:
    translation = translate_responses(request(tools=[APPLY_PATCH]))
    arguments = json.dumps({"input": PATCH})
    turn = Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("call_1", "apply_patch", arguments)])])
    item = final_response(emit(translation, turn)).output[0].model_dump(exclude_none=True)
    back = translate_responses(request(input=[{"role": "user", "content": "x"}, item,
                                              {"type": "custom_tool_call_output", "call_id": "call_1", "output": "ok"}],
                                       tools=[APPLY_PATCH])).body["messages"]
    assert back[1]["tool_calls"][0]["function"] == {"name": "apply_patch", "arguments": arguments}


def test_it_maps_a_forced_custom_tool_choice() -> None:
    body = translate_responses(request(tools=[APPLY_PATCH], tool_choice={"type": "custom", "name": "apply_patch"})).body
    assert body["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}


def test_it_refuses_a_custom_tool_format_it_does_not_know() -> None:
    with pytest.raises(TranslationError) as caught:
        translate_responses(request(tools=[{"type": "custom", "name": "x", "format": {"type": "regexish"}}]))
    assert caught.value.param == "tools[0].format.type"


# -- local_shell -----------------------------------------------------------------------------------


def test_it_declares_local_shell_and_streams_local_shell_call_items() -> None:
    translation = translate_responses(request(tools=[{"type": "local_shell"}]))
    assert translation.body["tools"] == [{"type": "function", "function": {
        "name": LOCAL_SHELL, "parameters": LOCAL_SHELL_PARAMETERS,
        "description": "Run a command on the user's machine and get its output."}}]
    arguments = json.dumps({"command": ["bash", "-lc", "ls"], "working_directory": "/work/repo", "timeout_ms": 5000})
    data = emit(translation, Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("call_s", LOCAL_SHELL, arguments)])]))
    done, _ = responses_output(events(data))
    assert done[0]["type"] == "local_shell_call" and done[0]["call_id"] == "call_s"
    assert done[0]["action"] == {"type": "exec", "command": ["bash", "-lc", "ls"], "env": {},
                                 "working_directory": "/work/repo", "timeout_ms": 5000, "user": None}
    item = final_response(data).output[0]
    assert item.type == "local_shell_call" and item.action.command == ["bash", "-lc", "ls"]  # type: ignore[union-attr]


@pytest.mark.parametrize("output", [
    {"type": "local_shell_call_output", "id": "lsh_1", "output": '{"stdout":"a.txt"}'},
    {"type": "local_shell_call_output", "id": "call_s", "output": '{"stdout":"a.txt"}'},
    {"type": "function_call_output", "call_id": "call_s", "output": '{"stdout":"a.txt"}'},
])
def test_it_translates_local_shell_calls_and_their_outputs(output: dict[str, Any]) -> None:
    items = [{"role": "user", "content": "list"},
             {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_s", "status": "completed",
              "action": {"type": "exec", "command": ["ls"], "env": {}, "timeout_ms": None}},
             output]
    messages = translate_responses(request(input=items, tools=[{"type": "local_shell"}])).body["messages"]
    assert messages[1]["tool_calls"] == [{"id": "call_s", "type": "function", "function": {
        "name": LOCAL_SHELL, "arguments": json.dumps({"command": ["ls"], "env": {}})}}]
    assert messages[2] == {"role": "tool", "tool_call_id": "call_s", "content": '{"stdout":"a.txt"}'}


# -- reasoning items, outputs with media, text formats, limits ------------------------------------


def test_it_carries_reasoning_summaries_and_reports_encrypted_content_without_refusing() -> None:
    """What Codex sends back every turn (``include: ["reasoning.encrypted_content"]``, PROTOCOLS.md 3.3)."""
    items = [{"role": "user", "content": "ls"},
             {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "List files."}],
              "encrypted_content": "gAAAAB..."},
             {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd":"ls"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
             {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAAAC..."},
             {"role": "user", "content": "thanks"}]
    result = translate_responses(request(input=items, tools=[EXEC], include=["reasoning.encrypted_content"]))
    assistant = result.body["messages"][1]
    assert assistant["reasoning_content"] == "List files." and assistant["tool_calls"][0]["id"] == "c1"
    assert set(result.dropped) == {"input[1].encrypted_content", "input[4].encrypted_content"}


def test_it_reports_reasoning_that_no_assistant_output_follows() -> None:
    items = [{"role": "user", "content": "a"},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
             {"role": "user", "content": "b"}]
    result = translate_responses(request(input=items))
    assert [m["role"] for m in result.body["messages"]] == ["user", "user"]
    assert result.dropped == ("input[1] (reasoning no assistant output follows)",)


def test_it_carries_images_of_a_function_call_output_after_the_tool_message() -> None:
    items = [{"role": "user", "content": "look"},
             {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": [
                 {"type": "input_text", "text": "here"},
                 {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]
    messages = translate_responses(request(input=items)).body["messages"]
    assert messages[2] == {"role": "tool", "tool_call_id": "c1",
                           "content": "here\n\n[attachment 1: image_url] (sent after the tool results)"}
    assert messages[3]["role"] == "user" and messages[3]["content"][1] == {
        "type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


@pytest.mark.parametrize(("text", "expected", "dropped"), [
    ({"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}},
     {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True}}, ()),
    ({"format": {"type": "json_object"}}, {"type": "json_object"}, ()),
    ({"format": {"type": "text"}, "verbosity": "low"}, None, ("text.verbosity",)),
])
def test_it_maps_text_format_and_reports_verbosity(text: dict[str, Any], expected: Any, dropped: tuple[str, ...]
                                                   ) -> None:
    result = translate_responses(request(text=text))
    assert result.body.get("response_format") == expected and result.dropped == dropped


def test_it_maps_max_output_tokens_and_parallel_tool_calls() -> None:
    body = translate_responses(request(tools=[EXEC], max_output_tokens=2048, parallel_tool_calls=False)).body
    assert (body["max_tokens"], body["parallel_tool_calls"]) == (2048, False)


# -- how a stream ends: completed, incomplete with its reason, failed ----------------------------

_text = st.tuples(st.sampled_from(["content", "reasoning", "refusal"]), st.text(min_size=1, max_size=6))
_kind = st.sampled_from(["exec_command", "apply_patch", LOCAL_SHELL])


def _call(kind: str, k: int) -> ToolCall:
    arguments = {"exec_command": {"cmd": str(k)}, "apply_patch": {"input": f"patch {k}\n"},
                 LOCAL_SHELL: {"command": ["echo", str(k)]}}[kind]
    return ToolCall(f"call_{k}", kind, json.dumps(arguments))


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(_text, max_size=8), kinds=st.lists(_kind, max_size=3),
       finish=st.sampled_from(["stop", "tool_calls", "length", "content_filter", None]),
       end=st.sampled_from(["close", "close", "exhausted", "error"]))
def test_every_stream_obeys_the_grammar_and_ends_as_the_turn_did(texts: list[tuple[str, str]], kinds: list[str],
                                                                 finish: str | None, end: str) -> None:
    translation = translate_responses(request(tools=[EXEC, APPLY_PATCH, {"type": "local_shell"}]))
    calls = [_call(kind, k) for k, kind in enumerate(kinds)]
    data = emit(translation, Turn(choices=[ChoiceTurn(tool_calls=calls, finish_reason=finish)], usage=USAGE),
                *texts, end=end)
    found = events(data)
    done, terminal = responses_output(found)
    expected = {"error": "response.failed", "exhausted": "response.completed"}.get(end) or (
        "response.incomplete" if finish in ("length", "content_filter") else "response.completed")
    assert found[-1]["type"] == expected
    assert sum(e["type"] in ("response.completed", "response.incomplete", "response.failed") for e in found) == 1
    if end == "close":
        types = {"exec_command": "function_call", "apply_patch": "custom_tool_call", LOCAL_SHELL: "local_shell_call"}
        assert [i["type"] for i in done if i["type"].endswith("call")] == [types[k] for k in kinds]
        if finish in ("length", "content_filter"):
            reason = "max_output_tokens" if finish == "length" else "content_filter"
            assert terminal["incomplete_details"] == {"reason": reason}


_ids = st.sampled_from(["a", "b", "c"])
_item = st.one_of(
    st.builds(lambda i: {"type": "function_call", "call_id": i, "name": "exec_command", "arguments": "{}"}, _ids),
    st.builds(lambda i: {"type": "custom_tool_call", "call_id": i, "name": "apply_patch", "input": "p"}, _ids),
    st.builds(lambda i: {"type": "local_shell_call", "call_id": i, "id": f"lsh_{i}",
                         "action": {"type": "exec", "command": ["ls"]}}, _ids),
    st.builds(lambda i: {"type": "function_call_output", "call_id": i, "output": "o"}, _ids),
    st.builds(lambda i: {"type": "custom_tool_call_output", "call_id": i, "output": [
        {"type": "input_text", "text": "t"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]}, _ids),
    st.builds(lambda i: {"type": "local_shell_call_output", "id": f"lsh_{i}", "output": "{}"}, _ids),
    st.just({"type": "reasoning", "summary": [{"type": "summary_text", "text": "r"}], "encrypted_content": "x"}),
    st.just({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]}),
    st.just({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]}),
    st.just({"role": "user", "content": "u"}),
)


@settings(max_examples=300, deadline=None)
@given(items=st.lists(_item, max_size=8))
def test_any_codex_history_becomes_a_chat_history_upstreams_accept(items: list[dict[str, Any]]) -> None:
    body = translate_responses(request(input=[{"role": "user", "content": "go"}, *items],
                                       tools=[EXEC, APPLY_PATCH, {"type": "local_shell"}])).body
    assert_tool_pairing(body["messages"])


def test_it_carries_an_output_without_call_id_as_user_text_instead_of_refusing() -> None:
    """Codex 0.171.0 sends this after ``create_goal`` (captured through the proxy, docs/clients.md)."""
    items = [{"role": "user", "content": "go"},
             {"type": "function_call", "call_id": "c1", "name": "create_goal", "arguments": '{"objective":"x"}'},
             {"type": "function_call_output", "call_id": "c1", "output": '{"goal":{}}'},
             {"type": "function_call_output", "id": "fco_1", "name": "goal_objective", "namespace": "agent",
              "output": "bravo module alpha"}]
    result = translate_responses(request(input=items))
    assert result.body["messages"][3] == {"role": "user",
                                          "content": "[agent.goal_objective output]\nbravo module alpha"}
    assert result.dropped == ("input[3] (function_call_output without call_id, sent as user text)",)
    assert_tool_pairing(result.body["messages"])


_junk = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner,
                                                                                 max_size=2), max_leaves=6)
_kinds = st.sampled_from(["function", "custom", "local_shell", "namespace", "web_search"])
_tool = st.fixed_dictionaries({"type": _kinds},
                              optional={"name": st.one_of(st.sampled_from(["apply_patch", "x"]), _junk),
                                        "format": st.one_of(st.just({"type": "grammar", "definition": "d"}), _junk),
                                        "description": _junk, "parameters": _junk, "tools": _junk})


@settings(max_examples=300, deadline=None)
@given(tools=st.lists(_tool, max_size=4), choice=st.one_of(_junk, st.just({"type": "custom", "name": "apply_patch"})))
def test_any_tool_declaration_translates_or_is_refused_with_a_param(tools: list[Any], choice: Any) -> None:
    try:
        result = translate_responses(request(tools=tools, tool_choice=choice))
    except TranslationError as exc:
        assert exc.param
        return
    json.dumps(result.body)
    assert all(t["type"] == "function" for t in result.body.get("tools", []))


def test_it_still_refuses_an_output_with_neither_call_id_nor_name() -> None:
    with pytest.raises(TranslationError) as caught:
        translate_responses(request(input=[{"type": "function_call_output", "output": "x"}]))
    assert caught.value.param == "input[0].call_id"
