"""``prepare``: a client request in chat.completions form, checked and read once."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.guard.checks.request import RequestInvalid, check_chat_fields, prepare

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_it_reads_the_request_once() -> None:
    """Stream, tools, usage and the guard spec come from one pass; the client's bytes are kept."""
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL],
            "stream_options": {"include_usage": True}, "tool_choice": "required", "parallel_tool_calls": False}
    request = prepare(body, b"raw")
    assert (request.model, request.stream, request.declares_tools, request.include_usage) == ("m", True, True, True)
    assert request.spec.names == frozenset({"get_weather"}) and request.spec.tool_choice == "required"
    assert request.spec.parallel_tool_calls is False and request.raw == b"raw"


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "tools": [TOOL, TOOL]}, "tools"),
    ({"model": "m", "tool_choice": "required"}, "tool_choice"),
    ({"model": "m", "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
])
def test_it_refuses_unsatisfiable_tool_declarations(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        prepare(body)
    assert refused.value.param == param


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{}]}, "model"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": [{}], "stream": "yes"}, "stream"),
    ({"model": "m", "messages": [{}], "tools": {}}, "tools"),
    ({"model": "m", "messages": [{}], "tools": [{"function": {}}]}, "tools[0].function.name"),
    ({"model": "m", "messages": [{}], "n": 0}, "n"),
    ({"model": "m", "messages": [{}], "n": True}, "n"),
])
def test_it_names_the_field_an_openai_chat_client_must_fix(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        check_chat_fields(body)
    assert refused.value.param == param


def _named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def test_a_declared_name_over_64_characters_is_refused_naming_its_position() -> None:
    """Issue 24 item 2: names have no other bound, and the guard reads each per choice and attempt."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [_named("ok"), _named("n" * 65)]}
    with pytest.raises(RequestInvalid) as refused:
        prepare(body)
    assert refused.value.param == "tools[1].function.name" and "65 characters long" in refused.value.message
    body["tools"] = [_named("ok"), _named("n" * 64)]
    assert prepare(body).spec.names == frozenset({"ok", "n" * 64})


def test_translators_refuse_client_names_past_their_bound_and_shorten_the_rest() -> None:
    from proxy.guard.protocols.translate import MAX_CLIENT_TOOL_NAME, TranslationError, upstream_tool_name

    assert len(upstream_tool_name("m" * MAX_CLIENT_TOOL_NAME)) == 64
    with pytest.raises(TranslationError) as refused:
        upstream_tool_name("m" * (MAX_CLIENT_TOOL_NAME + 1))
    assert refused.value.param == "tools"
