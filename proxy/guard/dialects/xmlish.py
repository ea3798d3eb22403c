"""Recognisers whose arguments are XML-ish tags with raw text values, typed by the declared schema.

Shapes (vLLM ``qwen3coder_tool_parser``, ``minimax_m2_tool_parser``, ``deepseekv32_tool_parser``,
``glm4_moe_tool_parser``, ``hy_v3_tool_parser``, ``step3_tool_parser``, ``seed_oss_tool_parser``,
``minicpm5xml_tool_parser``, ``dots_tool_parser``; SGLang ``minimax_m3``; Anthropic's legacy
``<function_calls>`` prompt format): a call names its function in a tag or attribute, and each
parameter is a tag whose text is the value. A value's text keeps its inner whitespace except the
one newline the templates put after the opening and before the closing tag.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from proxy.guard.dialects.base import Ctx, MarkupError, Parsed, calls_from_values, json_values, make_call, unfence
from proxy.guard.dialects.values import coerce

_FUNC = re.compile(r"<function\s*=\s*([^>\n{]+?)\s*>?(?=[\s<{])|<function\s+name\s*=\s*[\"']([^\"']+)[\"'][^>]*>",
                   re.S)
_EQ_PARAM = re.compile(r"<parameter\s*=\s*([^>\s]+)\s*>(.*?)(?:</parameter>|(?=<parameter\s*=)|(?=</function>)|\Z)",
                       re.S)
_NAMED_PARAM = re.compile(r"<(parameter|param)\s+name\s*=\s*[\"']?([^\"'>\s]+)[\"']?([^>]*)>(.*?)</\1>", re.S)


def value_text(raw: str) -> str:
    """A tag's text with the template's framing newline removed on each side."""
    text = raw.removeprefix("\r\n").removeprefix("\n").removesuffix("\n").removesuffix("\r")
    return text


def typed(ctx: Ctx, tool: str, key: str, raw: str, attrs: str = "") -> Any:
    """A parameter value by the declared property type (``string="true|false"`` DSML attributes win)."""
    text = value_text(raw)
    as_string: bool | None = None
    if 'string="true"' in attrs:
        as_string = True
    elif 'string="false"' in attrs:
        as_string = False
    return coerce(text, ctx.props(tool).get(key), as_string=as_string)


def function_tags(text: str, ctx: Ctx) -> list[Any]:
    """``<function=name><parameter=k>v</parameter></function>`` (Qwen3-Coder, MiMo, Nemotron 3,
    Seed-OSS), ``<function=name>{json}</function>`` (Functionary v3.1 / Llama 3.1 custom tools,
    Groq's ``<function=name{json}``) and ``<function name="x">`` (MiniCPM ``<param name=…>``)."""
    heads = list(_FUNC.finditer(text))
    if not heads:
        raise MarkupError("function tag without a name")
    calls = []
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = text[m.end() : end]
        body = body[: body.find("</function>")] if "</function>" in body else body
        calls.append(_function_call((m.group(1) or m.group(2)).strip(), body, ctx))
    return calls


def _function_call(name: str, body: str, ctx: Ctx) -> Any:
    inner = body.lstrip().removeprefix(">").strip()
    if "<parameter" in inner or "<param" in inner:
        args = {p.group(1).strip(): typed(ctx, name, p.group(1).strip(), p.group(2)) for p in _EQ_PARAM.finditer(inner)}
        args.update({p.group(2): typed(ctx, name, p.group(2), p.group(4), p.group(3))
                     for p in _NAMED_PARAM.finditer(inner)})
        return make_call(name, args)
    return make_call(name, unfence(inner) or "{}")


_INVOKE = re.compile(r"<invoke\s+name\s*=\s*[\"']?([^\"'>]+?)[\"']?\s*>(.*?)(?:</invoke>|\Z)", re.S)


def invokes(body: str, ctx: Ctx) -> list[Any]:
    """``<invoke name="x"><parameter name="k">v</parameter></invoke>`` (MiniMax-M2, DSML after its
    prefix is removed, Step3 ``steptml:``, Dots, Anthropic's legacy ``<function_calls>``)."""
    calls = []
    for m in _INVOKE.finditer(body):
        name = m.group(1).strip()
        args = {p.group(2): typed(ctx, name, p.group(2), p.group(4), p.group(3))
                for p in _NAMED_PARAM.finditer(m.group(2))}
        calls.append(make_call(name, args))
    if not calls:
        raise MarkupError("no <invoke> inside the block")
    return calls


_DSML = re.compile(r"[|｜‖]{1,2}\s*DSML\s*[|｜‖]{1,2}")


def dsml(body: str, ctx: Ctx) -> Parsed:
    """DeepSeek V3.2 / V4 DSML: ``<｜DSML｜invoke name=…><｜DSML｜parameter name=… string="true">``;
    the bar is also written ``|``, ``‖`` or doubled (lsdefine/GenericAgent#804)."""
    return Parsed("deepseek_dsml", invokes(_DSML.sub("", body), ctx))


def steptml(body: str, ctx: Ctx) -> list[Any]:
    """Step3 ``<steptml:invoke name=…><steptml:parameter name=…>v</steptml:parameter>``."""
    return invokes(body.replace("steptml:", ""), ctx)


def minimax(body: str, ctx: Ctx) -> Parsed:
    """MiniMax-M2 ``<minimax:tool_call>`` bodies (C31), and MiniMax-M1's JSON-line bodies."""
    text = body.strip()
    if text[:1] == "{":

        return Parsed("minimax_m1", calls_from_values(json_values(text)))
    return Parsed("minimax", invokes(text, ctx))


_KV = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)(?:</arg_value>|\Z)", re.S)
_KV_HEAD = re.compile(r"\s*([^\s<]+)\s*(<tool_sep>)?", re.S)


def key_value_call(text: str, ctx: Ctx) -> Parsed:
    """GLM-4.5 / 4.6 / 4.7 / 5, Ling 3, Poolside ``name\\n<arg_key>k</arg_key><arg_value>v</arg_value>``
    and Hunyuan ``name<tool_sep><arg_key>…`` (one call per ``<tool_call>``; no args is allowed)."""
    m = _KV_HEAD.match(text)
    if m is None or (text[m.end() :].strip() and not text[m.end() :].lstrip().startswith("<arg_key>")):
        raise MarkupError("expected a tool name then <arg_key>/<arg_value> pairs")
    name = m.group(1)
    args = {k.strip(): typed(ctx, name, k.strip(), v) for k, v in _KV.findall(text[m.end() :])}
    return Parsed("hunyuan" if m.group(2) else "glm4_moe", [make_call(name, args)])


def tool_calls_section(body: str, ctx: Ctx) -> Parsed:
    """``<tool_calls>`` bodies: a JSON array (Jamba, Hunyuan-A13B, Apriel), JSON lines (MiniMax-M1),
    or ``<tool_call>`` elements (Hunyuan V3 / V4)."""
    text = body.strip()
    if text.startswith("<tool_call>"):
        calls = []
        family = "hunyuan"
        for part in re.findall(r"<tool_call>(.*?)(?:</tool_call>|\Z)", text, re.S):
            parsed = hermes(part, ctx)
            family = parsed.family
            calls.extend(parsed.calls)
        return Parsed("hunyuan" if family == "glm4_moe" else family, calls)

    values = json_values(text)
    family = "jamba" if len(values) == 1 and isinstance(values[0], list) else "minimax_m1"
    return Parsed(family, calls_from_values(values))


def function_calls(body: str, ctx: Ctx) -> Parsed:
    """``<function_calls>`` bodies: Anthropic-style ``<invoke>`` XML, else Olmo 3's pythonic lines."""
    if "<invoke" in body:
        return Parsed("anthropic_xml", invokes(body, ctx))
    from proxy.guard.dialects.pythonic import calls_of

    return Parsed("olmo3", calls_of(body))


_M3_NS = "]<]minimax[>["


def minimax_m3(body: str, ctx: Ctx) -> Parsed:
    """MiniMax-M3: every tag is prefixed by ``]<]minimax[>[`` and a parameter is a tag named after it:
    ``<invoke name="x"><city>Paris</city></invoke>`` (SGLang ``function_call/minimax_m3.py``)."""
    text = re.sub(r"\]?" + re.escape(_M3_NS[1:]) + r"\s*", "", body)
    calls = []
    for m in re.finditer(r"<invoke\s+name=\"([^\"]+)\">(.*?)(?:</invoke>|\Z)", text, re.S):
        name = m.group(1)
        args = {k: _m3_value(ctx, name, k, v) for k, v in re.findall(r"<([\w.\-]+)>(.*?)</\1>", m.group(2), re.S)}
        calls.append(make_call(name, args))
    if not calls:
        raise MarkupError("no MiniMax-M3 invoke")
    return Parsed("minimax_m3", calls)


def _m3_value(ctx: Ctx, tool: str, key: str, raw: str) -> Any:
    return typed(ctx, tool, key, raw)


_K3_CALL = re.compile(r"<\|open\|>call\s+tool=\"([^\"]*)\"[^<]*?<\|sep\|>(.*?)(?:<\|close\|>call<\|sep\|>|\Z)", re.S)
_K3_ARG = re.compile(r"<\|open\|>argument\s+key=\"([^\"]*)\"(?:\s+type=\"(\w+)\")?\s*<\|sep\|>(.*?)"
                     r"<\|close\|>argument<\|sep\|>", re.S)


def kimi_k3(body: str, ctx: Ctx) -> Parsed:
    """Kimi K3 XTML: ``<|open|>call tool="NAME" index="1"<|sep|><|open|>argument key="K" type="T"<|sep|>
    V<|close|>argument<|sep|>…`` (vLLM ``kimi_k3_tool_parser``; ``type`` says how V is written)."""
    calls = []
    for m in _K3_CALL.finditer(body):
        name = html.unescape(m.group(1))
        args = {}
        for key, kind, raw in _K3_ARG.findall(m.group(2)):
            key = html.unescape(key)
            if kind and kind != "string":
                try:
                    args[key] = json.loads(raw)
                    continue
                except (ValueError, RecursionError):
                    pass
            args[key] = typed(ctx, name, key, raw) if not kind else raw
        calls.append(make_call(name, args))
    if not calls:
        raise MarkupError("no Kimi K3 call")
    return Parsed("kimi_k3", calls)


def hermes(body: str, ctx: Ctx) -> Parsed:
    """``<tool_call>`` bodies: JSON (Hermes), ``<function=…>`` (Qwen3-Coder), GLM / Hunyuan key-value.

    The wrapper is shared by several templates, so the body's shape picks the reader.
    """
    text = unfence(body.strip())
    if text.startswith("<function=") or text.startswith("<function "):
        return Parsed("qwen3_coder", function_tags(text, ctx))
    if text.startswith("<invoke"):
        return Parsed("minimax", invokes(text, ctx))
    if text[:1] in "{[":
        values = json_values(text)
        family = "granite" if len(values) == 1 and isinstance(values[0], list) else "hermes"
        return Parsed(family, calls_from_values(values))
    return key_value_call(text, ctx)
