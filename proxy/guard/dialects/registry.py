"""The dialect table: every tool-call template family the guard recognises in text (docs/dialects.md).

Each row says how a family's blocks open and end and which recogniser reads them. Openers that
several templates share (``<tool_call>``, ``<tool_calls>``, ``<|tool_calls|>``) have one row whose
recogniser picks the family from the body's shape. Sources for every marker are in the recognisers'
docstrings and in docs/dialects.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from proxy.guard.dialects import jsonish, tokens, xmlish
from proxy.guard.dialects.base import (
    Ctx,
    Dialect,
    Parsed,
    calls_from_values,
    json_calls,
    json_values,
    leading_name,
    starts_any,
)
from proxy.guard.dialects.pythonic import calls_of, pythonic


def _tool_call_body(body: str, ctx: Ctx) -> bool | None:
    """``<tool_call>``: JSON, ``<function=…>``, ``<invoke``, a fence, or ``name`` + GLM / Hunyuan tags."""
    shaped = starts_any(body, ("{", "[", "<function", "<invoke", "```"))
    if shaped is not False:
        return shaped
    return leading_name(body, ctx, ("\n", "<arg_key>", "</tool_call>", "<tool_sep>"))


def _declared_call(body: str, ctx: Ctx) -> bool | None:
    return leading_name(body, ctx, ("(",), declared=True)


def _json_call_start(body: str, ctx: Ctx) -> bool | None:
    return starts_any(body, ('{"name"', '{ "name"', '{\n', "```json", "[{"))


def _harmony_header(body: str, ctx: Ctx) -> bool | None:
    at = body.find("<|message|>")
    if at < 0:
        return None if len(body) < 160 else False
    return "to=" in body[:at]


def _fn_call(family_of_params: str, family_of_json: str) -> Callable[[str, Ctx], Parsed]:
    """``<function=…>`` blocks: parameter tags (Qwen3-Coder) or a JSON body (Functionary v3.1)."""

    def parse(body: str, ctx: Ctx) -> Parsed:
        text = "<function=" + body if not body.lstrip().startswith("<function") else body
        family = family_of_params if "<parameter" in body else family_of_json
        return Parsed(family, xmlish.function_tags(text, ctx))

    return parse


def _function_name_attr(body: str, ctx: Ctx) -> Parsed:
    calls = xmlish.function_tags("<function name=" + body, ctx)
    inner = body.partition(">")[2].lstrip()
    return Parsed("function_json" if inner.startswith("{") else "minicpm", calls)


def _seed(body: str, ctx: Ctx) -> Parsed:
    return Parsed("seed_oss", xmlish.function_tags(body.strip(), ctx))


def _lfm2(body: str, ctx: Ctx) -> Parsed:
    """LFM2 writes a Python call list; some LFM2.5 builds drift to JSON (Liquid4All/cookbook#72)."""
    text = body.strip()
    if text.startswith("{") or text.startswith("[{"):
        return Parsed("lfm2", calls_from_values(json_values(text)))
    return Parsed("lfm2", calls_of(text))


def _short_tool_calls(body: str, ctx: Ctx) -> Parsed:
    """``<|tool_calls|>``: Phi-4-mini's JSON array (``<|/tool_calls|>``) or DeepSeek's short section."""
    if body.lstrip().startswith("["):
        return Parsed("phi4_mini", calls_from_values(json_values(body)))
    return tokens.special(body, ctx)


def _harmony(opener: str) -> Callable[[str, Ctx], Parsed]:
    def parse(body: str, ctx: Ctx) -> Parsed:
        return jsonish.harmony(opener + body, ctx)

    return parse


def _gemma_bare(body: str, ctx: Ctx) -> Parsed:
    text = "call" + body
    quote = '<|"|>' if '<|"|>' in body else "<escape>"
    return Parsed("gemma4", [tokens._gemma_call(text, quote)])


def _dsml_invoke(body: str, ctx: Ctx) -> Parsed:
    """A DSML ``invoke`` without its section (sgl-project/sglang#40236)."""
    return xmlish.dsml("<|DSML|invoke" + body + "</|DSML|invoke>", ctx)


def _dots(body: str, ctx: Ctx) -> Parsed:
    if "<invoke" in body:
        return Parsed("dots", xmlish.invokes(body, ctx))
    return jsonish.named_json("dots")(body, ctx)


def _header(pattern: str, alphabet: str) -> Callable[[str], int | None]:
    """A value-start finder: ``pattern`` must match up to the value (its own lookahead ends it);
    while the text so far is only ``alphabet`` characters the header may still complete (None),
    otherwise no value can follow (-1)."""
    full, chars = re.compile(pattern, re.S), re.compile(alphabet + r"*", re.S)

    def find(text: str) -> int | None:
        m = full.match(text)
        if m is not None:
            return m.end()
        return None if len(text) < 200 and chars.fullmatch(text) else -1

    return find


_MISTRAL_START = _header(r"\s*(?=\[)|\s*[A-Za-z_][\w.\-]*\s*(?:\[CALL_ID\][^\[\]{}]*)?\s*(?:\[ARGS\])?\s*(?=\{)",
                         r"[\w.\-\s\[\]]")
_TO_FUNCTIONS = _header(r"=functions\.[\w.\-]+[ \t]*(?:<\|channel\|>\s*\w+\s*)?(?:<\|constrain\|>)?\s*(?:json)?\s*"
                        r"(?:<\|message\|>)?\s*(?=[{\[])", r"[=\w.\-\s<|>]")
_GEMMA_START = _header(r":[\w.\-]+\s*(?=\{)", r"[\w.\-\s:]")
_QWEN_AGENT_START = _header(r"\s*:?\s*[A-Za-z_][\w.\-]*\s*\n?\s*✿ARGS✿\s*:?\s*(?=[{\[])", r"[\w.\-\s:✿]")


_BARS = ("|", "||")
_HERMES_ALT = ("tools", "tool", "response", "json", "JSON", "xml")

DIALECTS: tuple[Dialect, ...] = (
    Dialect("hermes", ("<tool_call>",), xmlish.hermes, closers=("</tool_call>",), plausible=_tool_call_body),
    Dialect("jamba", ("<tool_calls>",), xmlish.tool_calls_section, closers=("</tool_calls>",),
            plausible=lambda b, c: starts_any(b, ("[", "{", "<tool_call>"))),
    Dialect("deepseek_v3", ("<|tool_calls_begin|>",), tokens.special, closers=("<|tool_calls_end|>",), fuzzy=True),
    Dialect("deepseek_v3", ("<|tool_calls|>",), _short_tool_calls, closers=("<|tool_calls_end|>", "<|/tool_calls|>"),
            fuzzy=True),
    Dialect("kimi_k2", ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"), tokens.special,
            closers=("<|tool_calls_section_end|>", "<|tool_call_section_end|>"), fuzzy=True),
    Dialect("kimi_k2", ("<|tool_call_begin|>",), tokens.special, closers=("<|tool_call_end|>",), fuzzy=True),
    *(Dialect("deepseek_dsml", (f"<{b}DSML{b}{tag}>",), xmlish.dsml, closers=(f"</{b}DSML{b}{tag}>",), fuzzy=True)
      for b in _BARS for tag in ("function_calls", "tool_calls")),
    *(Dialect("deepseek_dsml", (f"<{b}DSML{b}invoke",), _dsml_invoke, closers=(f"</{b}DSML{b}invoke>",), fuzzy=True)
      for b in _BARS),
    Dialect("minimax", ("<minimax:tool_call>",), xmlish.minimax, closers=("</minimax:tool_call>",)),
    # MiniMax-M3's namespace token is ``]<]minimax[>[``; its opener is matched from the ``<`` so that
    # a ``]`` ending a delta (common in text) is never held back: the first ``]`` stays text.
    Dialect("minimax_m3", ("<]minimax[>[",), xmlish.minimax_m3, closers=("</tool_call>",),
            plausible=lambda b, c: starts_any(b, ("<tool_call>", "<invoke"))),
    Dialect("qwen3_coder", ("<function=",), _fn_call("qwen3_coder", "function_json"), closers=("</function>",),
            plausible=lambda b, c: leading_name(b, c, (">", "{", "\n", " "))),
    Dialect("minicpm", ("<function name=",), _function_name_attr, closers=("</function>",)),
    Dialect("seed_oss", ("<seed:tool_call>",), _seed, closers=("</seed:tool_call>",)),
    Dialect("longcat", ("<longcat_tool_call>",), jsonish.named_json("longcat"), closers=("</longcat_tool_call>",)),
    Dialect("mistral", ("[TOOL_CALLS]",), jsonish.mistral, value_end=True, value_start=_MISTRAL_START,
            trailers=("</s>",)),
    Dialect("llama3_json", ("<|python_tag|>",), json_calls("llama3_json"), value_end=True, joiners=";",
            trailers=("<|eom_id|>", "<|eot_id|>"), strong=False),
    Dialect("llama4_pythonic", ("<|python_start|>",), pythonic("llama4_pythonic"), closers=("<|python_end|>",)),
    Dialect("lfm2", ("<|tool_call_start|>",), _lfm2, closers=("<|tool_call_end|>",)),
    Dialect("granite", ("<|tool_call|>",), json_calls("granite"), value_end=True),
    Dialect("granite_20b_fc", ("<function_call>",), json_calls("granite_20b_fc"), value_end=True),
    Dialect("internlm2", ("<|action_start|>",), tokens.internlm2, closers=("<|action_end|>",),
            plausible=lambda b, c: starts_any(b, ("<|plugin|>",))),
    Dialect("apertus", ("<|tools_prefix|>",), jsonish.apertus, closers=("<|tools_suffix|>",)),
    Dialect("cohere_command", ("<|START_ACTION|>",), json_calls("cohere_command"), closers=("<|END_ACTION|>",)),
    Dialect("harmony", ("<|channel|>",), _harmony("<|channel|>"), closers=("<|call|>",), plausible=_harmony_header),
    Dialect("harmony", ("<|start|>",), _harmony("<|start|>"), closers=("<|call|>",), plausible=_harmony_header),
    Dialect("harmony", ("to",), _harmony("to"), value_end=True, value_start=_TO_FUNCTIONS,
            trailers=("<|call|>",), strong=False, word=True, anchor="="),
    Dialect("function_gemma", ("<start_function_call>",), tokens.function_gemma, closers=("<end_function_call>",)),
    Dialect("gemma4", ("<|tool_call>",), tokens.gemma4, closers=("<tool_call|>", "<turn|>")),
    Dialect("gemma4", ("call",), _gemma_bare, value_end=True, value_start=_GEMMA_START, strong=False, word=True,
            anchor=":", quote='<|"|>',
            plausible=lambda b, c: leading_name(b.removeprefix(":"), c, ("{",), declared=True)),
    Dialect("gemma_tool_code", ("```tool_code",), pythonic("gemma_tool_code"), closers=("```",), strong=False,
            plausible=_declared_call),
    Dialect("phi4_mini", ("functools",), json_calls("phi4_mini"), value_end=True, strong=False, word=True,
            anchor="[", plausible=lambda b, c: starts_any(b, ("[{", "[ ", "[\n"))),
    Dialect("nemotron", ("<TOOLCALL>",), json_calls("nemotron"), closers=("</TOOLCALL>",)),
    Dialect("gigachat", ("<|function_call|>",), jsonish.gigachat, value_end=True),
    Dialect("gigachat", ("<|role_sep|>",), jsonish.gigachat, value_end=True, strong=False,
            plausible=lambda b, c: starts_any(b, ('{"name"', '{ "name"'))),
    Dialect("inkling", ("<|content_invoke_tool_json|>",), jsonish.named_json("inkling"),
            closers=("<|end_message|>", "<|content_model_end_sampling|>")),
    Dialect("dots", ("<dots_function_call>",), _dots, closers=("</dots_function_call>",)),
    Dialect("anthropic_xml", ("<function_calls>",), xmlish.function_calls, closers=("</function_calls>",)),
    Dialect("kimi_k3", ("<|open|>tools<|sep|>",), xmlish.kimi_k3, closers=("<|close|>tools<|sep|>",)),
    Dialect("cohere_command_r", ("Action",), jsonish.cohere_r, closers=("\n```",), strong=False, word=True,
            anchor=":", plausible=lambda b, c: starts_any(b, (": ```json", ":```json"))),
    Dialect("qwen_agent", ("✿FUNCTION✿",), jsonish.qwen_agent, value_end=True, value_start=_QWEN_AGENT_START),
    *(Dialect("hermes", (f"<{tag}>",), xmlish.hermes, closers=(f"</{tag}>",), strong=False,
              plausible=_json_call_start) for tag in _HERMES_ALT),
)
