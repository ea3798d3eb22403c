"""Tool calls leaked into text channels as model markup -> tool calls (fault family C and beyond).

The families (Hermes / Qwen ``<tool_call>``, DeepSeek V3 / V3.1 / DSML, Kimi K2, MiniMax, Qwen3-Coder
``<function=…>``, Mistral ``[TOOL_CALLS]``, Llama, Harmony, GLM, Gemma, LFM2, … : docs/dialects.md)
live in ``proxy.guard.dialects``; this module drives them over a stream.

``MarkupScanner`` is incremental, one per choice and channel: ``feed(text)`` returns the text safe
to release now, holding back only what could still be the start of a marker (a few characters:
``<tool`` or a trailing ``functo``), the inside of an open block, and, at the very start of a
channel, text that may still be a bare call list (``[get_weather(…)]``, ``{"name": …}``), which
counts only when the whole channel is exactly that. One combined scan finds every family's opener
per delta (``dialects.matcher``); a complete block becomes tool calls and leaves the text.

Findings: the C26 / C27 / C29 / C31 kinds for their families, ``function-tag-markup-in-content``
for ``<function=…>``, ``tool-call-markup-in-content`` (the detail names the family) for the rest;
an unreadable block after a special token is a retry (``leaked-markup-unparseable``); after an
ordinary word it is text. Text that names a declared tool next to call syntax no family read is
an ``unrecognized-markup`` finding (non-fatal), with the frames it came in.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from proxy.guard.dialects import matcher
from proxy.guard.dialects.base import Ctx, Dialect, MarkupError, Parsed
from proxy.guard.dialects.block import Block
from proxy.guard.dialects.segment import WholeSegment
from proxy.guard.dialects.suspect import suspicious
from proxy.guard.dialects.tokens import NORM
from proxy.guard.findings import Action, Finding, FindingKind, Severity, Where, cap_fragment
from proxy.guard.turn import ToolCall, ToolSpec

K = FindingKind
#: Families reported with their own (corpus) kinds; every other family is TOOL_CALL_MARKUP_IN_CONTENT.
KINDS = {
    "hermes": K.HERMES_TOOL_CALL_TAGS_IN_CONTENT,
    "deepseek_v3": K.DEEPSEEK_SPECIAL_TOKENS_IN_CONTENT,
    "deepseek_v31": K.DEEPSEEK_SPECIAL_TOKENS_IN_CONTENT,
    "deepseek_dsml": K.DEEPSEEK_SPECIAL_TOKENS_IN_CONTENT,
    "kimi_k2": K.KIMI_SECTION_TOKENS_IN_CONTENT,
    "minimax": K.MINIMAX_XML_IN_CONTENT,
    "qwen3_coder": K.FUNCTION_TAG_MARKUP_IN_CONTENT,
    "function_json": K.FUNCTION_TAG_MARKUP_IN_CONTENT,
}
_PARSE_ERRORS = (MarkupError, ValueError, TypeError, KeyError, IndexError, RecursionError)


@dataclass(slots=True)
class ScanResult:
    """What one ``feed``/``finish`` produced: releasable text, recovered calls, findings."""

    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)


class MarkupScanner:
    """Incremental leaked-markup extractor for one choice and channel.

    ``tools`` are the declared tools (their schemas type XML-ish values; their names decide the
    markerless and word-marker families); ``allow`` is ``policy.allows(Repair.LEAKED_MARKUP)``:
    when False every recognised block is a retry finding instead of a repair.
    """

    def __init__(self, choice: int, tools: tuple[ToolSpec, ...], *, allow: bool = True) -> None:
        self.choice = choice
        self.allow = allow
        self.ctx = Ctx.of(tools)
        self._lead = WholeSegment(self.ctx)
        self._buf = ""  # released-text tail that may still start a marker
        self._block: Block | None = None
        self._before = ""  # the last character released (word markers must start a word)

        self._released: list[str] = []
        self._marks: list[int] = []  # offset in the released text where each frame's text starts
        self._frames: list[int | None] = []
        self._size = 0

    def feed(self, text: str, where: Where | None = None) -> ScanResult:
        """Take a text delta; return the text safe to release and any calls completed by it."""
        out = ScanResult()
        if text:
            w = where or Where()
            self._marks.append(self._size)
            self._frames.append(w.frame)
            if self._lead.active:
                text = self._lead.feed(text)
            if text:
                self._scan(text, out, w)
        return out

    def finish(self, where: Where | None = None) -> ScanResult:
        """End of the channel: a held candidate is read, an open block is read leniently (or rejected),
        the held tail is released, and released text is checked for unrecognised call syntax."""
        out, w = ScanResult(), where or Where()
        if self._lead.active:
            raw = self._lead.held
            text, parsed = self._lead.finish()
            if parsed is not None:
                self._recovered(parsed, "", raw, out, w, closed=True)
            if text:
                self._scan(text, out, w)
        if self._block is not None:
            block, self._block = self._block, None
            end = block.final_end()
            self._close(block, end, out, w, closed=end < len(block.text))
            if end < len(block.text):
                self._scan(block.text[end:], out, w)
        self._release(self._buf, out)
        self._buf = ""
        self._suspects(out)
        return out

    # -- the stream ------------------------------------------------------------------------------

    def _scan(self, text: str, out: ScanResult, where: Where) -> None:
        rest: str | None = text
        while rest is not None:
            rest = self._in_block(rest, out, where) if self._block is not None else self._outside(rest, out)

    def _outside(self, text: str, out: ScanResult) -> str | None:
        """Release text up to an opener (or a possible one); the text after an opener, or None."""
        buf = self._buf + text if self._buf else text
        self._buf = ""
        hit = matcher.find(buf, self._before)
        if hit is None:
            self._release(buf, out)
            return None
        start, end, dialect = hit
        self._release(buf[:start], out)
        if dialect is None:
            self._buf = buf[start:]
            return None
        self._block = Block(dialect, buf[start:end], self.ctx)
        return buf[end:]

    def _in_block(self, text: str, out: ScanResult, where: Where) -> str | None:
        """Grow the open block; when it ends (or proves not to be markup) the text after it."""
        block = self._block
        assert block is not None
        block.feed(text)
        if not block.plausible():
            self._block = None
            self._release(block.text[: block.opener_len], out)
            return block.text[block.opener_len :]
        end = block.end()
        if end is None:
            return None
        self._block = None
        self._close(block, end, out, where, closed=True)
        return block.text[end:] or None

    def _close(self, block: Block, end: int, out: ScanResult, where: Where, *, closed: bool) -> None:
        """Read a finished block: calls and a finding, a retry, or (weak marker) text."""
        d, text = block.dialect, block.text[:end]
        body = _body(d, text, block.opener_len)
        try:
            parsed = d.parse(body, self.ctx)
            if not parsed.calls:
                raise MarkupError("no tool call inside the block")
            if not d.strong and any(c.name not in self.ctx.names for c in parsed.calls):
                raise MarkupError("a word marker names an undeclared tool")
        except _PARSE_ERRORS as exc:
            if d.strong:
                self._finding(out, K.LEAKED_MARKUP_UNPARSEABLE, Action.RETRY, where, text,
                              f"unparseable {d.family} tool-call markup in text: {exc}")
            else:
                self._release(text, out)
            return
        self._recovered(parsed, d.family, text, out, where, closed=closed)

    def _recovered(self, parsed: Parsed, marker: str, text: str, out: ScanResult, where: Where, *,
                   closed: bool) -> None:
        action = Action.REPAIRED if self.allow else Action.RETRY
        kind = KINDS.get(parsed.family, K.TOOL_CALL_MARKUP_IN_CONTENT)
        tail = "" if closed else " (unclosed at end of text)"
        label = parsed.family if kind is not K.TOOL_CALL_MARKUP_IN_CONTENT else f"[{parsed.family}] "
        detail = (f"{label}{len(parsed.calls)} tool call(s) recovered from {parsed.family} markup in text{tail}"
                  if kind is K.TOOL_CALL_MARKUP_IN_CONTENT
                  else f"{len(parsed.calls)} tool call(s) recovered from {parsed.family} markup in text{tail}")
        self._finding(out, kind, action, where, text or "", detail)
        out.calls.extend(parsed.calls)

    def _release(self, text: str, out: ScanResult) -> None:
        if text:
            out.text += text
            self._released.append(text)
            self._size += len(text)
            self._before = text[-1]

    # -- findings -----------------------------------------------------------------------------

    def _finding(self, out: ScanResult, kind: FindingKind, action: Action, where: Where, block: str,
                 detail: str) -> None:
        severity = Severity.WARNING if action == Action.REPAIRED else Severity.ERROR
        out.findings.append(Finding(kind, severity, action, detail, self.choice, None, where.frame,
                                    where.offset, cap_fragment(block)))

    def _suspects(self, out: ScanResult) -> None:
        """Released text that calls a declared tool in a syntax no dialect knows (non-fatal)."""
        if not self._released:
            return
        text = "".join(self._released)
        for start, end in suspicious(text, self.ctx.names):
            frames = self._frames_of(start, end)
            shown = ", ".join(str(f) for f in frames) or "?"
            detail = (f"text names a declared tool next to call-like syntax no known dialect reads "
                      f"(left as text): {text[start:end][:80]!r}; frames {shown}")
            first = frames[0] if frames else None
            out.findings.append(Finding(K.UNRECOGNIZED_MARKUP, Severity.WARNING, Action.IGNORED, detail,
                                        self.choice, None, first, None,
                                        cap_fragment(text[max(0, start - 200) : end + 200])))

    def _frames_of(self, start: int, end: int) -> list[int]:
        """The frames whose released text covers ``start:end`` (approximate: frames of the feeds)."""
        lo = max(0, bisect.bisect_right(self._marks, start) - 1)
        hi = max(lo + 1, bisect.bisect_left(self._marks, end))
        return [f for f in self._frames[lo:hi] if f is not None]


def _body(d: Dialect, text: str, opener_len: int) -> str:
    """The block text between its opener and its closer (or trailer), whichever ended it."""
    body = text[opener_len:]
    norm = body.translate(NORM) if d.fuzzy else body
    for end in (*d.closers, *d.trailers):
        if norm.endswith(end):
            return body[: len(body) - len(end)]
    return body


def extract_markup(text: str, tools: tuple[ToolSpec, ...], choice: int = 0, *,
                   allow: bool = True) -> ScanResult:
    """Whole-text convenience (non-stream answers): ``feed(text)`` then ``finish()``, merged."""
    scanner = MarkupScanner(choice, tools, allow=allow)
    first, last = scanner.feed(text), scanner.finish()
    return ScanResult(first.text + last.text, first.calls + last.calls, first.findings + last.findings)
