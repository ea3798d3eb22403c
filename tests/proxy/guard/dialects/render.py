"""Render tool calls the way each template family writes them (test helper, not a fixture module).

Each renderer takes ``[(name, arguments)]`` and returns the model's text for those calls, in the
shape the family's chat template produces (sources in docs/dialects.md). XML-ish families write
values as text: strings raw, everything else as JSON (the schema types them back).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Calls = list[tuple[str, dict[str, Any]]]


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _t(value: Any) -> str:
    """An XML-ish parameter text: strings raw, other values JSON."""
    return value if isinstance(value, str) else _j(value)


def _py(value: Any) -> str:
    return repr(value)


def _kw(args: dict[str, Any], lit: Callable[[Any], str] = _py) -> str:
    return ", ".join(f"{k}={lit(v)}" for k, v in args.items())


def _gemma(value: Any, quote: str) -> str:
    if isinstance(value, str):
        return f"{quote}{value}{quote}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_gemma(v, quote)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma(v, quote) for v in value) + "]"
    return repr(value)


def hermes(calls: Calls) -> str:
    return "".join(f'<tool_call>\n{{"name": "{n}", "arguments": {_j(a)}}}\n</tool_call>' for n, a in calls)


def qwen3_coder(calls: Calls) -> str:
    out = []
    for n, a in calls:
        params = "".join(f"<parameter={k}>\n{_t(v)}\n</parameter>\n" for k, v in a.items())
        out.append(f"<tool_call>\n<function={n}>\n{params}</function>\n</tool_call>")
    return "".join(out)


def function_json(calls: Calls) -> str:
    return "".join(f"<function={n}>{_j(a)}</function>" for n, a in calls)


def glm4_moe(calls: Calls) -> str:
    return "".join(f"<tool_call>{n}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_t(v)}</arg_value>\n"
                                                   for k, v in a.items()) + "</tool_call>" for n, a in calls)


def glm47(calls: Calls) -> str:
    return "".join(f"<tool_call>{n}" + "".join(f"<arg_key>{k}</arg_key><arg_value>{_t(v)}</arg_value>"
                                               for k, v in a.items()) + "</tool_call>" for n, a in calls)


def hunyuan(calls: Calls) -> str:
    inner = "".join(f"<tool_call>{n}<tool_sep>" + "".join(f"<arg_key>{k}</arg_key><arg_value>{_t(v)}</arg_value>"
                                                           for k, v in a.items()) + "</tool_call>" for n, a in calls)
    return f"<tool_calls>{inner}</tool_calls>"


def jamba(calls: Calls) -> str:
    return "<tool_calls>" + _j([{"name": n, "arguments": a} for n, a in calls]) + "</tool_calls>"


def minimax_m1(calls: Calls) -> str:
    return "<tool_calls>\n" + "\n".join(_j({"name": n, "arguments": a}) for n, a in calls) + "\n</tool_calls>"


def mistral(calls: Calls) -> str:
    return "[TOOL_CALLS] " + _j([{"name": n, "arguments": a, "id": "abcdefghi"} for n, a in calls])


def mistral_v11(calls: Calls) -> str:
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{_j(a)}" for n, a in calls)


def llama3_python_tag(calls: Calls) -> str:
    return "<|python_tag|>" + "; ".join(_j({"name": n, "parameters": a}) for n, a in calls) + "<|eom_id|>"


def llama4_pythonic(calls: Calls) -> str:
    return "<|python_start|>[" + ", ".join(f"{n}({_kw(a)})" for n, a in calls) + "]<|python_end|>"


def lfm2(calls: Calls) -> str:
    return "<|tool_call_start|>[" + ", ".join(f"{n}({_kw(a)})" for n, a in calls) + "]<|tool_call_end|>"


def olmo3(calls: Calls) -> str:
    return "<function_calls>" + "\n".join(f"{n}({_kw(a, _j)})" for n, a in calls) + "</function_calls>"


def anthropic_xml(calls: Calls) -> str:
    inner = "".join(f'<invoke name="{n}">' + "".join(f'<parameter name="{k}">{_t(v)}</parameter>'
                                                    for k, v in a.items()) + "</invoke>" for n, a in calls)
    return f"<function_calls>{inner}</function_calls>"


def granite(calls: Calls) -> str:
    return "<|tool_call|>" + _j([{"name": n, "arguments": a} for n, a in calls])


def granite_31(calls: Calls) -> str:
    return "<tool_call>" + _j([{"name": n, "arguments": a} for n, a in calls])


def gemma4_bare(calls: Calls) -> str:
    return "".join("call:" + n + "{" + ",".join(f"{k}:{_gemma(v, _GQ)}" for k, v in a.items()) + "}"
                   for n, a in calls)


def granite_20b_fc(calls: Calls) -> str:
    return "".join(f"<function_call> {_j({'name': n, 'arguments': a})}" for n, a in calls)


def internlm2(calls: Calls) -> str:
    return "".join(f"<|action_start|><|plugin|>\n{_j({'name': n, 'parameters': a})}<|action_end|>" for n, a in calls)


def kimi_k2(calls: Calls) -> str:
    inner = "".join(f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{_j(a)}<|tool_call_end|>"
                    for i, (n, a) in enumerate(calls))
    return f"<|tool_calls_section_begin|>{inner}<|tool_calls_section_end|>"


_K3 = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}


def kimi_k3(calls: Calls) -> str:
    out = ["<|open|>tools<|sep|>"]
    for i, (n, a) in enumerate(calls, 1):
        out.append(f'<|open|>call tool="{n}" index="{i}"<|sep|>')
        for k, v in a.items():
            kind = _K3.get(type(v), "null")
            out.append(f'<|open|>argument key="{k}" type="{kind}"<|sep|>{_t(v)}<|close|>argument<|sep|>')
        out.append("<|close|>call<|sep|>")
    return "".join(out) + "<|close|>tools<|sep|>"


def _ds(name: str, bar: str = "｜", space: str = "▁") -> str:
    return f"<{bar}{name.replace('_', space)}{bar}>"


def deepseek_v3(calls: Calls) -> str:
    inner = "".join(_ds("tool_call_begin") + "function" + _ds("tool_sep") + f"{n}\n```json\n{_j(a)}\n```"
                    + _ds("tool_call_end") for n, a in calls)
    return _ds("tool_calls_begin") + inner + _ds("tool_calls_end")


def deepseek_v31(calls: Calls) -> str:
    inner = "".join(_ds("tool_call_begin") + n + _ds("tool_sep") + _j(a) + _ds("tool_call_end") for n, a in calls)
    return _ds("tool_calls_begin") + inner + _ds("tool_calls_end")


def _dsml_params(a: dict[str, Any]) -> str:
    return "".join(f'<｜DSML｜parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">{_t(v)}'
                   "</｜DSML｜parameter>\n" for k, v in a.items())


def deepseek_dsml(calls: Calls) -> str:
    inner = "".join(f'<｜DSML｜invoke name="{n}">\n{_dsml_params(a)}</｜DSML｜invoke>\n' for n, a in calls)
    return f"<｜DSML｜function_calls>\n{inner}</｜DSML｜function_calls>"


def deepseek_v4(calls: Calls) -> str:
    inner = "".join(f'<｜DSML｜invoke name="{n}">\n{_dsml_params(a)}</｜DSML｜invoke>\n' for n, a in calls)
    return f"<｜DSML｜tool_calls>\n{inner}</｜DSML｜tool_calls>"


def step3(calls: Calls) -> str:
    inner = "".join("<｜tool_call_begin｜>function<｜tool_sep｜>" + f'<steptml:invoke name="{n}">'
                    + "".join(f'<steptml:parameter name="{k}">{_t(v)}</steptml:parameter>' for k, v in a.items())
                    + "</steptml:invoke><｜tool_call_end｜>" for n, a in calls)
    return f"<｜tool_calls_begin｜>{inner}<｜tool_calls_end｜>"


def minimax(calls: Calls) -> str:
    inner = "".join(f'<invoke name="{n}">\n' + "".join(f'<parameter name="{k}">{_t(v)}</parameter>\n'
                                                      for k, v in a.items()) + "</invoke>\n" for n, a in calls)
    return f"<minimax:tool_call>\n{inner}</minimax:tool_call>"


def minimax_m3(calls: Calls) -> str:
    ns = "]<]minimax[>["
    inner = "".join(f'{ns}<invoke name="{n}">' + "".join(f"{ns}<{k}>{_t(v)}{ns}</{k}>" for k, v in a.items())
                    + f"{ns}</invoke>" for n, a in calls)
    return f"{ns}<tool_call>{inner}{ns}</tool_call>"


def harmony(calls: Calls) -> str:
    head = "<|start|>assistant<|channel|>commentary to=functions."
    return "".join(f"{head}{n} <|constrain|>json<|message|>{_j(a)}<|call|>" for n, a in calls)


def harmony_stripped(calls: Calls) -> str:
    return "".join(f"to=functions.{n} json{_j(a)}" for n, a in calls)


def seed_oss(calls: Calls) -> str:
    return "".join("<seed:tool_call>\n" + f"<function={n}>\n" + "".join(f"<parameter={k}>{_t(v)}</parameter>\n"
                                                                       for k, v in a.items())
                   + "</function>\n</seed:tool_call>" for n, a in calls)


def longcat(calls: Calls) -> str:
    return "".join(f"<longcat_tool_call>{_j({'name': n, 'arguments': a})}</longcat_tool_call>" for n, a in calls)


def phi4_mini(calls: Calls) -> str:
    return "functools" + _j([{"name": n, "arguments": a} for n, a in calls])


def phi4_mini_tags(calls: Calls) -> str:
    return "<|tool_calls|>" + _j([{"name": n, "arguments": a} for n, a in calls]) + "<|/tool_calls|>"


def gemma_tool_code(calls: Calls) -> str:
    return "```tool_code\n" + "\n".join(f"{n}({_kw(a)})" for n, a in calls) + "\n```"


def function_gemma(calls: Calls) -> str:
    def args(a: dict[str, Any]) -> str:
        return ",".join(f"{k}:{_gemma(v, '<escape>')}" for k, v in a.items())

    return "".join("<start_function_call>call:" + n + "{" + args(a) + "}<end_function_call>" for n, a in calls)


_GQ = '<|"|>'


def gemma4(calls: Calls) -> str:
    return "".join("<|tool_call>call:" + n + "{" + ",".join(f"{k}:{_gemma(v, _GQ)}" for k, v in a.items())
                   + "}<tool_call|>" for n, a in calls)


def apertus(calls: Calls) -> str:
    return "<|tools_prefix|>" + _j([{n: a} for n, a in calls]) + "<|tools_suffix|>"


def cohere_command(calls: Calls) -> str:
    body = [{"tool_call_id": str(i), "tool_name": n, "parameters": a} for i, (n, a) in enumerate(calls)]
    return "<|START_ACTION|>" + _j(body) + "<|END_ACTION|>"


def cohere_command_r(calls: Calls) -> str:
    return "Action: ```json\n" + _j([{"tool_name": n, "parameters": a} for n, a in calls]) + "\n```"


def gigachat(calls: Calls) -> str:
    return "".join(f"<|function_call|>{_j({'name': n, 'arguments': a})}" for n, a in calls)


def nemotron(calls: Calls) -> str:
    return "<TOOLCALL>" + _j([{"name": n, "arguments": a} for n, a in calls]) + "</TOOLCALL>"


def inkling(calls: Calls) -> str:
    return "".join(f"<|content_invoke_tool_json|>{_j({'name': n, 'args': a})}<|end_message|>" for n, a in calls)


def dots(calls: Calls) -> str:
    inner = "".join(f'<invoke name="{n}">\n' + "".join(f'<parameter name="{k}">{_t(v)}</parameter>\n'
                                                      for k, v in a.items()) + "</invoke>\n" for n, a in calls)
    return f"<dots_function_call>\n{inner}</dots_function_call>"


def minicpm(calls: Calls) -> str:
    return "".join(f'<function name="{n}">' + "".join(f'<param name="{k}">{_t(v)}</param>' for k, v in a.items())
                   + "</function>" for n, a in calls)


def qwen_agent(calls: Calls) -> str:
    return "".join(f"✿FUNCTION✿: {n}\n✿ARGS✿: {_j(a)}" for n, a in calls)


def hermes_tools_tag(calls: Calls) -> str:
    return "".join(f'<tools>\n{{"name": "{n}", "arguments": {_j(a)}}}\n</tools>' for n, a in calls)


def bare_json(calls: Calls) -> str:
    return "; ".join(_j({"name": n, "parameters": a}) for n, a in calls)


def pythonic(calls: Calls) -> str:
    return "[" + ", ".join(f"{n}({_kw(a)})" for n, a in calls) + "]"


def xlam(calls: Calls) -> str:
    return "```json\n" + _j([{"name": n, "arguments": a} for n, a in calls]) + "\n```"


#: family -> (renderer, can have text around it, strings may hold newlines / edge whitespace)
RENDERERS: dict[str, tuple[Callable[[Calls], str], bool, bool]] = {
    "hermes": (hermes, True, True), "qwen3_coder": (qwen3_coder, True, False),
    "function_json": (function_json, True, True), "glm4_moe": (glm4_moe, True, False),
    "glm47": (glm47, True, False), "hunyuan": (hunyuan, True, False), "jamba": (jamba, True, True),
    "minimax_m1": (minimax_m1, True, True), "mistral": (mistral, False, True),
    "mistral_v11": (mistral_v11, True, True), "llama3_python_tag": (llama3_python_tag, True, True),
    "llama4_pythonic": (llama4_pythonic, True, True), "lfm2": (lfm2, True, True), "olmo3": (olmo3, True, True),
    "anthropic_xml": (anthropic_xml, True, False), "granite": (granite, False, True),
    "granite_20b_fc": (granite_20b_fc, False, True), "granite_31": (granite_31, False, True),
    "gemma4_bare": (gemma4_bare, False, False), "internlm2": (internlm2, True, True),
    "kimi_k2": (kimi_k2, True, True), "kimi_k3": (kimi_k3, True, False), "deepseek_v3": (deepseek_v3, True, True),
    "deepseek_v31": (deepseek_v31, True, True), "deepseek_dsml": (deepseek_dsml, True, False),
    "deepseek_v4": (deepseek_v4, True, False), "step3": (step3, True, False), "minimax": (minimax, True, False),
    "minimax_m3": (minimax_m3, True, False), "harmony": (harmony, True, True),
    "harmony_stripped": (harmony_stripped, False, True), "seed_oss": (seed_oss, True, False),
    "longcat": (longcat, True, True), "phi4_mini": (phi4_mini, False, True),
    "phi4_mini_tags": (phi4_mini_tags, True, True), "gemma_tool_code": (gemma_tool_code, True, True),
    "function_gemma": (function_gemma, True, False), "gemma4": (gemma4, True, False),
    "apertus": (apertus, True, True), "cohere_command": (cohere_command, True, True),
    "cohere_command_r": (cohere_command_r, False, True), "gigachat": (gigachat, False, True),
    "nemotron": (nemotron, True, True), "inkling": (inkling, True, True), "dots": (dots, True, False),
    "minicpm": (minicpm, True, False), "qwen_agent": (qwen_agent, False, True),
    "hermes_tools_tag": (hermes_tools_tag, True, True), "bare_json": (bare_json, False, True),
    "pythonic": (pythonic, False, True), "xlam": (xlam, False, True),
}
