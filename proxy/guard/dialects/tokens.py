"""Recognisers built on special tokens: DeepSeek V3 / V3.1 / R1, Step3, Kimi K2, Gemma, InternLM2.

DeepSeek writes its bar and space as ``｜`` and ``▁``; gateways re-encode them as ``|`` and ``_``,
so both spellings are read alike (``NORM``). Shapes: vLLM ``deepseekv3_tool_parser`` (``function
<sep>name\\n```json{…}```''), ``deepseekv31_tool_parser`` (``name<sep>{…}``), ``step3_tool_parser``
(``function<sep><steptml:invoke …>``), ``kimi_k2`` (``functions.NAME:N<|tool_call_argument_begin|>{…}``),
``functiongemma_tool_parser`` / ``gemma4`` (``call:NAME{key:<escape>v<escape>}`` /
``{key:<|"|>v<|"|>}``), ``internlm2_tool_parser`` (``<|plugin|>{"name", "parameters"}``).
"""

from __future__ import annotations

import re
from typing import Any

from proxy.guard.dialects.base import Ctx, MarkupError, Parsed, call_from_obj, json_values, make_call, unfence

NORM = str.maketrans({"｜": "|", "▁": "_", "‖": "|"})
_SEGMENT = re.compile(r"<\|tool_call_begin\|>(.*?)(?:<\|tool_call_end\|>|(?=<\|tool_call_begin\|>)|\Z)", re.S)
_KIMI_NAME = re.compile(r"\A(?:functions\.)?(.+?)(?::\d+)?\Z", re.S)


def special(body: str, ctx: Ctx) -> Parsed:
    """Sections of ``<|tool_call_begin|>…<|tool_call_end|>`` segments (DeepSeek, Step3 or Kimi).

    Markers are found in the normalised text; values are cut from the raw text (``NORM`` maps one
    character to one character, so positions agree) so ``▁`` inside an argument survives.
    """
    raw, norm = body, body.translate(NORM)
    if "<|tool_call_begin|>" not in norm and ("<|tool_sep|>" in norm or "<|tool_call_argument_begin|>" in norm):
        raw, norm = "<|tool_call_begin|>" + raw, "<|tool_call_begin|>" + norm  # a bare segment
    family, calls = "deepseek_v3", []
    for m in _SEGMENT.finditer(norm):
        seg, nseg = raw[m.start(1) : m.end(1)], m.group(1)
        if "<|tool_call_argument_begin|>" in nseg:
            family = "kimi_k2"
            cut = nseg.index("<|tool_call_argument_begin|>")
            args = seg[cut + len("<|tool_call_argument_begin|>") :]
            calls.append(make_call(_kimi_name(seg[:cut]), unfence(args.strip()) or "{}"))
        elif "<|tool_sep|>" in nseg:
            fam, call = _deepseek(seg, nseg.index("<|tool_sep|>"), ctx)
            family = fam if family == "deepseek_v3" else family
            calls.extend(call)
        elif seg.strip():
            raise MarkupError("tool call segment without a separator")
    if not calls:
        raise MarkupError("no tool call inside the block")
    return Parsed(family, calls)


def _kimi_name(head: str) -> str:
    """Kimi ids are ``functions.<name>:<n>``: the bare name (C29)."""
    m = _KIMI_NAME.match(head.strip())
    return m.group(1) if m else head


def _deepseek(seg: str, cut: int, ctx: Ctx) -> tuple[str, list[Any]]:
    """``function<sep>name\\n```json{…}```'' (V3 / R1), ``name<sep>{…}`` (V3.1), Step3's invoke XML."""
    left, right = seg[:cut].strip(), seg[cut + len("<|tool_sep|>") :]
    if "<steptml:invoke" in right:
        from proxy.guard.dialects.xmlish import steptml

        return "step3", steptml(right, ctx)
    if left in ("", "function"):
        name, _, args = right.lstrip().partition("\n")
        if not args.strip() and "{" in name:
            name, brace, rest = name.partition("{")
            args = brace + rest
        return "deepseek_v3", [make_call(name, unfence(args.strip()) or "{}")]
    return "deepseek_v31", [make_call(left, unfence(right.strip()) or "{}")]


_GEMMA_CALL = re.compile(r"call:([\w.\-]+)\s*\{(.*)\}\s*\Z", re.S)


def gemma4(body: str, ctx: Ctx) -> Parsed:
    """Gemma 4 ``call:NAME{key:<|"|>text<|"|>,n:5,obj:{…},arr:[…]}`` (vLLM ``parser/gemma4.py``)."""
    return Parsed("gemma4", [_gemma_call(body, '<|"|>')])


def function_gemma(body: str, ctx: Ctx) -> Parsed:
    """FunctionGemma ``call:NAME{key:<escape>text<escape>,…}`` (vLLM ``functiongemma_tool_parser``)."""
    return Parsed("function_gemma", [_gemma_call(body, "<escape>")])


def _gemma_call(body: str, quote: str) -> Any:
    m = _GEMMA_CALL.match(body.strip())
    if m is None:
        raise MarkupError("expected call:NAME{…}")
    value, end = _GemmaArgs(m.group(2), quote).mapping(0, "")
    return make_call(m.group(1), value)


class _GemmaArgs:
    """Gemma's bare-key dictionary syntax: strings between quote tokens, other scalars verbatim."""

    def __init__(self, text: str, quote: str) -> None:
        self.text, self.q = text, quote

    def mapping(self, i: int, close: str) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        while True:
            i = self._skip(i)
            if i >= len(self.text) or self.text.startswith(close, i) and close:
                return out, i + len(close)
            colon = self.text.find(":", i)
            if colon < 0:
                raise MarkupError("Gemma argument without ':'")
            key = self.text[i:colon].strip().removeprefix(self.q).removesuffix(self.q)
            out[key], i = self.value(colon + 1)

    def value(self, i: int) -> tuple[Any, int]:
        i = self._skip(i, ws_only=True)
        t = self.text
        if t.startswith(self.q, i):
            end = t.find(self.q, i + len(self.q))
            if end < 0:
                raise MarkupError("unterminated Gemma string")
            return t[i + len(self.q) : end], end + len(self.q)
        if t.startswith("{", i):
            return self.mapping(i + 1, "}")
        if t.startswith("[", i):
            return self.sequence(i + 1)
        m = re.compile(r"[^,}\]]*").match(t, i)
        raw = m.group().strip() if m else ""
        return _scalar(raw), (m.end() if m else i)

    def sequence(self, i: int) -> tuple[list[Any], int]:
        items: list[Any] = []
        while True:
            i = self._skip(i)
            if i >= len(self.text):
                raise MarkupError("unterminated Gemma array")
            if self.text[i] == "]":
                return items, i + 1
            item, i = self.value(i)
            items.append(item)

    def _skip(self, i: int, *, ws_only: bool = False) -> int:
        chars = " \t\r\n" if ws_only else " \t\r\n,"
        while i < len(self.text) and self.text[i] in chars:
            i += 1
        return i


def _scalar(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def internlm2(body: str, ctx: Ctx) -> Parsed:
    """InternLM2 ``<|action_start|><|plugin|>\\n{"name": …, "parameters": {…}}<|action_end|>``."""
    text = body.strip().removeprefix("<|plugin|>").strip()
    return Parsed("internlm2", [call_from_obj(v) for v in json_values(text)])
