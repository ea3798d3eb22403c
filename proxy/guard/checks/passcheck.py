"""Side checks on a byte-exact pass-through stream: what would break a client, seen without changing a byte.

A tool-less OpenAI Chat stream goes to the client as the upstream sent it. ``PassCheck`` reads the
same bytes on the side and reports what a client's SSE parser would trip on (PROTOCOLS.md 0, 1.5,
1.6, 5): a data line that is not JSON, an in-stream ``error`` object, a stream that ends without a
finish reason and without ``[DONE]`` (a silent truncation), an event left half-sent. It also reads
the usage chunk and counts frames for the audit.

One change to the byte stream, and only in where it is cut: ``feed`` returns the bytes up to the
last line end and keeps the rest of an unfinished line until its end arrives (at most
``max_line`` bytes). A client's SSE parser acts on whole lines only, so it sees nothing later than
it would have; but when the upstream breaks off mid-line, the half line never reaches the client,
and the error event the relay appends cannot be glued to it (openai-python would raise
``JSONDecodeError`` on the glued event instead of ``APIError``). Sans-IO; never raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from proxy.guard.findings import Action, Finding, FindingKind, Severity

K = FindingKind
_decode = json.JSONDecoder().decode


class PassCheck:
    """Feed every upstream chunk (``feed`` returns what to forward now), then ``finish``.

    ``frames``: data events seen; ``usage``: the last usage object; ``done``: ``[DONE]`` seen;
    ``finished``: a non-null ``finish_reason`` seen; ``findings``: what a client would trip on.
    ``secrets``: toolrelay's credentials for the upstream; an answer that echoes one is a finding and the
    credential is replaced by ``[redacted]`` in what is forwarded (the one change the pass-through makes
    to the upstream's bytes: a key reflected by a hostile or buggy upstream never reaches a client, issue 24
    item 12). Secrets are matched in whole lines, so a credential split across chunks is still caught.
    """

    __slots__ = ("max_line", "frames", "usage", "done", "finished", "findings", "_carry", "_open", "_kinds",
                 "error", "_secrets")

    def __init__(self, *, max_line: int = 4 << 20, secrets: Iterable[str] = ()) -> None:
        self.max_line = max_line
        self._secrets = tuple(s.encode() for s in secrets if s)
        self.frames = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.finished = False
        self.error: Any = None  # the first in-stream error object
        self.findings: list[Finding] = []
        self._carry = b""  # an unfinished line held back
        self._open = False  # data lines since the last blank line: an event not dispatched yet
        self._kinds: set[FindingKind] = set()

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` (after what was held) that end with a line end; the rest is held."""
        data = self._carry + chunk if self._carry else chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) <= self.max_line:
            self._carry = data
            return b""
        if cut == 0:  # a line past the bound: forward it rather than hold it without end
            self._note(K.UNPARSEABLE_DATA_FRAME, "an SSE line longer than the bound was forwarded unchecked")
            self._carry = b""
            return self._redacted(data)
        if cut == len(data):  # the usual chunk: whole lines
            ready, self._carry = data, b""
        else:
            ready, self._carry = data[:cut], data[cut:]
            if len(self._carry) > self.max_line:
                ready, self._carry = data, b""
        if self._secrets:
            ready = self._redacted(ready)
        for line in ready.split(b"\n")[:-1]:
            if not line or line == b"\r":
                self._open = False
            elif line[:5] == b"data:":
                self._open = True
                self._data(line[5:].strip())
        return ready

    def _redacted(self, data: bytes) -> bytes:
        """``data`` with every credential of ``secrets`` replaced by ``[redacted]`` (and a finding)."""
        for secret in self._secrets:
            if secret in data:
                self._note(K.CREDENTIAL_REFLECTED, "the upstream's answer contained toolrelay's credential for it; "
                           "it was replaced by [redacted] before it reached the client")
                data = data.replace(secret, b"[redacted]")
        return data

    def _data(self, data: bytes) -> None:
        # Every pass-through frame comes here (budget: 0.15 ms per 21-frame request, issue 11): one JSON
        # parse (is it JSON at all?), then only the fields whose names the frame's bytes contain. A frame
        # with a JSON escape could spell a key with one (``"us\u0061ge"``): it takes every check.
        self.frames += 1
        if data[:6] == b"[DONE]":
            self.done = True
            return
        try:
            obj = _decode(data.decode())  # SSE is UTF-8 (WHATWG HTML 9.2.5): other bytes are not a frame
        except ValueError:  # UnicodeDecodeError included
            self._note(K.UNPARSEABLE_DATA_FRAME, "a data line of the pass-through stream is not JSON")
            return
        if type(obj) is not dict:
            return
        escaped = b"\\u" in data
        if (escaped or b'"error"' in data) and obj.get("error"):
            self.error = self.error or obj["error"]
            self._note(K.MID_STREAM_ERROR_CHUNK, "an in-stream error object reached the client", Action.ERROR)
        if escaped or b'"usage"' in data:
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self.usage = usage
        if not self.finished and (escaped or b'"finish_reason"' in data):
            choices = obj.get("choices")
            if isinstance(choices, list):
                for choice in choices:
                    if isinstance(choice, dict) and choice.get("finish_reason"):
                        self.finished = True
                        break

    @property
    def half_sent(self) -> bool:
        """True when the client has data lines of an event that no blank line dispatched yet."""
        return self._open

    @property
    def broken_off(self) -> bool:
        """True when the stream ended with neither a finish reason nor ``[DONE]``: a truncated success."""
        return not (self.done or self.finished)

    def finish(self) -> list[Finding]:
        """The end of the upstream body: the findings (a held unfinished line is dropped, and noted)."""
        if self._carry.strip():
            self._note(K.FUSED_TRUNCATED_SSE_FRAMES, "the stream ended inside a line (not forwarded)")
        self._carry = b""
        if self.broken_off:
            self._note(K.MISSING_FINISH_REASON, "stream ended without finish_reason and without [DONE]",
                       Action.ERROR)
        elif not self.done:
            self._note(K.EOF_WITHOUT_DONE, "stream ended without [DONE]", Action.NORMALIZED)
        return self.findings

    def _note(self, kind: FindingKind, detail: str, action: Action = Action.IGNORED) -> None:
        if kind in self._kinds:
            return
        self._kinds.add(kind)
        severity = {Action.ERROR: Severity.ERROR, Action.NORMALIZED: Severity.INFO}.get(action, Severity.WARNING)
        self.findings.append(Finding(kind, severity, action, detail, frame=self.frames))
