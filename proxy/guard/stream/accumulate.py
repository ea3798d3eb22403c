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

from collections.abc import Iterator
from typing import Any

from proxy.guard.checks.repair import resolve_name
from proxy.guard.checks.validate import arguments_accepted
from proxy.guard.findings import Action, Finding, FindingKind, Where
from proxy.guard.policy import GuardPolicy
from proxy.guard.reading import Read, Reading, read
from proxy.guard.stream.choice import ChoiceAccumulator
from proxy.guard.stream.errors import classify_inband_error
from proxy.guard.stream.integrity import CHUNK_KEYS, has_surrogate_escape
from proxy.guard.stream.notes import AccItem, Notes
from proxy.guard.stream.resolve import ChoiceResolver
from proxy.guard.stream.slots import NOT_JSON, SlotClosed, ident, loads_lenient, resolve_slot_name, split_values
from proxy.guard.stream.sse import SSEEvent
from proxy.guard.turn import RequestSpec, ToolCall, Turn, UpstreamError

K = FindingKind

__all__ = ["AccItem", "Accumulator", "SlotClosed", "resolve_slot_name"]


#: The fewest distinct completion ids that make "an id per chunk" the unique envelope reading (two ids
#: are as much another generation); MAX_IDS bounds the ids kept.
PER_CHUNK_IDS = 3
MAX_IDS = 100_000


def _has_role(obj: dict[str, Any]) -> bool:
    """True when a chunk carries a ``role`` in a delta (after chunks without one: the turn restarts)."""
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return False
    return any(isinstance(c, dict) and isinstance(c.get("delta"), dict) and c["delta"].get("role")
               for c in choices)


#: The most events one data value is read as (framing reading); more is a broken frame.
MAX_EVENTS_PER_VALUE = 256


def split_frame(data: str) -> Read[tuple[str, ...]]:
    """The framing readings (``proxy.guard.reading``) of an SSE data value that is not one JSON value.

    Upstreams that omit the blank line between events (each ``data:`` line a whole chunk) make a
    spec-conforming decoder join the lines with ``\\n`` (PROTOCOLS.md 5.1). Candidates: *one value per
    line* and *concatenated values* (``{...}{...}``); a reading is valid when it yields 2 to
    ``MAX_EVENTS_PER_VALUE`` values, each a JSON object or ``[DONE]`` (last). The texts of the events.
    """
    return read(_frame_readings(data), _frame_valid)


def _frame_readings(data: str) -> Iterator[Reading[tuple[str, ...]]]:
    lines = tuple(line.strip() for line in data.split("\n") if line.strip())
    if len(lines) >= 2:
        yield Reading("one value per line", lines)
    values, rest = split_values(data)
    if len(values) >= 2 and not rest.strip():
        yield Reading("concatenated values", tuple(values))
    elif len(values) >= 1 and rest.strip() == "[DONE]":
        yield Reading("concatenated values", (*values, "[DONE]"))


def _frame_valid(pieces: tuple[str, ...]) -> bool:
    if not 2 <= len(pieces) <= MAX_EVENTS_PER_VALUE:
        return False
    for i, p in enumerate(pieces):
        if p == "[DONE]" and i == len(pieces) - 1:
            continue
        if not isinstance(loads_lenient(p), dict):
            return False
    return True


def _bare(obj: dict[str, Any]) -> bool:
    """True when a chunk carries nothing of a turn: every choice's delta empty (no role, text or call);
    a finish reason and usage may be there."""
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return True
    for c in choices:
        delta = c.get("delta") if isinstance(c, dict) else None
        if isinstance(delta, dict) and any(v not in (None, "", [], {}) for v in delta.values()):
            return False
    return True


def chunk_usage(obj: dict[str, Any], notes: Notes) -> dict[str, Any] | None:
    """A chunk's usage: the top-level ``usage``; else a ``usage`` object inside a choice (Moonshot's
    Kimi API, earendil-works/pi#2017), read as the turn's usage with an envelope-variant finding."""
    usage = obj.get("usage")
    if isinstance(usage, dict):
        return usage
    choices = obj.get("choices")
    for c in choices if isinstance(choices, list) else []:
        if isinstance(c, dict) and isinstance(c.get("usage"), dict):
            notes.note(K.ENVELOPE_VARIANT, Action.NORMALIZED, "usage sent inside a choice, not at the top level")
            return dict(c["usage"])
    return None


class GenerationIds:
    """The envelope reading of completion ids (``proxy.guard.reading``). The plain reading: one id for the
    whole generation. The others: *an id per chunk* -- every chunk since the first had an id of its own,
    none came back, and no chunk restarted the turn (a ``role`` again after chunks without one; upstreams
    that repeat the role on every chunk do not restart); *a changed tail* -- one id repeated, then another
    on chunks that carry nothing of the turn (only a finish reason or usage: llama.cpp,
    ggml-org/llama.cpp#11746), which prove no other generation. A stream with one id repeated and then
    another on a chunk with content is another generation (fatal at once), as is content after a changed
    tail; whether the per-chunk reading is the unique one is settled at the end (``settle``: at least
    ``PER_CHUNK_IDS`` ids). Bounded: at most ``MAX_IDS`` ids kept."""

    __slots__ = ("ids", "per_chunk", "tail", "_last", "_repeated", "_role_gap")

    def __init__(self) -> None:
        self.ids: set[str] = set()  # every completion id seen
        self.per_chunk = False  # the id changed between chunks (the per-chunk reading)
        self.tail = False  # the id changed, after repeats, on a chunk with nothing of the turn
        self._last: str | None = None  # the previous chunk's id
        self._repeated = False  # a chunk repeated the previous chunk's id (plain reading in force)
        self._role_gap = False  # a chunk after the first had no role (a role again then is a restart)

    def first(self, cid: str) -> None:
        """The first chunk's id."""
        self._last = cid
        self.ids.add(cid)

    def same(self, cid: str, obj: dict[str, Any]) -> bool:
        """True when a later chunk with id ``cid`` (its object ``obj``) reads as the same generation."""
        last, self._last = self._last, cid
        role = _has_role(obj)
        restart = role and self._role_gap  # a role again after chunks without one: the turn starts over
        self._role_gap = self._role_gap or not role
        if self.tail and not _bare(obj):
            return False  # content after a changed tail: another generation
        if cid == last:
            self._repeated = True
            return not self.per_chunk
        if self._repeated and not self.per_chunk and not self.tail and cid not in self.ids and _bare(obj):
            self.tail = True
            self.ids.add(cid)
            return True
        if cid in self.ids or self._repeated or len(self.ids) >= MAX_IDS or restart:
            return False
        self.ids.add(cid)
        self.per_chunk = True
        return True

    def settle(self, notes: Notes, first: str) -> None:
        """At the end of a stream not already fatal: the finding of the reading taken, or a retry when the
        per-chunk reading is not the unique one (fewer than ``PER_CHUNK_IDS`` ids)."""
        if self.tail:
            notes.note(K.COMPLETION_ID_CHANGED, Action.NORMALIZED,
                       f"completion id changed from {first[:60]} on chunks with nothing of the turn, read as one "
                       "generation (rejected: another generation: nothing restarts)")
        elif self.per_chunk and len(self.ids) >= PER_CHUNK_IDS:
            notes.note(K.COMPLETION_ID_PER_CHUNK, Action.NORMALIZED,
                       f"{len(self.ids)} completion ids, one per chunk, read as an id per chunk of one "
                       "generation (rejected: plain, one id per generation: not valid; another "
                       "generation: no restart seen)")
        elif self.per_chunk:
            notes.note(K.COMPLETION_ID_CHANGED, Action.RETRY,
                       f"completion id changed from {first[:60]}: another generation or an "
                       "id per chunk, too few chunks to tell (no unique reading)")


class ChoiceTable:
    """The choices of one attempt by index, and how a chunk's ``choices`` field is read: a list, one object
    (an envelope variant), an index sent as a string, an index counting chunks on an n=1 request (the
    choice-index counter reading), an index the request did not ask for (never another choice)."""

    def __init__(self, request: RequestSpec, policy: GuardPolicy, notes: Notes, *, stream: bool = True) -> None:
        self.request = request
        self.policy = policy
        self.notes = notes
        self.stream = stream
        self.choices: dict[int, ChoiceAccumulator] = {}
        self._counted = 0  # choice-bearing chunks seen (the choice-index counter reading)
        self._counter = True  # every chunk's choice index so far equals its number (n=1 only)

    def feed(self, obj: dict[str, Any]) -> None:
        """The ``choices`` of one chunk (whose identity was accepted), each fed to its choice."""
        choices = obj.get("choices")
        if isinstance(choices, dict) and ("delta" in choices or "message" in choices or "finish_reason" in choices):
            self.notes.note(K.ENVELOPE_VARIANT, Action.NORMALIZED, "choices sent as one object, not a list")
            choices = [choices]
        if isinstance(choices, list) and choices:
            counted = None
            if len(choices) == 1:
                counted, self._counted = self._counted, self._counted + 1
            else:
                self._counter = False
            for c in choices:
                if isinstance(c, dict):
                    self._choice(c, counted)
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

    def _choice(self, c: dict[str, Any], counted: int | None = None) -> None:
        idx = c.get("index")
        if type(idx) is not int or idx < 0:
            idx = self._index(idx)
        if counted is not None:
            self._counter = self._counter and idx == counted
        if idx and idx >= self.request.n:
            if self._counter and counted is not None and self.request.n == 1:
                self.notes.note(K.CHOICE_INDEX_AS_COUNTER, Action.NORMALIZED,
                                "choice index read as a chunk counter on an n=1 request (rejected: plain, "
                                f"choice {idx}: not requested)")
                idx = 0
            else:
                self._unrequested(idx, c)
                return
        self.choice(idx).feed(c)

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

    def choice(self, index: int) -> ChoiceAccumulator:
        """The accumulator of choice ``index`` (made on first use)."""
        ch = self.choices.get(index)
        if ch is None:
            ch = self.choices[index] = ChoiceAccumulator(index, self.request.names, self.policy, self.notes,
                                                         stream=self.stream)
        return ch


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
        self.table = ChoiceTable(request, policy, self.notes, stream=stream)
        self.choices = self.table.choices
        self.error: UpstreamError | None = None
        self.done = False
        self.frames = 0
        self.usage: dict[str, Any] | None = None
        self.turn_id: str | None = None
        self.model: str | None = None
        self.created: int | None = None
        self.fingerprint: str | None = None
        self._gen = GenerationIds()  # the envelope reading of completion ids

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
            pieces = self._framing(data)
            if pieces is None:
                self._unparseable(data)
                return
            for piece in pieces:
                self._data(piece, event, invalid_utf8)
        elif event == "error" and isinstance(obj, dict) and "error" not in obj:
            self._upstream_error(K.MID_STREAM_ERROR_CHUNK, obj, "event: error frame")
        else:
            self._chunk(obj)

    def _framing(self, data: str) -> list[str] | None:
        """The framing readings of a data value that is not JSON (``split_frame``): the events it is, with
        a finding, when exactly one reading is valid; None (a broken frame, as before) otherwise."""
        reading = split_frame(data)
        if reading.chosen is None:
            if reading.ambiguous:
                self.notes.note(K.AMBIGUOUS_READING, Action.RETRY, reading.detail("data value"), once=False)
                return []
            return None
        self.notes.note(K.SSE_EVENTS_WITHOUT_BLANK_LINE, Action.NORMALIZED,
                        reading.detail(f"data value of {len(reading.chosen.value)} JSON values"), once=False)
        return list(reading.chosen.value)

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
        usage = chunk_usage(obj, self.notes)
        self.usage = usage if usage is not None else self.usage
        self.table.feed(obj)

    def _identity(self, obj: dict[str, Any]) -> bool:
        """Set-once turn identity; False when the completion id changed (C45: another generation)."""
        cid = ident(obj.get("id"))
        if cid is None:
            self.notes.note(K.IDENTITY_FIELD_BLANK, Action.IGNORED, "chunk without a completion id")
        elif self.turn_id is None:
            self.turn_id = cid
            self._gen.first(cid)
        elif not self._gen.same(cid, obj):
            self.notes.note(K.COMPLETION_ID_CHANGED, Action.RETRY,
                            f"completion id changed from {self.turn_id[:60]} to {cid[:60]}: another generation")
            return False
        self.model = self.model or ident(obj.get("model"))
        created = obj.get("created")
        if self.created is None and isinstance(created, int) and created > 0:
            self.created = created
        self.fingerprint = self.fingerprint or ident(obj.get("system_fingerprint"))
        return True

    # -- end of stream ---------------------------------------------------------------------------

    def close(self) -> list[AccItem]:
        """EOF: record a missing ``[DONE]`` (PROTOCOLS.md 1.5)."""
        self.notes.where = Where()
        if self.stream and not self.done:
            self.notes.note(K.EOF_WITHOUT_DONE, Action.NORMALIZED, "stream ended without [DONE]")
        if not self.fatal:
            self._gen.settle(self.notes, self.turn_id or "")
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
            turn.choices.append(resolver.choice(self.table.choice(i), texts, extra_calls.get(i, [])))
        return turn, [f for f in self.notes.take() if isinstance(f, Finding)]
