"""Recognisers whose arguments are JSON: call objects, arrays of calls, or a name then a JSON object.

Facts from the servers' parsers (vLLM ``vllm/tool_parsers/``, SGLang ``function_call/``, llama.cpp
``common/chat.cpp``): Hermes / Qwen / Granite 4 / ERNIE / LongCat wrap ``{"name", "arguments"}``
objects; Jamba, Hunyuan-A13B, Granite 3.x, Nemotron, Phi-4-mini, Apertus and Command-A wrap JSON
arrays; Mistral v11+ writes ``name[ARGS]{…}`` (older: a JSON array after ``[TOOL_CALLS]``); Harmony
puts the function in the header (``to=functions.NAME``) and the arguments after ``<|message|>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from proxy.guard.dialects.base import (
    Ctx,
    MarkupError,
    Parsed,
    call_from_obj,
    calls_from_values,
    json_values,
    make_call,
)


def apertus(body: str, ctx: Ctx) -> Parsed:
    """``[{"get_weather": {"city": "Paris"}}]``: each call is a one-key object ``{name: arguments}``."""
    calls = []
    for value in json_values(body):
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict) or len(item) != 1:
                raise MarkupError("an Apertus call is a one-key object")
            (name, args), = item.items()
            calls.append(make_call(name, args))
    return Parsed("apertus", calls)


def named_json(family: str) -> Callable[[str, Ctx], Parsed]:
    """Bodies that are either call objects / arrays, or ``name{…}`` (LongCat, Inkling, Dots fallback)."""

    def parse(body: str, ctx: Ctx) -> Parsed:
        text = body.strip()
        if text[:1] in "{[":
            return Parsed(family, calls_from_values(json_values(text)))
        return Parsed(family, [_name_then_json(text)])

    return parse


_MISTRAL_HEAD = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*(?:\[CALL_ID\]\s*[^\[\]{]*)?\s*(?:\[ARGS\])?\s*")


def mistral(body: str, ctx: Ctx) -> Parsed:
    """``[TOOL_CALLS][{…}, …]`` (tokenizer < v11) or ``[TOOL_CALLS]name[ARGS]{…}`` (v11+, Magistral,
    Devstral; ``[CALL_ID]id`` optional). One block holds one call in the v11 form."""
    text = body.strip()
    if text[:1] in "{[":
        family = "mistral"
        return Parsed(family, calls_from_values(json_values(text)))
    m = _MISTRAL_HEAD.match(text)
    if m is None or not text[m.end() :].startswith("{"):
        raise MarkupError("Mistral call without name[ARGS]{…}")
    return Parsed("mistral_v11", [make_call(m.group(1), _one_json_text(text[m.end() :]))])


def _one_json_text(text: str) -> str:
    """The text of the first JSON object in ``text`` (trailing residue is not part of the call)."""
    try:
        _, end = json.JSONDecoder(strict=False).raw_decode(text)
    except (ValueError, RecursionError) as exc:
        raise MarkupError(f"arguments are not JSON ({exc})") from None
    return text[:end]


_NAME_JSON = re.compile(r"\s*(?:functions\.)?([A-Za-z_][\w.\-]*)\s*[:>\n]?\s*(?=[{\[])")


def _name_then_json(text: str) -> Any:
    m = _NAME_JSON.match(text)
    if m is None:
        raise MarkupError("expected a tool name then JSON arguments")
    return make_call(m.group(1), _one_json_text(text[m.end() :]))


_HARMONY = re.compile(
    r"(?:<\|start\|>)?\s*(?:assistant)?\s*(?:<\|channel\|>\s*\w+)?\s*to=(?:functions\.)?([\w.\-]+)"
    r"\s*(?:<\|channel\|>\s*\w+)?\s*(?:<\|constrain\|>\s*)?(\w+)?\s*(?:<\|message\|>)?", re.S)


def harmony(body: str, ctx: Ctx) -> Parsed:
    """gpt-oss Harmony: ``[<|start|>assistant]<|channel|>commentary to=functions.NAME <|constrain|>json
    <|message|>{…}[<|call|>]``; the recipient may come before the channel; without special tokens
    (stripped by the server) the same words remain (``commentary to=functions.NAME json{…}``)."""
    calls = []
    for segment in re.split(r"<\|call\|>|<\|end\|>", body):
        if "to=" not in segment:
            continue
        m = _HARMONY.search(segment)
        if m is None:
            raise MarkupError("Harmony header without a recipient")
        calls.append(make_call(m.group(1), _one_json_text(segment[m.end() :].strip() or "{}")))
    if not calls:
        raise MarkupError("no Harmony tool message")
    return Parsed("harmony", calls)


_QWEN_AGENT = re.compile(r"\s*:?\s*([A-Za-z_][\w.\-]*)\s*\n?\s*✿ARGS✿\s*:?\s*", re.S)


def qwen_agent(body: str, ctx: Ctx) -> Parsed:
    """Qwen-Agent's prompt format ``✿FUNCTION✿: name\\n✿ARGS✿: {…}`` (``qwen_agent/llm/fncall_prompts``)."""
    m = _QWEN_AGENT.match(body)
    if m is None:
        raise MarkupError("expected ✿FUNCTION✿: name ✿ARGS✿: {…}")
    return Parsed("qwen_agent", [make_call(m.group(1), _one_json_text(body[m.end() :].strip()))])


def gigachat(body: str, ctx: Ctx) -> Parsed:
    """GigaChat 3 ``<|function_call|>{"name":…,"arguments":{…}}`` / ``function call<|role_sep|>\\n{…}``."""
    text = body.strip()
    text = text.removeprefix("<|role_sep|>").strip()
    return Parsed("gigachat", [call_from_obj(v) for v in json_values(text)])


def cohere_r(body: str, ctx: Ctx) -> Parsed:
    """Command-R ``Action: ```json [{"tool_name": …, "parameters": {…}}] ```"""
    text = body.strip().removeprefix(":").strip().removeprefix("```json").strip().removesuffix("```")
    return Parsed("cohere_command_r", calls_from_values(json_values(text)))
