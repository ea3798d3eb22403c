"""Bytes the protocol does not allow, inside a parsed chunk: never a silently changed call (issue 12, item 5).

The rule. An upstream chunk is JSON text in UTF-8 (RFC 8259 section 8.1; the SSE stream itself is
UTF-8, PROTOCOLS.md 5.1), with the keys of ``chat.completion.chunk`` (PROTOCOLS.md 1.3). Three
things in a frame are not what the protocol allows, and each is a finding:

- bytes that are not UTF-8 (the SSE decoder decoded them as U+FFFD and flagged the event);
- a lone UTF-16 surrogate, sent as a ``\\ud800``-style JSON escape (a raw surrogate is not UTF-8);
- at a known position of the chunk (the chunk, a choice, a delta, a tool call, its function), a key
  that holds invalid UTF-8 or is one edit away (insertion, deletion, substitution, transposition)
  from a key known at that position (at least four characters long outside tool calls, where
  vendors add short keys): ``"d\\x80elta"``, ``"delat"``, ``"argumnets"``, ``"ix"`` in a tool call.
  Other unknown keys are vendor extensions and are ignored.

Where such a thing touches a tool call (its id, name or arguments; a corrupted key in a choice, a
delta or a tool call -- what it held is lost, and text may carry a call in markup -- or a corrupted
chunk-level key whose value is an object or a list) the attempt is broken: ``Action.RETRY``, never
delivered changed. In text (content, reasoning, refusal) a U+FFFD is what any client decoder would
show and is kept (``NORMALIZED``; but on a request with tools, whose text is read for calls, the
attempt retries it at the end, ``AttemptGuard``); a lone surrogate there is replaced by U+FFFD (a client cannot
encode it: the Anthropic SDK raised ``UnicodeEncodeError``). Elsewhere (completion id, model) a
surrogate is replaced and the finding is ``IGNORED``.

Cost: on a clean frame one ``frozenset.issuperset`` per level (C speed), and the string walk only
when the event had invalid bytes or the data holds a ``\\ud``/``\\uD`` escape. Sans-IO; never raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from proxy.guard.findings import Action, FindingKind

K = FindingKind

CHUNK_KEYS = frozenset({"id", "object", "created", "model", "choices", "usage", "system_fingerprint",
                        "service_tier", "error", "prompt_filter_results", "obfuscation", "provider",
                        "citations", "x_groq", "nvext"})
CHOICE_KEYS = frozenset({"index", "delta", "finish_reason", "logprobs", "message", "content_filter_results",
                         "content_filter_offsets", "stop_reason", "matched_stop", "native_finish_reason",
                         "text"})
DELTA_KEYS = frozenset({"role", "content", "reasoning_content", "reasoning", "tool_calls", "function_call",
                        "refusal", "audio", "annotations", "name", "reasoning_details", "thinking",
                        "tool_call_id"})
TOOL_KEYS = frozenset({"index", "id", "type", "function"})
FUNCTION_KEYS = frozenset({"name", "arguments"})
TEXT_KEYS = frozenset({"content", "reasoning_content", "reasoning", "refusal"})
_SURROGATE = re.compile("[\ud800-\udfff]")
_NEAR_MIN = 4  # shorter known keys ("id") have too many one-edit neighbours among vendor keys


@dataclass(frozen=True, slots=True)
class Problem:
    """One protocol violation in a chunk: its kind, what is done (``RETRY`` when it touches a tool call,
    ``NORMALIZED`` in text, ``IGNORED`` elsewhere) and a sentence for the finding."""

    kind: FindingKind
    action: Action
    detail: str

    @property
    def touches_call(self) -> bool:
        """True when the attempt is broken (a tool call is touched)."""
        return self.action is Action.RETRY


def has_surrogate_escape(data: str) -> bool:
    """True when the JSON text may hold a surrogate escape (cheap pre-check, false positives allowed)."""
    return "\\ud" in data or "\\uD" in data


def has_lone_surrogate(text: str) -> bool:
    """True when ``text`` (a parsed Python string) holds a UTF-16 surrogate code point."""
    return _SURROGATE.search(text) is not None


def inspect_chunk(obj: dict[str, Any], *, invalid_utf8: bool, escapes: bool) -> list[Problem]:
    """The protocol violations of one parsed chunk (module docstring); lone surrogates outside tool
    calls are replaced by U+FFFD in ``obj`` in place. ``invalid_utf8``: the SSE event had bytes that
    are not UTF-8; ``escapes``: its data may hold surrogate escapes (``has_surrogate_escape``)."""
    if not (invalid_utf8 or escapes) and keys_known(obj):
        return []  # the common case, in C-speed set checks: nothing to walk
    walk = _Walk(invalid_utf8, escapes)
    walk.chunk(obj)
    if invalid_utf8 and not walk.problems:
        walk.add(K.INVALID_UTF8_IN_FRAME, Action.IGNORED,
                 "bytes that are not UTF-8 outside text and tool calls (decoded as U+FFFD)")
    return walk.problems


class _Walk:
    """One chunk's walk: known levels, their keys, and (when flagged) their strings."""

    __slots__ = ("bad", "esc", "problems")

    def __init__(self, bad: bool, esc: bool) -> None:
        self.bad = bad
        self.esc = esc
        self.problems: list[Problem] = []

    def add(self, kind: FindingKind, action: Action, detail: str) -> None:
        self.problems.append(Problem(kind, action, detail))

    def chunk(self, obj: dict[str, Any]) -> None:
        self.keys(obj, CHUNK_KEYS, "chunk", call_level=False)
        for key in ("id", "model", "system_fingerprint"):
            if isinstance(obj.get(key), str):
                obj[key] = self.plain(obj[key], key)
        choices = obj.get("choices")
        for c in choices if isinstance(choices, list) else ():
            if isinstance(c, dict):
                self.choice(c)

    def choice(self, c: dict[str, Any]) -> None:
        self.keys(c, CHOICE_KEYS, "choice", call_level=False)
        for key in ("delta", "message"):
            if isinstance(c.get(key), dict):
                self.delta(c[key])

    def delta(self, d: dict[str, Any]) -> None:
        self.keys(d, DELTA_KEYS, "delta", call_level=False)
        if self.bad or self.esc:
            for key in TEXT_KEYS & d.keys():
                d[key] = self.text(d[key], key)
        calls = d.get("tool_calls")
        for tc in calls if isinstance(calls, list) else [calls] if isinstance(calls, dict) else ():
            if isinstance(tc, dict):
                self.tool(tc)
        fc = d.get("function_call")
        if isinstance(fc, dict):
            self.function(fc, "function_call")

    def tool(self, tc: dict[str, Any]) -> None:
        self.keys(tc, TOOL_KEYS, "tool call", call_level=True)
        for key in ("id", "type", "index"):
            self.call_string(tc.get(key), f"tool call {key}")
        fn = tc.get("function")
        if isinstance(fn, dict):
            self.function(fn, "function")

    def function(self, fn: dict[str, Any], where: str) -> None:
        self.keys(fn, FUNCTION_KEYS, where, call_level=True)
        self.call_string(fn.get("name"), "tool name")
        self.call_string(fn.get("arguments"), "tool arguments")

    # -- keys --------------------------------------------------------------------------------------

    def keys(self, obj: dict[str, Any], known: frozenset[str], level: str, *, call_level: bool) -> None:
        if known.issuperset(obj):
            return  # the common case: every key known
        for key in [k for k in obj if k not in known]:
            if not isinstance(key, str) or not _corrupted(key, known, 1 if call_level else _NEAR_MIN):
                continue  # a vendor extension: ignored
            # Below the chunk a lost key is a lost index, finish reason or text, and text may carry a
            # call in markup: the attempt is broken. At the chunk level so is a lost object or list (the
            # choices); a lost scalar (model, created) changes no call.
            touches = call_level or level != "chunk" or isinstance(obj[key], dict | list)
            action = Action.RETRY if touches else Action.IGNORED
            self.add(K.CORRUPTED_KEY, action, f"{level} key {key[:40]!r} is corrupted")

    # -- strings -----------------------------------------------------------------------------------

    def call_string(self, value: Any, what: str) -> None:
        """Any string inside a tool call's field: invalid bytes or a surrogate break the call."""
        if not (self.bad or self.esc) or value is None:
            return
        for s in _strings(value):
            if self.bad and "\ufffd" in s:
                self.add(K.INVALID_UTF8_IN_FRAME, Action.RETRY, f"bytes that are not UTF-8 in the {what}")
                return
            if self.esc and has_lone_surrogate(s):
                self.add(K.LONE_SURROGATE, Action.RETRY, f"a lone surrogate in the {what}")
                return

    def text(self, value: Any, key: str) -> Any:
        if isinstance(value, str):
            return self._text_string(value, key)
        if isinstance(value, list):
            for part in value:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    part["text"] = self._text_string(part["text"], key)
        return value

    def _text_string(self, s: str, key: str) -> str:
        if self.bad and "\ufffd" in s:
            self.add(K.INVALID_UTF8_IN_FRAME, Action.NORMALIZED,
                                         f"bytes that are not UTF-8 in {key} text, kept as U+FFFD")
        if self.esc and has_lone_surrogate(s):
            self.add(K.LONE_SURROGATE, Action.NORMALIZED, f"a lone surrogate in {key} text, replaced by U+FFFD")
            return _SURROGATE.sub("\ufffd", s)
        return s

    def plain(self, s: str, key: str) -> str:
        if self.esc and has_lone_surrogate(s):
            self.add(K.LONE_SURROGATE, Action.IGNORED, f"a lone surrogate in the chunk {key}, replaced")
            return _SURROGATE.sub("\ufffd", s)
        return s


def keys_known(obj: dict[str, Any]) -> bool:
    """True when every key at every known level of ``obj`` (a parsed chunk) is a known one: then, with
    no invalid bytes and no surrogate escape in the frame, ``inspect_chunk`` has nothing to find."""
    if not CHUNK_KEYS.issuperset(obj):
        return False
    choices = obj.get("choices")
    for c in choices if type(choices) is list else ():
        if type(c) is not dict:
            continue
        if not CHOICE_KEYS.issuperset(c):
            return False
        d = c.get("delta")
        if type(d) is not dict:
            d = c.get("message")
            if type(d) is not dict:
                continue
        if not DELTA_KEYS.issuperset(d):
            return False
        calls = d.get("tool_calls")
        if calls and not _calls_known(calls):
            return False
        fc = d.get("function_call")
        if type(fc) is dict and not FUNCTION_KEYS.issuperset(fc):
            return False
    return True


def _calls_known(calls: Any) -> bool:
    for tc in calls if type(calls) is list else [calls]:
        if type(tc) is not dict:
            continue
        if not TOOL_KEYS.issuperset(tc):
            return False
        fn = tc.get("function")
        if type(fn) is dict and not FUNCTION_KEYS.issuperset(fn):
            return False
    return True


def _corrupted(key: str, known: frozenset[str], min_len: int) -> bool:
    """A key with invalid UTF-8 / a surrogate, or one edit from a known key of ``min_len`` characters or more."""
    if "\ufffd" in key or has_lone_surrogate(key):
        return True
    return any(len(k) >= min_len and _one_edit(key, k) for k in known)


def _strings(value: Any) -> list[str]:
    """Every string (keys included) inside a JSON value."""
    out: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            out.extend(k for k in v if isinstance(k, str))
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return out


def _one_edit(a: str, b: str) -> bool:
    """True when ``a`` != ``b`` and one insertion, deletion, substitution or adjacent transposition
    turns one into the other (optimal string alignment distance 1)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = 0
    while i < len(short) and short[i] == long[i]:
        i += 1
    return short[i:] == long[i + 1:]
