"""Tool calls leaked into text channels as model markup -> tool calls (fault family C).

Recognised forms (``shared/fault-cases/CASES.md`` C26-C31 and their relatives):

- Hermes / Qwen ``<tool_call>{"name":…,"arguments":…}</tool_call>`` (C26), also wrapping the
  ``<function=…>`` form (Qwen3-Coder);
- DeepSeek special tokens ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name
  ```json …``` <｜tool▁call▁end｜><｜tool▁calls▁end｜>`` with ``▁``/``_`` and ``｜``/``|`` variants,
  the V3.1 ``name<｜tool▁sep｜>{…}`` shape and DSML ``<｜DSML｜function_calls>`` residue (C27);
- Kimi K2 ``<|tool_calls_section_begin|><|tool_call_begin|>functions.name:0
  <|tool_call_argument_begin|>{…}<|tool_call_end|>…`` (C29);
- MiniMax ``<minimax:tool_call><invoke name=…><parameter name=…>v</parameter></invoke>`` with
  parameter text coerced to the declared schema type (C31);
- ``<function=name>{…}</function>`` and ``<function=name><parameter=k>v</parameter></function>``.

``MarkupScanner`` is incremental, one per choice and channel: ``feed(text)`` returns the text safe
to release now, holding back only a tail that could still be the start of a marker (so plain text
streams with a few characters of delay at most, and ``<`` followed by non-marker text is released
as soon as it cannot be one). Complete blocks become tool calls and are removed from the text; an
unparseable block is a retry finding. Work per delta is proportional to the new text (marker
search starts where the previous one stopped).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from proxy.guard.findings import Action, Finding, FindingKind, Severity, Where, cap_fragment
from proxy.guard.turn import ToolCall, ToolSpec, synthesize_call_id

K = FindingKind
# DeepSeek's full-width bar and "▁" are matched as their ASCII spellings; one char each, so
# positions in the normalised text are positions in the raw text.
_NORM = str.maketrans({"｜": "|", "▁": "_"})


@dataclass(frozen=True, slots=True)
class _Marker:
    opener: str
    closer: str
    family: str


_MARKERS = (
    _Marker("<tool_call>", "</tool_call>", "hermes"),
    _Marker("<|tool_calls_begin|>", "<|tool_calls_end|>", "deepseek"),
    _Marker("<|tool_calls|>", "<|tool_calls_end|>", "deepseek"),
    _Marker("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "kimi"),
    _Marker("<|tool_call_section_begin|>", "<|tool_call_section_end|>", "kimi"),
    _Marker("<|tool_call_begin|>", "<|tool_call_end|>", "special"),
    _Marker("<|DSML|function_calls>", "</|DSML|function_calls>", "dsml"),
    _Marker("<minimax:tool_call>", "</minimax:tool_call>", "minimax"),
    _Marker("<function=", "</function>", "function"),
)
_LONGEST = max(len(m.opener) for m in _MARKERS)
_KINDS = {
    "hermes": K.HERMES_TOOL_CALL_TAGS_IN_CONTENT,
    "deepseek": K.DEEPSEEK_SPECIAL_TOKENS_IN_CONTENT,
    "dsml": K.DEEPSEEK_SPECIAL_TOKENS_IN_CONTENT,
    "kimi": K.KIMI_SECTION_TOKENS_IN_CONTENT,
    "minimax": K.MINIMAX_XML_IN_CONTENT,
    "function": K.FUNCTION_TAG_MARKUP_IN_CONTENT,
}

_CALL_SEGMENT = re.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_end\|>", re.S)
_INVOKE = re.compile(r"<invoke\s+name\s*=\s*[\"']?([^\"'>]+)[\"']?\s*>(.*?)</invoke>", re.S)
_PARAM = re.compile(r"<parameter\s+name\s*=\s*[\"']?([^\"'>\s]+)[\"']?([^>]*)>(.*?)</parameter>", re.S)
_EQ_PARAM = re.compile(r"<parameter=([^>\s]+)\s*>(.*?)</parameter>", re.S)
_FENCE = re.compile(r"\A\s*```[a-zA-Z0-9]*\s*(.*?)\s*```\s*\Z", re.S)
_KIMI_NAME = re.compile(r"\A(?:functions\.)?(.+?)(?::\d+)?\Z", re.S)


class MarkupError(ValueError):
    """A block that looks like leaked tool-call markup but cannot be read as calls."""


@dataclass(slots=True)
class ScanResult:
    """What one ``feed``/``finish`` produced: releasable text, recovered calls, findings."""

    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)


class MarkupScanner:
    """Incremental leaked-markup extractor for one choice and channel.

    ``tools`` are the declared tools (their schemas type MiniMax / ``<parameter=…>`` values);
    ``allow`` is ``policy.allows(Repair.LEAKED_MARKUP)``: when False every recognised block is a
    retry finding instead of a repair.
    """

    def __init__(self, choice: int, tools: tuple[ToolSpec, ...], *, allow: bool = True) -> None:
        self.choice = choice
        self.allow = allow
        self._schemas = {t.name: t.parameters or {} for t in tools}
        self._buf = ""  # raw text not released yet
        self._norm = ""  # ``_buf`` normalised (same length)
        self._block: _Marker | None = None
        self._searched = 0  # inside a block: closer search resumes here

    def feed(self, text: str, where: Where | None = None) -> ScanResult:
        """Take a text delta; return the text safe to release and any calls completed by it."""
        out = ScanResult()
        if text:
            self._buf += text
            self._norm += text.translate(_NORM)
            self._scan(out, where or Where())
        return out

    def finish(self, where: Where | None = None) -> ScanResult:
        """End of the channel: release a held tail; an unclosed block is read leniently or rejected."""
        out = ScanResult()
        if self._block is not None:
            marker, block = self._block, self._buf
            self._reset("")
            self._parse(marker, block, out, where or Where(), closed=False)
        out.text += self._buf
        self._reset("")
        return out

    def _reset(self, rest: str) -> None:
        self._buf, self._norm = rest, rest.translate(_NORM)
        self._block, self._searched = None, 0

    def _scan(self, out: ScanResult, where: Where) -> None:
        while True:
            if self._block is not None and not self._close_block(out, where):
                return
            if self._block is None and not self._open_block(out):
                return

    def _open_block(self, out: ScanResult) -> bool:
        """Release text up to a marker (or a possible marker start); True when a block opened."""
        norm, i = self._norm, 0
        while (p := norm.find("<", i)) >= 0:
            tail = norm[p : p + _LONGEST]
            marker = next((m for m in _MARKERS if tail.startswith(m.opener)), None)
            if marker is not None:
                out.text += self._buf[:p]
                self._reset(self._buf[p:])
                self._block, self._searched = marker, len(marker.opener)
                return True
            if len(tail) < _LONGEST and p + len(tail) == len(norm) and _could_open(tail):
                out.text += self._buf[:p]
                self._reset(self._buf[p:])
                return False
            i = p + 1
        out.text += self._buf
        self._reset("")
        return False

    def _close_block(self, out: ScanResult, where: Where) -> bool:
        """Find the block's closer; parse the block when found (True), else keep holding."""
        marker = self._block
        assert marker is not None
        end = self._norm.find(marker.closer, self._searched)
        if end < 0:
            self._searched = max(self._searched, len(self._norm) - len(marker.closer) + 1)
            return False
        stop = end + len(marker.closer)
        block, rest = self._buf[:stop], self._buf[stop:]
        self._reset(rest)
        self._parse(marker, block, out, where, closed=True)
        return True

    def _parse(self, marker: _Marker, block: str, out: ScanResult, where: Where, *, closed: bool) -> None:
        try:
            family, calls = _parse_block(marker, block, self._schemas)
        except MarkupError as exc:
            self._finding(out, K.LEAKED_MARKUP_UNPARSEABLE, Action.RETRY, where, block,
                          f"unparseable {marker.family} tool-call markup in text: {exc}")
            return
        action = Action.REPAIRED if self.allow else Action.RETRY
        tail = "" if closed else " (unclosed at end of text)"
        self._finding(out, _KINDS[family], action, where, block,
                      f"{len(calls)} tool call(s) recovered from {family} markup in text{tail}")
        out.calls.extend(calls)

    def _finding(self, out: ScanResult, kind: FindingKind, action: Action, where: Where, block: str,
                 detail: str) -> None:
        severity = Severity.WARNING if action == Action.REPAIRED else Severity.ERROR
        out.findings.append(Finding(kind, severity, action, detail, self.choice, None, where.frame,
                                    where.offset, cap_fragment(block)))


def _could_open(tail: str) -> bool:
    """True when ``tail`` (shorter than every opener it is compared with) may still become one."""
    return any(m.opener.startswith(tail) for m in _MARKERS)


def extract_markup(text: str, tools: tuple[ToolSpec, ...], choice: int = 0, *,
                   allow: bool = True) -> ScanResult:
    """Whole-text convenience (non-stream answers): ``feed(text)`` then ``finish()``, merged."""
    scanner = MarkupScanner(choice, tools, allow=allow)
    first, last = scanner.feed(text), scanner.finish()
    return ScanResult(first.text + last.text, first.calls + last.calls, first.findings + last.findings)


# -- block parsers ---------------------------------------------------------------------------


def _parse_block(marker: _Marker, block: str, schemas: dict[str, dict[str, Any]]) -> tuple[str, list[ToolCall]]:
    """(family, calls) for one complete block text (opener and closer included)."""
    body = block[len(marker.opener) :]
    if block.translate(_NORM).endswith(marker.closer):
        body = body[: len(body) - len(marker.closer)]
    family = marker.family
    if family == "hermes":
        calls = _hermes(body, schemas)
    elif family in ("deepseek", "kimi", "special"):
        family, calls = _special(block, family)
    elif family == "dsml":
        calls = _invokes(re.sub(r"[|｜]DSML[|｜]", "", body), schemas)
    elif family == "minimax":
        calls = _invokes(body, schemas)
    else:
        calls = [_function_tag(body, schemas)]
    if not calls:
        raise MarkupError("no tool call inside the block")
    return family, calls


def _call(name: str, arguments: Any) -> ToolCall:
    """A recovered call: raw argument text (validation repairs and checks it) or a serialised value."""
    name = name.strip()
    if not name:
        raise MarkupError("empty tool name")
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(synthesize_call_id(), name, text)


def _hermes(body: str, schemas: dict[str, dict[str, Any]]) -> list[ToolCall]:
    """``{"name":…,"arguments":{…}}`` objects (one or more, optionally fenced) or ``<function=…>``."""
    text = _unfence(body.strip())
    if text.startswith("<function="):
        return [_function_tag(text[len("<function=") :].removesuffix("</function>"), schemas)]
    calls: list[ToolCall] = []
    decoder = json.JSONDecoder(strict=False)
    i = 0
    while i < len(text):
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError) as exc:
            raise MarkupError(f"not JSON ({exc})") from None
        calls.extend(_hermes_value(value))
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
    return calls


def _hermes_value(value: Any) -> list[ToolCall]:
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise MarkupError("JSON without a tool name")
        args = item.get("arguments", item.get("parameters", {}))
        calls.append(_call(item["name"], {} if args is None else args))
    return calls


def _special(block: str, family: str) -> tuple[str, list[ToolCall]]:
    """DeepSeek (``tool_sep``) and Kimi (``tool_call_argument_begin``) call segments."""
    norm = block.translate(_NORM)
    calls: list[ToolCall] = []
    kimi = family == "kimi"
    for m in _CALL_SEGMENT.finditer(norm):
        seg, nseg = block[m.start(1) : m.end(1)], m.group(1)
        if "<|tool_call_argument_begin|>" in nseg:
            kimi = True
            cut = nseg.index("<|tool_call_argument_begin|>")
            head, args = seg[:cut], seg[cut + len("<|tool_call_argument_begin|>") :]
            calls.append(_call(_kimi_name(head), _unfence(args.strip())))
        elif "<|tool_sep|>" in nseg:
            calls.append(_deepseek_call(seg, nseg.index("<|tool_sep|>")))
        else:
            raise MarkupError("tool call segment without a separator")
    if family == "special":
        family = "kimi" if kimi else "deepseek"
    return family, calls


def _kimi_name(head: str) -> str:
    """Kimi ids are ``functions.<name>:<n>``: the bare name (C29)."""
    m = _KIMI_NAME.match(head.strip())
    return m.group(1) if m else head


def _deepseek_call(seg: str, cut: int) -> ToolCall:
    """``function<sep>name\\n```json{…}```'' (V3) or ``name<sep>{…}`` (V3.1)."""
    left, right = seg[:cut].strip(), seg[cut + len("<|tool_sep|>") :]
    if left in ("", "function"):
        name, _, args = right.lstrip().partition("\n")
    else:
        name, args = left, right
    return _call(name, _unfence(args.strip()) or "{}")


def _invokes(body: str, schemas: dict[str, dict[str, Any]]) -> list[ToolCall]:
    """MiniMax / DSML ``<invoke name=…><parameter name=…>v</parameter></invoke>`` (C31)."""
    calls = []
    for m in _INVOKE.finditer(body):
        name = m.group(1).strip()
        props = _properties(schemas.get(name))
        args = {p.group(1): _param_value(p.group(3), props.get(p.group(1)), p.group(2))
                for p in _PARAM.finditer(m.group(2))}
        calls.append(_call(name, args))
    return calls


def _function_tag(rest: str, schemas: dict[str, dict[str, Any]]) -> ToolCall:
    """``name>{…}`` / ``name{…}`` (Groq ``failed_generation``) / ``name><parameter=k>v</parameter>``."""
    m = re.match(r"\s*([^>{\s]+)\s*>?", rest)
    if m is None:
        raise MarkupError("function tag without a name")
    name, body = m.group(1), rest[m.end() :].strip()
    if body.startswith("<parameter="):
        props = _properties(schemas.get(name))
        return _call(name, {p.group(1): _param_value(p.group(2), props.get(p.group(1)), "")
                            for p in _EQ_PARAM.finditer(body)})
    return _call(name, _unfence(body) or "{}")


def _properties(schema: dict[str, Any] | None) -> dict[str, Any]:
    props = (schema or {}).get("properties")
    return props if isinstance(props, dict) else {}


def _param_value(raw: str, prop: Any, attrs: str) -> Any:
    """Parameter text typed by the declared schema (C31): strings stay text, the rest JSON-parsed."""
    text = raw.removeprefix("\n").removesuffix("\n")
    types = _types(prop)
    if 'string="true"' in attrs or "string" in types:
        return text
    if types or 'string="false"' in attrs:
        return _json_or(text.strip())
    return text  # undeclared parameter: keep the model's text


def _types(prop: Any) -> set[str]:
    if not isinstance(prop, dict):
        return set()
    t = prop.get("type")
    if isinstance(t, str):
        return {t}
    return {x for x in t if isinstance(x, str)} if isinstance(t, list) else set()


def _json_or(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _unfence(text: str) -> str:
    """The inside of a Markdown code fence, or ``text`` unchanged."""
    m = _FENCE.match(text)
    return m.group(1) if m else text
