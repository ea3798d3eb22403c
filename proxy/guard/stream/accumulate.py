"""Upstream ``chat.completion.chunk`` events -> one ``Turn`` per attempt, absorbing dialect quirks.

Implements the "Cross-cutting rules" of ``shared/fault-cases/CASES.md`` (families A, B, D, E) in
three layers, each in its own module:

- here, the envelope and frame rules: SSE-level notes (``data:`` without space, comments,
  unterminated events; C38, C40), ``[DONE]``, in-band errors (C41, C43), unparseable frames (C45), a
  changed completion id (another generation, fatal), set-once turn identity, usage, usage-only and
  filter chunks (C36, C37);
- ``proxy.guard.stream.choice`` and ``proxy.guard.stream.slot_table``: one accumulator per choice, its text,
  tool-call slots (C01-C19) and finish reasons;
- ``proxy.guard.stream.resolve``: the end of the attempt, slots -> calls and one finish reason per choice
  (C08, C14, C19, C24, C32-C34).

Every absorbed anomaly becomes a ``Finding`` tied to its frame (number, byte offset, capped text),
collected in order by one ``proxy.guard.stream.notes.Notes``. The accumulator never raises on any chunk
shape.

Envelope tolerance, the rule (issue 12, item 3). The canonical turn is what a conforming
``chat.completion.chunk`` stream means (PROTOCOLS.md 1.3-1.5). An upstream answer that says the same
thing in another way is normalised to it, always with a finding (``ENVELOPE_VARIANT`` unless a
corpus kind names the case): another envelope shape than asked for (a whole ``chat.completion`` or a
``message`` inside a stream, ``choices`` as one object, ``tool_calls`` as one object); deprecated
fields with the same meaning (``function_call`` for ``tool_calls``, ``finish_reason``
``function_call`` / Anthropic's ``tool_use`` / ``end_turn`` / ``max_tokens``); type variants of a
known field whose value is unambiguous (arguments as an object, C13; an index as a numeric string;
an id missing, C08). Empty or meaningless events (a chunk with no choices, a choice with no delta,
empty text) are ignored with a finding. Signals that contradict each other are decided by what was
assembled, with a finding (``finish_reason: stop`` with calls is ``tool_calls``, C32; ``tool_calls``
with no call is ``stop``; the same call twice is one, ``DUPLICATE_TOOL_CALL``). What cannot be
normalised without a guess -- a ``delta`` that is not an object, a choice index the request did not
ask for (``proxy.guard.stream.integrity``) -- breaks the attempt: retried, never delivered changed.
"""

from __future__ import annotations

from typing import Any

from proxy.guard.checks.repair import resolve_name
from proxy.guard.checks.validate import arguments_accepted
from proxy.guard.findings import Action, Finding, FindingKind, Where
from proxy.guard.policy import GuardPolicy
from proxy.guard.stream.choice import ChoiceAccumulator
from proxy.guard.stream.errors import classify_inband_error
from proxy.guard.stream.integrity import CHUNK_KEYS, has_surrogate_escape
from proxy.guard.stream.notes import AccItem, Notes
from proxy.guard.stream.resolve import ChoiceResolver
from proxy.guard.stream.slots import NOT_JSON, SlotClosed, ident, loads_lenient, resolve_slot_name
from proxy.guard.stream.sse import SSEEvent
from proxy.guard.turn import RequestSpec, ToolCall, Turn, UpstreamError

K = FindingKind

__all__ = ["AccItem", "Accumulator", "SlotClosed", "resolve_slot_name"]


class Accumulator:
    """Feeds on SSE events (``feed``) or chunk dicts (``feed_chunk``); ``resolve()`` builds the turn.

    Outputs per call: ``TextDelta`` (raw text per choice/channel, before markup scanning),
    ``Finding`` and ``SlotClosed`` items in stream order. ``error`` holds the first in-band upstream
    error; ``done`` whether ``[DONE]`` was seen; ``frames`` the number of SSE events read.
    """

    def __init__(self, request: RequestSpec, policy: GuardPolicy, *, stream: bool = True) -> None:
        self.request = request
        self.policy = policy
        self.stream = stream
        self.names = request.names
        self.notes = Notes()
        self.choices: dict[int, ChoiceAccumulator] = {}
        self.error: UpstreamError | None = None
        self.done = False
        self.frames = 0
        self.usage: dict[str, Any] | None = None
        self.turn_id: str | None = None
        self.model: str | None = None
        self.created: int | None = None
        self.fingerprint: str | None = None

    @property
    def fatal(self) -> bool:
        """True once a fatal finding was recorded."""
        return self.notes.fatal

    # -- SSE level ----------------------------------------------------------------------------

    def feed(self, ev: SSEEvent) -> list[AccItem]:
        """Absorb one SSE event (PROTOCOLS.md 5; C38, C40, C43, C45, ``[DONE]``)."""
        self.frames += 1
        self.notes.where = Where(ev.frame, ev.offset, ev.raw)
        self._sse_notes(ev)
        if self.done:
            self.notes.note(K.NON_CHUNK_FRAME, Action.IGNORED, "frame after [DONE] ignored")
            return self.notes.take()
        if ev.error is not None:
            self._error_field(ev.error)
        elif ev.has_data:
            self._data(ev.data, ev.event, ev.invalid_utf8)
        return self.notes.take()

    def _sse_notes(self, ev: SSEEvent) -> None:
        if ev.no_space:
            self.notes.note(K.SSE_DATA_WITHOUT_SPACE, Action.NORMALIZED, "data line without space after colon")
        if ev.comments:
            self.notes.note(K.SSE_COMMENT_KEEPALIVES, Action.IGNORED, f"SSE comment ignored: {ev.comments[0][:80]}")
        if not ev.terminated:
            self.notes.note(K.EOF_WITHOUT_DONE, Action.NORMALIZED, "last event not terminated by a blank line")

    def _error_field(self, value: str) -> None:
        """A non-standard ``error:`` SSE field (llama.cpp, C43)."""
        parsed = loads_lenient(value)
        obj = value if parsed is NOT_JSON else parsed
        self._upstream_error(K.NONSTANDARD_SSE_ERROR_FIELD, obj, "error: SSE field")

    def _data(self, data: str, event: str, invalid_utf8: bool = False) -> None:
        stripped = data.strip()
        if stripped.startswith("[DONE]"):
            self.done = True
            return
        if not stripped:
            self.notes.note(K.NON_CHUNK_FRAME, Action.IGNORED, "empty data frame ignored")
            return
        obj = loads_lenient(data)
        self.notes.inspected = False
        if isinstance(obj, dict):
            escapes = "\\ud" in data or "\\uD" in data  # has_surrogate_escape, inline: once per frame
            if invalid_utf8 or escapes or not CHUNK_KEYS.issuperset(obj):  # deeper levels check their own keys
                self.notes.inspect(obj, invalid_utf8=invalid_utf8, escapes=escapes)
        elif invalid_utf8:
            self.notes.note(K.INVALID_UTF8_IN_FRAME, Action.RETRY, "a frame with bytes that are not UTF-8",
                            once=False)
        if obj is NOT_JSON:
            self._unparseable(data)
        elif event == "error" and isinstance(obj, dict) and "error" not in obj:
            self._upstream_error(K.MID_STREAM_ERROR_CHUNK, obj, "event: error frame")
        else:
            self._chunk(obj)

    def _unparseable(self, data: str) -> None:
        """C45: a frame that is not JSON (fused with the next one when ``data:`` appears inline)."""
        if "data:" in data:
            self.notes.note(K.FUSED_TRUNCATED_SSE_FRAMES, Action.RETRY,
                            "truncated data frame fused with the next frame", once=False)
        else:
            self.notes.note(K.UNPARSEABLE_DATA_FRAME, Action.RETRY, "data frame is not JSON", once=False)

    def _upstream_error(self, kind: FindingKind, obj: Any, where: str) -> None:
        error = classify_inband_error(obj)
        if self.error is None:
            self.error = error
        action = Action.RETRY if error.retryable else Action.ERROR
        self.notes.note(kind, action, f"upstream error in {where}: {error.message[:300]}", once=False)

    def feed_chunk(self, obj: Any, where: Where | None = None, *, invalid_utf8: bool = False) -> list[AccItem]:
        """Absorb one parsed chunk (a ``chat.completion.chunk`` dict, PROTOCOLS.md 1.3); ``invalid_utf8``:
        its text had bytes that are not UTF-8 (decoded as U+FFFD)."""
        self.notes.where = where or Where()
        self.notes.inspected = False
        if isinstance(obj, dict):
            self.notes.inspect(obj, invalid_utf8=invalid_utf8, escapes=has_surrogate_escape(self.notes.where.raw))
        self._chunk(obj)
        return self.notes.take()

    def _chunk(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            self.notes.note(K.NON_CHUNK_FRAME, Action.RETRY, "data frame is JSON but not an object", once=False)
            return
        err = obj.get("error")
        if err:
            self._upstream_error(K.MID_STREAM_ERROR_CHUNK, err, "chunk")
            return
        if not self._identity(obj):
            return
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        self._choices(obj)

    def _identity(self, obj: dict[str, Any]) -> bool:
        """Set-once turn identity; False when the completion id changed (C45: another generation)."""
        cid = ident(obj.get("id"))
        if cid is None:
            self.notes.note(K.IDENTITY_FIELD_BLANK, Action.IGNORED, "chunk without a completion id")
        elif self.turn_id is None:
            self.turn_id = cid
        elif cid != self.turn_id:
            self.notes.note(K.COMPLETION_ID_CHANGED, Action.RETRY,
                            f"completion id changed from {self.turn_id[:60]} to {cid[:60]}: another generation")
            return False
        self.model = self.model or ident(obj.get("model"))
        created = obj.get("created")
        if self.created is None and isinstance(created, int) and created > 0:
            self.created = created
        self.fingerprint = self.fingerprint or ident(obj.get("system_fingerprint"))
        return True

    def _choices(self, obj: dict[str, Any]) -> None:
        choices = obj.get("choices")
        if isinstance(choices, dict) and ("delta" in choices or "message" in choices or "finish_reason" in choices):
            self.notes.note(K.ENVELOPE_VARIANT, Action.NORMALIZED, "choices sent as one object, not a list")
            choices = [choices]
        if isinstance(choices, list) and choices:
            for c in choices:
                if isinstance(c, dict):
                    self._choice(c)
        elif "prompt_filter_results" in obj:
            self.notes.note(K.CONTENT_FILTER_ANNOTATION_CHUNKS, Action.IGNORED, "prompt filter chunk skipped")
        elif isinstance(choices, list) or "usage" in obj:
            usage_only = isinstance(obj.get("usage"), dict)
            # Asked for with stream_options.include_usage, this chunk is the protocol (PROTOCOLS.md 1.4),
            # not a quirk: only unrequested ones are findings (C36).
            if not (usage_only and self.request.usage_requested):
                detail = "usage-only chunk" if usage_only else "chunk with no choices"
                self.notes.note(K.USAGE_ONLY_CHUNK_EMPTY_CHOICES, Action.IGNORED, detail)
        else:
            self.notes.note(K.NON_CHUNK_FRAME, Action.IGNORED, "JSON frame without choices ignored")

    def _choice(self, c: dict[str, Any]) -> None:
        idx = c.get("index")
        if type(idx) is not int or idx < 0:
            idx = self._index(idx)
        if idx and idx >= self.request.n:
            self._unrequested(idx, c)
            return
        self._choice_for(idx).feed(c)

    def _index(self, idx: Any) -> int:
        """A choice index: an int; a numeric string normalised (a type variant); else 0 (absent index)."""
        if isinstance(idx, int) and not isinstance(idx, bool) and idx >= 0:
            return idx
        if isinstance(idx, str) and idx.isascii() and idx.isdigit() and len(idx) < 6:
            self.notes.note(K.ENVELOPE_VARIANT, Action.NORMALIZED, f"choice index sent as the string {idx!r}")
            return int(idx)
        return 0

    def _unrequested(self, idx: int, c: dict[str, Any]) -> None:
        """A choice the request did not ask for (index >= n): never delivered as another choice, never
        folded into one; retried when it carries anything (text, a tool call, a finish reason)."""
        delta = c.get("delta") if isinstance(c.get("delta"), dict) else c.get("message")
        payload = (isinstance(delta, dict) and any(v not in (None, "", [], {}) for v in delta.values())) \
            or ident(c.get("finish_reason")) is not None \
            or any(v not in (None, "", [], {}) for k, v in c.items() if k not in ("index", "delta", "message"))
        action = Action.RETRY if payload else Action.IGNORED
        self.notes.note(K.UNREQUESTED_CHOICE_INDEX, action,
                        f"choice index {idx} on a request for n={self.request.n}", once=not payload)

    def _choice_for(self, index: int) -> ChoiceAccumulator:
        ch = self.choices.get(index)
        if ch is None:
            ch = self.choices[index] = ChoiceAccumulator(index, self.names, self.policy, self.notes,
                                                         stream=self.stream)
        return ch

    # -- end of stream ---------------------------------------------------------------------------

    def close(self) -> list[AccItem]:
        """EOF: record a missing ``[DONE]`` (PROTOCOLS.md 1.5)."""
        self.notes.where = Where()
        if self.stream and not self.done:
            self.notes.note(K.EOF_WITHOUT_DONE, Action.NORMALIZED, "stream ended without [DONE]")
        return self.notes.take()

    def _resolver(self) -> ChoiceResolver:
        return ChoiceResolver(self.names, self.policy, self.notes, terminated=self.done or not self.stream,
                              accepts=self._accepts, parallel=self.request.parallel_tool_calls)

    def _accepts(self, name: str, value: dict[str, Any]) -> bool:
        return arguments_accepted(self.request, self.policy, name, value)

    def closed_call(self, choice: int, position: int) -> tuple[ToolCall, list[AccItem]]:
        """The call of a closed slot as it stands (id minted now if missing, C08) and new findings."""
        self.notes.where = Where()
        call, _ = self._resolver().slot_call(choice, self.choices[choice].slots[position])
        return call, self.notes.take()

    def slot_name(self, choice: int, position: int) -> str | None:
        """The name slot ``position`` of ``choice`` amounts to so far, or None before any name fragment."""
        frags = self.choices[choice].slots[position].names
        return resolve_slot_name(frags, self.names, self.policy) if frags else None

    def slot_names(self) -> dict[tuple[int, int], str]:
        """The tool name each slot amounts to so far, by (choice, slot position); '' when unnamed
        (declared spelling when a repair resolves it). Findings are named with it, also of aborted attempts."""
        out = {}
        for i, ch in self.choices.items():
            for slot in ch.slots:
                name = resolve_slot_name(slot.names, self.names, self.policy)
                out[(i, slot.position)] = resolve_name(name, self.names, self.policy) or name
        return out

    def resolve(self, texts: dict[tuple[int, str], str],
                extra_calls: dict[int, list[ToolCall]] | None = None) -> tuple[Turn, list[Finding]]:
        """Build the turn: slots -> calls (dedup, synthesized ids), texts, one finish per choice.

        ``texts`` is the text per (choice, channel) (markup-cleaned, from the attempt); ``extra_calls``
        are calls recovered from text, appended per choice. Returns the turn and the findings of the
        resolution (C08, C14, C19, C24, C32, duplicates, missing finish reason).
        """
        self.notes.where = Where()
        extra_calls = extra_calls or {}
        turn = Turn(id=self.turn_id, model=self.model, created=self.created,
                    system_fingerprint=self.fingerprint, usage=self.usage)
        resolver = self._resolver()
        for i in sorted(set(self.choices) | set(extra_calls) | {i for i, _ in texts}):
            turn.choices.append(resolver.choice(self._choice_for(i), texts, extra_calls.get(i, [])))
        return turn, [f for f in self.notes.take() if isinstance(f, Finding)]
