"""The seam of a cut text stream and its continuation: what the client read, and the continuation's
bytes made to look like the rest of the same stream. Sans-IO; never raises on any input bytes.

When an upstream cuts a tool-less text stream after text reached the client, and the upstream accepts a
trailing assistant message as a prefix (``proxy.guard.decisions.continuation``), the relay asks for the
continuation of exactly the delivered text. Two pieces here:

- ``Transcript`` reads the bytes the client was sent (whole SSE lines, as ``PassCheck.feed`` returns
  them) and keeps what a continuation needs: the text of choice 0's ``delta.content`` the client holds
  (bounded by ``cap`` characters), the first chunk's ``id`` / ``created`` / ``model``, and whether the
  stream is still continuable (a single choice, text only: no reasoning, refusal or tool-call delta,
  no finish reason, no ``[DONE]``, no in-stream error).
- ``Stitcher`` rewrites the continuation's bytes event by event: ``id``, ``created``, ``model`` set to the
  first attempt's (one completion id per stream, PROTOCOLS.md section 0), the continuation's role-only
  opening chunk dropped (the client has its role chunk), every other event passed on in order. An event
  is released when its blank line arrives, so a continuation cut mid-event sends nothing of that event
  (its text is not in the transcript either, and the next continuation asks from there).

Rewritten events are re-serialised as compact JSON with non-ASCII kept as UTF-8: after a seam the bytes
are no longer the upstream's, the text is. An SSE line is only read whole, so a cut inside a multi-byte
UTF-8 sequence or inside a line never puts half a character or half a line in the transcript.
"""

from __future__ import annotations

import json
from typing import Any

_decode = json.JSONDecoder().decode
#: Identity fields of a ``chat.completion.chunk`` the continuation takes over from the first attempt.
IDENTITY = ("id", "created", "model")
_ID_BOUND = 512  # characters of an id or model name kept (an upstream's strings are bounded)


def _data_obj(line: bytes) -> Any:
    """The JSON value of an SSE ``data:`` line, or None (not data, ``[DONE]``, not JSON)."""
    if line[:5] != b"data:":
        return None
    payload = line[5:].strip()
    if payload[:6] == b"[DONE]":
        return None
    try:
        return _decode(payload.decode())
    except (ValueError, RecursionError):  # UnicodeDecodeError included
        return None


class Transcript:
    """What the client of a pass-through (or rewritten) stream was sent, as far as a continuation cares.

    Feed it the bytes the client received, in order (``feed``). ``text``: choice 0's content so far;
    ``identity``: the first chunk's ``id`` / ``created`` / ``model`` (absent keys left out); ``open``: the
    client has data lines of an event no blank line has dispatched yet; ``why_not``: "" while a
    continuation is possible, else why not (a short phrase for the audit).
    """

    __slots__ = ("cap", "max_line", "identity", "open", "why_not", "finished", "_parts", "_size", "_carry")

    def __init__(self, *, cap: int, max_line: int = 4 << 20) -> None:
        self.cap = cap  # characters of delivered text past which no continuation is asked
        self.max_line = max_line
        self.identity: dict[str, Any] = {}
        self.open = False
        self.why_not = ""
        self.finished = False  # a finish reason or [DONE] reached the client: nothing to continue
        self._parts: list[str] = []
        self._size = 0
        self._carry = b""

    @property
    def text(self) -> str:
        """Choice 0's ``delta.content`` the client has received."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    @property
    def continuable(self) -> bool:
        """True when a continuation can give the client the rest: text delivered, nothing else in the way."""
        return not self.why_not and not self.finished and self._size > 0

    def feed(self, data: bytes) -> None:
        """Read ``data`` (bytes the client was sent); a line is read once its line end arrives."""
        if self.why_not:
            return
        data = self._carry + data if self._carry else data
        cut = data.rfind(b"\n") + 1
        self._carry = data[cut:]
        if len(self._carry) > self.max_line:
            self._stop("an SSE line past its bound")
            return
        for line in data[:cut].split(b"\n")[:-1]:
            line = line.removesuffix(b"\r")
            if not line:
                self.open = False
                continue
            if line[:5] != b"data:":
                continue  # comments, event:, id:, retry: carry no text
            self.open = True
            if line[5:].strip()[:6] == b"[DONE]":
                self.finished = True
                continue
            self._chunk(_data_obj(line))

    def _chunk(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            self._stop("a data line that is not a JSON object")
            return
        if obj.get("error"):
            self._stop("an in-stream error")
            return
        if not self.identity:
            self.identity = {k: v for k in IDENTITY if _identity_value(v := obj.get(k))}
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            self._choice(choice)

    def _choice(self, choice: Any) -> None:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            self._stop("more than one choice")
            return
        if choice.get("finish_reason"):
            self.finished = True
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        if any(delta.get(k) for k in ("reasoning_content", "reasoning", "refusal", "tool_calls", "function_call")):
            self._stop("a delta other than text")
            return
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._size += len(content)
            if self._size > self.cap:
                self._stop(f"more than {self.cap} characters of text delivered")
                return
            self._parts.append(content)

    def _stop(self, why: str) -> None:
        self.why_not = self.why_not or why
        self._parts, self._carry = [], b""


def _identity_value(value: Any) -> bool:
    if isinstance(value, str):
        return 0 < len(value) <= _ID_BOUND
    return isinstance(value, int) and not isinstance(value, bool)


class Stitcher:
    """The continuation's bytes as the rest of the first attempt's stream (see the module docstring).

    ``identity``: the first attempt's ``id`` / ``created`` / ``model`` (``Transcript.identity``). ``feed``
    returns what to send now (whole events only); ``max_event`` bounds an event held while its blank line
    is awaited (past it the event is dropped and ``overflowed`` set: the relay ends the stream).
    """

    __slots__ = ("identity", "max_event", "overflowed", "_carry", "_event", "_held")

    def __init__(self, identity: dict[str, Any], *, max_event: int = 4 << 20) -> None:
        self.identity = dict(identity)
        self.max_event = max_event
        self.overflowed = False
        self._carry = b""
        self._event: list[bytes] = []
        self._held = 0

    def feed(self, data: bytes) -> bytes:
        """The whole events of ``data`` (after what was held), rewritten; the rest is held."""
        if self.overflowed:
            return b""
        data = self._carry + data if self._carry else data
        cut = data.rfind(b"\n") + 1
        self._carry = data[cut:]
        out: list[bytes] = []
        for line in data[:cut].split(b"\n")[:-1]:
            line = line.removesuffix(b"\r")
            if line:
                self._event.append(line)
                self._held += len(line)
            elif self._event:
                out.append(self._release())
        if self._held + len(self._carry) > self.max_event:
            self.overflowed = True
            self._event, self._carry, self._held = [], b"", 0
        return b"".join(out)

    def flush(self) -> bytes:
        """At the end of a complete continuation: the held event whose blank line never came (its whole
        lines; an unfinished line is dropped), rewritten."""
        if self.overflowed or not self._event:
            return b""
        self._carry = b""
        return self._release()

    def _release(self) -> bytes:
        lines, self._event, self._held = self._event, [], 0
        kept: list[bytes] = []
        for line in lines:
            obj = _data_obj(line)
            if not isinstance(obj, dict):
                kept.append(line)  # comments, [DONE], anything not a chunk: as it came
            elif not _role_only(obj):
                kept.append(b"data: " + json.dumps({**obj, **self.identity}, ensure_ascii=False,
                                                   separators=(",", ":")).encode())
        return b"".join(line + b"\n" for line in kept) + b"\n" if kept else b""


def _role_only(obj: dict[str, Any]) -> bool:
    """True for an opening chunk that only says ``role: assistant`` (content empty or absent)."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    delta = choice.get("delta")
    if choice.get("finish_reason") or not isinstance(delta, dict) or "role" not in delta:
        return False
    return all(k == "role" or not v for k, v in delta.items()) and not obj.get("usage")
