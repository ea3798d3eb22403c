"""The OpenAI Responses emitter, checked by openai-python itself.

Every event is validated strictly as its ``ResponseStreamEvent`` member model, and whole
streams are read by the SDK's own client (``responses.stream`` over an ``httpx2.MockTransport``,
the SDK's HTTP layer), whose ``ResponseStreamState`` checks item identities and builds the final
Response. PROTOCOLS.md section 0 item 3 and 3.4 are asserted on the events.
"""

from __future__ import annotations

import json
from typing import Any, get_args

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder  # the SDK's decoder (private, but the one clients run)
from openai.types.responses import Response, ResponseStreamEvent

from proxy.guard.events import Channel
from proxy.guard.protocols.emit_responses import ARGUMENT_SLICE, OpenAIResponsesEmitter
from proxy.guard.protocols.translate_responses import translate_responses
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn, UpstreamError

#: Event type -> its openai-python model (the union is not discriminated for pydantic, so errors
#: against the whole union are unreadable; each event is validated against its own model).
EVENTS: dict[str, Any] = {get_args(m.model_fields["type"].annotation)[0]: m
                          for m in get_args(get_args(ResponseStreamEvent)[0])}
USAGE = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150,
         "prompt_tokens_details": {"cached_tokens": 20}, "completion_tokens_details": {"reasoning_tokens": 7}}
EXEC = {"type": "function", "name": "exec_command", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
REQUEST = {"model": "my-model", "input": "hi", "tools": [EXEC], "parallel_tool_calls": True}


def emitter(**kwargs: Any) -> OpenAIResponsesEmitter:
    return OpenAIResponsesEmitter(model="my-model", request=kwargs.pop("request", REQUEST), response_id="resp_test",
                                  created_at=1700000000, **kwargs)


def pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream(em: OpenAIResponsesEmitter, turn: Turn, size: int = 3) -> bytes:
    out = [em.open()]
    choice = turn.choices[0] if turn.choices else ChoiceTurn()
    for channel, text in (("reasoning", choice.reasoning), ("content", choice.content)):
        out += [em.text(0, channel, p) for p in pieces(text or "", size)]  # type: ignore[arg-type]
    out.append(em.close(turn))
    return b"".join(out)


def events(data: bytes) -> list[dict[str, Any]]:
    """Every event's data, decoded by openai-python and validated as a ``ResponseStreamEvent``."""
    out = []
    for sse in SSEDecoder().iter_bytes(iter([data])):
        event = json.loads(sse.data)
        assert sse.event == event["type"]
        EVENTS[event["type"]].model_validate(event)
        out.append(event)
    return out


def sdk_client(body: bytes, status: int = 200, content_type: str = "text/event-stream") -> openai.OpenAI:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers={"content-type": content_type}, content=body)

    return openai.OpenAI(api_key="k", base_url="http://proxy.test/v1", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def final_response(data: bytes) -> Response:
    """The Response openai-python's ``responses.stream`` builds from ``data``."""
    with sdk_client(data) as client, client.responses.stream(model="my-model", input="hi") as s:
        for _ in s:
            pass
        return s.get_final_response()


def full_turn() -> Turn:
    return Turn(choices=[ChoiceTurn(
        reasoning="Two commands.", content="Running both.",
        tool_calls=[ToolCall("call_1", "exec_command", '{"cmd":"ls"}'),
                    ToolCall("call_2", "exec_command", '{"cmd":"pwd"}')],
        finish_reason="tool_calls")], usage=USAGE)


def test_it_streams_a_turn_the_sdk_completes_with_the_same_items() -> None:
    response = final_response(stream(emitter(), full_turn()))
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call", "function_call"]
    reasoning, message, first, second = response.output
    assert reasoning.content[0].text == "Two commands."  # type: ignore[union-attr,index]
    assert message.content[0].text == "Running both."  # type: ignore[union-attr,union-attr]
    assert (first.call_id, first.name, json.loads(first.arguments)) == ("call_1", "exec_command",  # type: ignore[union-attr]
                                                                        {"cmd": "ls"})
    assert json.loads(second.arguments) == {"cmd": "pwd"}  # type: ignore[union-attr]
    assert (response.id, response.status, response.output_text) == ("resp_test", "completed", "Running both.")
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (120, 30, 150)
    assert response.usage.input_tokens_details.cached_tokens == 20
    assert response.usage.output_tokens_details.reasoning_tokens == 7


def test_it_numbers_events_and_ends_with_response_completed_carrying_id_output_and_usage() -> None:
    """PROTOCOLS.md section 0 item 3: ``response.completed`` with ``response.id``; usage totals."""
    found = events(stream(emitter(), full_turn()))
    assert [e["sequence_number"] for e in found] == list(range(len(found)))
    assert [e["type"] for e in found[:2]] == ["response.created", "response.in_progress"]
    completed = found[-1]
    assert completed["type"] == "response.completed"
    response = completed["response"]
    assert response["id"] == "resp_test" and response["status"] == "completed"
    assert {"input_tokens", "output_tokens", "total_tokens"} <= set(response["usage"])
    assert [i["type"] for i in response["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert all(e["response"]["id"] == "resp_test" for e in found if "response" in e)


def test_it_sends_the_documented_sequence_of_event_types() -> None:
    types = [e["type"] for e in events(stream(emitter(), full_turn()))]
    text_part = ["response.output_item.added", "response.content_part.added"]
    done = ["response.content_part.done", "response.output_item.done"]
    call = ["response.output_item.added", "response.function_call_arguments.delta",
            "response.function_call_arguments.done", "response.output_item.done"]
    assert types == (["response.created", "response.in_progress"]
                     + text_part + ["response.reasoning_text.delta"] * 5 + ["response.reasoning_text.done"] + done
                     + text_part + ["response.output_text.delta"] * 5 + ["response.output_text.done"] + done
                     + call + call + ["response.completed"])


def test_it_puts_the_full_item_in_output_item_done() -> None:
    """Codex records the item of ``response.output_item.done`` (PROTOCOLS.md section 0 item 3)."""
    found = events(stream(emitter(), full_turn()))
    done = [e["item"] for e in found if e["type"] == "response.output_item.done"]
    added = [e["item"] for e in found if e["type"] == "response.output_item.added"]
    assert done[1]["content"] == [{"type": "output_text", "text": "Running both.", "annotations": []}]
    assert done[1]["status"] == "completed" and added[1]["content"] == []
    assert done[2] == {"id": added[2]["id"], "type": "function_call", "call_id": "call_1", "name": "exec_command",
                       "arguments": '{"cmd":"ls"}', "status": "completed"}
    assert added[2]["arguments"] == ""
    assert [d["id"] for d in done] == [a["id"] for a in added]
    assert found[-1]["response"]["output"] == done


def test_it_echoes_the_request_on_the_response_object() -> None:
    created = events(emitter().open())[0]["response"]
    assert created["tools"] == [EXEC] and created["parallel_tool_calls"] is True
    assert created["tool_choice"] == "auto" and created["status"] == "in_progress" and created["output"] == []
    Response.model_validate(created)


def test_it_sends_comment_keepalives_the_sdk_ignores() -> None:
    em = emitter()
    data = em.open() + em.keepalive() + em.text(0, "content", "hi") + em.keepalive() + em.close(
        Turn(choices=[ChoiceTurn(content="hi", finish_reason="stop")]))
    assert b"\n: keepalive\n\n" in data
    assert final_response(data).output_text == "hi"
    assert em.keepalive() == b""


def test_it_answers_exhaustion_with_a_completed_response_holding_a_message() -> None:
    em = emitter()
    data = em.open() + em.text(0, "content", "Let me") + em.close_exhausted("[toolrelay] failed")
    response = final_response(data)
    assert [i.type for i in response.output] == ["message", "message"]
    assert response.output[1].content[0].text == "[toolrelay] failed"  # type: ignore[union-attr]
    assert response.status == "completed"


def test_the_terminal_error_is_response_failed_with_invalid_prompt() -> None:
    """``close_terminal``: ``response.failed`` with code ``invalid_prompt`` (the code Codex shows as sent and
    does not reconnect on), the open message item completed first."""
    em = emitter()
    data = em.open() + em.text(0, "content", "partial") + em.close_terminal("[toolrelay] failed")
    seen = events(data)
    assert seen[-1]["type"] == "response.failed"
    assert seen[-1]["response"]["error"] == {"code": "invalid_prompt", "message": "[toolrelay] failed"}
    assert "response.output_item.done" in [e["type"] for e in seen]
    assert em.close(full_turn()) == b"" and em.close_terminal("again") == b""


def test_it_ends_a_failed_stream_with_response_failed() -> None:
    """PROTOCOLS.md 3.4 / 5.3: ``response.failed`` with ``response.error {code, message}``."""
    em = emitter()
    data = em.open() + em.text(0, "content", "partial") + em.close_error(
        UpstreamError(502, "upstream broke", code="upstream_failed"))
    failed = events(data)[-1]
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "upstream broke"}
    assert em.close(full_turn()) == b""
    with sdk_client(data) as client, client.responses.stream(model="my-model", input="hi") as s:
        seen = list(s)
        with pytest.raises(RuntimeError, match="response.completed"):
            s.get_final_response()
    assert seen[-1].type == "response.failed" and seen[-1].response.error.code == "server_error"  # type: ignore[union-attr]


@pytest.mark.parametrize(("error", "code"), [
    (UpstreamError(400, "too long", code="context_length_exceeded"), "context_length_exceeded"),
    (UpstreamError(429, "slow down", code="rate_limited"), "rate_limit_exceeded"),
    (UpstreamError(504, "timeout"), "server_error"),
])
def test_it_keeps_codexs_terminal_failure_codes(error: UpstreamError, code: str) -> None:
    """Codex stops on ``context_length_exceeded`` and retries other codes (PROTOCOLS.md 3.4)."""
    raw = emitter().close_error(error).rsplit(b"data: ", 1)[-1]
    assert json.loads(raw)["response"]["error"]["code"] == code


@pytest.mark.parametrize(("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")])
def test_it_ends_a_cut_turn_with_response_incomplete_and_its_reason(finish: str, reason: str) -> None:
    """As OpenAI does on a ``max_output_tokens`` / content-filter stop: ``response.incomplete``, never
    ``response.completed`` (openai-python's ``get_final_response`` only takes ``response.completed``,
    openai/openai-python#3538, so the event itself is read here)."""
    data = stream(emitter(), Turn(choices=[ChoiceTurn(content="cut", finish_reason=finish)]))
    last = events(data)[-1]
    assert last["type"] == "response.incomplete" and b"response.completed" not in data
    response = Response.model_validate(last["response"])
    assert response.status == "incomplete" and response.output_text == "cut"
    assert response.incomplete_details is not None and response.incomplete_details.reason == reason


def test_it_restores_namespaced_tool_names() -> None:
    namespace = {"type": "namespace", "name": "multi_agent_v1", "description": "", "tools": [
        {"type": "function", "name": "wait", "parameters": {"type": "object"}}]}
    translation = translate_responses({"model": "m", "input": "x", "tools": [namespace]})
    flat = translation.body["tools"][0]["function"]["name"]
    turn = Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c1", flat, "{}")], finish_reason="tool_calls")])
    item = final_response(stream(emitter(tool_names=translation.tool_names), turn)).output[0]
    assert (item.name, item.namespace) == ("wait", "multi_agent_v1")  # type: ignore[union-attr]
    body = emitter(tool_names=translation.tool_names).complete(turn)
    assert (body["output"][0]["name"], body["output"][0]["namespace"]) == ("wait", "multi_agent_v1")


def test_it_makes_call_ids_unique_and_non_empty() -> None:
    calls = [ToolCall("c", "f", "{}"), ToolCall("c", "f", "{}"), ToolCall("", "f", "{}")]
    response = final_response(stream(emitter(), Turn(choices=[ChoiceTurn(tool_calls=calls)])))
    ids = [i.call_id for i in response.output]  # type: ignore[union-attr]
    assert ids[:2] == ["c", "c_2"] and ids[2].startswith("call_")


def test_it_splits_long_arguments_into_deltas_that_concatenate_back() -> None:
    arguments = json.dumps({"cmd": "x" * (ARGUMENT_SLICE + 5)})
    data = stream(emitter(), Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c", "exec_command", arguments)])]))
    deltas = [e["delta"] for e in events(data) if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) == 2 and "".join(deltas) == arguments
    assert final_response(data).output[0].arguments == arguments  # type: ignore[union-attr]


def test_it_sends_refusals_as_output_text() -> None:
    em = emitter()
    data = em.open() + em.text(0, "refusal", "I can't.") + em.close(Turn(choices=[ChoiceTurn(refusal="I can't.")]))
    assert final_response(data).output_text == "I can't."


def test_it_renders_a_non_stream_response_the_sdk_parses() -> None:
    body = emitter().complete(full_turn())
    with sdk_client(json.dumps(body).encode(), content_type="application/json") as client:
        response = client.responses.create(model="my-model", input="hi")
    assert [i.type for i in response.output] == ["reasoning", "message", "function_call", "function_call"]
    assert response.output_text == "Running both." and response.id == "resp_test"
    assert response.usage is not None and response.usage.total_tokens == 150


def test_it_renders_the_non_stream_exhaustion_answer() -> None:
    response = Response.model_validate(emitter().complete_exhausted("[toolrelay] no luck"))
    assert response.output_text == "[toolrelay] no luck" and response.status == "completed"


@pytest.mark.parametrize(("status", "exception"), [
    (400, openai.BadRequestError), (401, openai.AuthenticationError), (404, openai.NotFoundError),
    (429, openai.RateLimitError), (502, openai.InternalServerError)])
def test_it_shapes_http_errors_like_openai(status: int, exception: type[Exception]) -> None:
    body = emitter().error_body(status, "nope", type="invalid_request_error", param="model", code="x")
    assert body == {"error": {"message": "nope", "type": "invalid_request_error", "param": "model", "code": "x"}}
    with sdk_client(json.dumps(body).encode(), status=status, content_type="application/json") as client:
        with pytest.raises(exception) as caught:
            client.responses.create(model="m", input="x")
    assert caught.value.code == "x"  # type: ignore[attr-defined]


@settings(max_examples=150, deadline=None)
@given(deltas=st.lists(st.tuples(st.sampled_from(["content", "reasoning", "refusal"]),
                                 st.text(min_size=1, max_size=8)), max_size=12),
       calls=st.integers(min_value=0, max_value=3))
def test_it_streams_any_delta_sequence_into_items_the_sdk_accepts(deltas: list[tuple[Channel, str]],
                                                                  calls: int) -> None:
    em = emitter()
    data = em.open() + b"".join(em.text(0, ch, t) for ch, t in deltas)
    tool_calls = [ToolCall(f"c{k}", "exec_command", json.dumps({"cmd": str(k)})) for k in range(calls)]
    data += em.close(Turn(choices=[ChoiceTurn(tool_calls=tool_calls)], usage=USAGE))
    response = final_response(data)
    texts = [(i.type, i.content[0].text) for i in response.output if i.type != "function_call"]  # type: ignore[union-attr,index]
    assert texts == list(_runs(deltas))
    assert [json.loads(i.arguments) for i in response.output if i.type == "function_call"] == [  # type: ignore[union-attr]
        {"cmd": str(k)} for k in range(calls)]


def _runs(deltas: list[tuple[Channel, str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for channel, piece in deltas:
        kind = "reasoning" if channel == "reasoning" else "message"
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + piece)
        else:
            out.append((kind, piece))
    return out


def test_it_sends_one_ascii_json_document_per_data_line() -> None:
    """PROTOCOLS.md section 0 item 7: ``ensure_ascii``, no raw U+2028 / newlines inside data, no BOM."""
    text = "Grüße\u2028line\nnext \U0001f600"
    em = emitter()
    data = em.open() + em.text(0, "content", text) + em.close(
        Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c", "f", json.dumps({"t": text}, ensure_ascii=False))])]))
    assert data.isascii() and not data.startswith(b"\xef\xbb\xbf")
    response = final_response(data)
    assert response.output_text == text
    assert json.loads(response.output[1].arguments) == {"t": text}  # type: ignore[union-attr]
