"""Upstream ``chat.completion.chunk`` events -> one ``Turn`` per attempt, absorbing dialect quirks.

Implements the "Cross-cutting rules" of ``shared/fault-cases/CASES.md`` (families A, B, D, E):

- Tool calls are aggregated per choice and per *slot*. Slot key = ``index`` (by order of
  appearance when missing, C10); a new slot opens at an occupied index only when the delta brings a
  different non-empty id *and* a non-empty name, or when the slot's arguments already form a
  complete JSON value (C09); a different id on an argument-only delta is a continuation (C07).
- Identity fields are set once: first non-empty value wins; ``""``, ``null`` and ``"null"`` are
  absent (C01-C05, C07). Name fragments are kept and resolved at the end: repeats (C03), splits
  (C06), name snapshots, late names (C05).
- Arguments keep the raw fragment list; the end decides between plain concatenation, snapshot mode
  (C14) and a dropped duplicate complete value (C15). Object-valued arguments are serialised (C13);
  empty ones become ``{}`` (C19). Fuzzy overlap dedup is never used on normal deltas.
- ``finish_reason`` is decided once at the end: ``length`` / ``content_filter`` > ``tool_calls``
  when calls exist > ``stop`` (C32-C34).
- SSE/envelope: comments, ``data:`` without space, usage-only and filter chunks are metadata
  (C36-C40); in-band errors (C41, C43), unparseable frames (C45) and a changed completion id are
  fatal.

Every absorbed anomaly becomes a ``Finding`` tied to its frame (number, byte offset, capped text).
The accumulator never raises on any chunk shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from proxy.guard.errors import classify_inband_error
from proxy.guard.events import Channel, TextDelta
from proxy.guard.findings import Action, Finding, FindingKind, Severity, Where, cap_fragment
from proxy.guard.jsonprefix import OPAQUE, JsonPrefix
from proxy.guard.policy import GuardPolicy
from proxy.guard.repair import parse_arguments, resolve_name
from proxy.guard.sse import SSEEvent
from proxy.guard.turn import ChoiceTurn, RequestSpec, ToolCall, Turn, UpstreamError, synthesize_call_id

K = FindingKind
_ABSENT = ("", "null")
_FINISH_ALIASES = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "content_filter": "content_filter",
    "function_call": "tool_calls", "tool_use": "tool_calls", "end_turn": "stop", "eos": "stop",
    "stop_sequence": "stop", "max_tokens": "length", "model_length": "length",
}
_TOOL_KEYS = frozenset({"index", "id", "type", "function"})
_TEXT_KEYS: tuple[tuple[str, Channel], ...] = (
    ("content", "content"), ("reasoning_content", "reasoning"), ("reasoning", "reasoning"),
    ("refusal", "refusal"),
)
_SEVERITY = {
    Action.NORMALIZED: Severity.INFO, Action.IGNORED: Severity.INFO, Action.REPAIRED: Severity.WARNING,
    Action.RETRY: Severity.ERROR, Action.ERROR: Severity.ERROR,
}


def ident(value: Any) -> str | None:
    """An identity field's value, or None when absent (``None``, ``""``, ``"null"``, non-strings)."""
    if isinstance(value, str) and value not in _ABSENT:
        return value
    return None


@dataclass(frozen=True, slots=True)
class SlotClosed:
    """Slot ``slot`` of ``choice`` has complete arguments and a later slot opened (or the choice finished)."""

    choice: int
    slot: int
    by_finish: bool = False  # closed by the choice's finish_reason rather than by a later slot


AccItem = TextDelta | Finding | SlotClosed


class Args:
    """The argument fragments of one slot, with incremental views: concatenation and snapshot chain."""

    __slots__ = ("frags", "concat", "snap", "last", "chain", "nonblank", "had_object", "had_string")

    def __init__(self) -> None:
        self.frags: list[str] = []
        self.concat = JsonPrefix()
        self.snap: JsonPrefix | None = JsonPrefix()  # None once a fragment is not a prefix extension
        self.last = ""  # the latest non-empty fragment (snapshot mode's current value)
        self.chain = 0  # non-empty fragments in the snapshot chain
        self.nonblank = 0
        self.had_object = False
        self.had_string = False

    def add(self, frag: str) -> None:
        """Append one fragment, advancing both views."""
        self.frags.append(frag)
        if not frag:
            return
        self.concat.feed(frag)
        if frag.strip():
            self.nonblank += 1
        self._advance_snapshot(frag)

    def _advance_snapshot(self, frag: str) -> None:
        if self.snap is None:
            return
        if not self.last or frag.startswith(self.last):
            self.snap.feed(frag[len(self.last):])
            self.last = frag
            self.chain += 1
        else:
            self.snap = None

    @property
    def text(self) -> str:
        """The plain concatenation."""
        return "".join(self.frags)

    @property
    def snapshot_mode(self) -> bool:
        """True when >= 2 non-empty fragments each extended the previous one (C14)."""
        return self.snap is not None and self.chain >= 2

    @property
    def complete(self) -> bool:
        """True when some interpretation already forms a complete JSON object/array."""
        return self.concat.complete or (self.snapshot_mode and self.snap is not None and self.snap.complete)

    @property
    def dead(self) -> bool:
        """True when no interpretation (concatenation, snapshots) can become valid JSON any more."""
        return self.concat.dead and (self.snap is None or self.snap.dead)

    @property
    def blank(self) -> bool:
        """True when no non-whitespace fragment arrived."""
        return self.nonblank == 0

    def current(self) -> str:
        """The text the arguments amount to now (C14: last snapshot when concatenation fails)."""
        if self.concat.complete or not self.snapshot_mode:
            return self.text
        if self.concat.state == OPAQUE and _parses(self.text):
            return self.text
        return self.last if self.snap is not None and self.snap.complete else self.text

    def finished(self, policy: GuardPolicy) -> bool:
        """True when the arguments amount to JSON now (directly or after an allowed repair)."""
        return self.blank or self.complete or parse_arguments(self.current(), policy).ok

    def parsed(self) -> Any:
        """The current text parsed leniently, or a sentinel ``_NOT_JSON``."""
        return _loads(self.current())


class _NotJson:
    pass


_NOT_JSON: Any = _NotJson()


_DECODER = json.JSONDecoder(strict=False)  # one instance: json.loads(strict=False) builds one per call


def _loads(text: str) -> Any:
    try:
        return _DECODER.decode(text.strip())
    except (ValueError, RecursionError):
        return _NOT_JSON


def _parses(text: str) -> bool:
    return _loads(text) is not _NOT_JSON


@dataclass(slots=True)
class Slot:
    """One tool call being assembled."""

    position: int
    id: str | None = None
    names: list[str] = field(default_factory=list)
    args: Args = field(default_factory=Args)
    extra: dict[str, Any] = field(default_factory=dict)
    opened_nameless: bool = False
    closed: bool = False
    minted: bool = False
    pending: tuple[str | None, str] | None = None  # (id, name) of a header re-sent after complete args

    def add_name(self, name: str) -> bool:
        """Record a name fragment; True when it repeats the accumulated name."""
        repeat = bool(self.names) and name == "".join(_dedup_names(self.names))
        self.names.append(name)
        return repeat


def _dedup_names(frags: list[str]) -> list[str]:
    """Continue's rule (C06): append a fragment unless it equals the name accumulated so far."""
    out: list[str] = []
    acc = ""
    for f in frags:
        if f != acc:
            out.append(f)
            acc += f
    return out


def resolve_slot_name(frags: list[str], names: frozenset[str], policy: GuardPolicy) -> str:
    """The name a slot's fragments amount to (C03 repeats, C06 splits, snapshots, set-once).

    Candidates in order, the first that is (or resolves to) a declared tool wins: the
    repeat-collapsed concatenation, the last of a prefix-extension chain, the first fragment.
    With no declared match the collapsed concatenation is returned (validation rejects it).
    """
    if not frags:
        return ""
    joined = "".join(_dedup_names(frags))
    chain = all(b.startswith(a) for a, b in zip(frags, frags[1:], strict=False))
    for cand in (joined, frags[-1] if chain else None, frags[0]):
        if cand and resolve_name(cand, names, policy) is not None:
            return cand
    return joined


@dataclass(slots=True)
class ChoiceState:
    """Everything seen for one choice."""

    index: int
    text: dict[str, list[str]] = field(default_factory=dict)
    slots: list[Slot] = field(default_factory=list)
    by_index: dict[Any, Slot] = field(default_factory=dict)
    current: Slot | None = None
    finishes: list[str] = field(default_factory=list)
    role_seen: bool = False
    finished_at: int | None = None


class Accumulator:
    """Feeds on SSE events (``feed``) or chunk dicts (``feed_chunk``); ``resolve()`` builds the turn.

    Outputs per call: ``TextDelta`` (raw text per choice/channel, before markup scanning),
    ``Finding`` and ``SlotClosed`` items in stream order. ``error`` holds the first in-band upstream
    error; ``done`` whether ``[DONE]`` was seen.
    """

    def __init__(self, request: RequestSpec, policy: GuardPolicy, *, stream: bool = True) -> None:
        self.request = request
        self.policy = policy
        self.stream = stream
        self.names = request.names
        self.choices: dict[int, ChoiceState] = {}
        self.error: UpstreamError | None = None
        self.done = False
        self.fatal = False
        self.usage: dict[str, Any] | None = None
        self.turn_id: str | None = None
        self.model: str | None = None
        self.created: int | None = None
        self.fingerprint: str | None = None
        self._seen: set[tuple[Any, ...]] = set()
        self._out: list[AccItem] = []
        self._where = Where()

    # -- findings -----------------------------------------------------------------------------

    def note(self, kind: FindingKind, action: Action, detail: str, choice: int | None = None,
             slot: int | None = None, *, once: bool = True) -> Finding | None:
        """Record a finding at the current frame (once per kind/choice/slot unless ``once=False``)."""
        key = (kind, choice, slot)
        if once and key in self._seen:
            return None
        self._seen.add(key)
        w = self._where
        f = Finding(kind, _SEVERITY[action], action, detail, choice, slot, w.frame, w.offset,
                    cap_fragment(w.raw))
        if f.fatal:
            self.fatal = True
        self._out.append(f)
        return f

    def _take(self) -> list[AccItem]:
        out, self._out = self._out, []
        return out

    # -- SSE level ----------------------------------------------------------------------------

    def feed(self, ev: SSEEvent) -> list[AccItem]:
        """Absorb one SSE event (PROTOCOLS.md 5; C38, C40, C43, C45, ``[DONE]``)."""
        self._where = Where(ev.frame, ev.offset, ev.raw)
        self._sse_notes(ev)
        if self.done:
            self.note(K.NON_CHUNK_FRAME, Action.IGNORED, "frame after [DONE] ignored")
            return self._take()
        if ev.error is not None:
            self._error_field(ev.error)
        elif ev.has_data:
            self._data(ev.data, ev.event)
        return self._take()

    def _sse_notes(self, ev: SSEEvent) -> None:
        if ev.no_space:
            self.note(K.SSE_DATA_WITHOUT_SPACE, Action.NORMALIZED, "data line without space after colon")
        if ev.comments:
            self.note(K.SSE_COMMENT_KEEPALIVES, Action.IGNORED, f"SSE comment ignored: {ev.comments[0][:80]}")
        if not ev.terminated:
            self.note(K.EOF_WITHOUT_DONE, Action.NORMALIZED, "last event not terminated by a blank line")

    def _error_field(self, value: str) -> None:
        """A non-standard ``error:`` SSE field (llama.cpp, C43)."""
        parsed = _loads(value)
        obj = value if parsed is _NOT_JSON else parsed
        self._upstream_error(K.NONSTANDARD_SSE_ERROR_FIELD, obj, "error: SSE field")

    def _data(self, data: str, event: str) -> None:
        stripped = data.strip()
        if stripped.startswith("[DONE]"):
            self.done = True
            return
        if not stripped:
            self.note(K.NON_CHUNK_FRAME, Action.IGNORED, "empty data frame ignored")
            return
        obj = _loads(data)
        if obj is _NOT_JSON:
            self._unparseable(data)
        elif event == "error" and isinstance(obj, dict) and "error" not in obj:
            self._upstream_error(K.MID_STREAM_ERROR_CHUNK, obj, "event: error frame")
        else:
            self._chunk(obj)

    def _unparseable(self, data: str) -> None:
        """C45: a frame that is not JSON (fused with the next one when ``data:`` appears inline)."""
        if "data:" in data:
            self.note(K.FUSED_TRUNCATED_SSE_FRAMES, Action.RETRY,
                      "truncated data frame fused with the next frame", once=False)
        else:
            self.note(K.UNPARSEABLE_DATA_FRAME, Action.RETRY, "data frame is not JSON", once=False)

    def _upstream_error(self, kind: FindingKind, obj: Any, where: str) -> None:
        error = classify_inband_error(obj)
        if self.error is None:
            self.error = error
        action = Action.RETRY if error.retryable else Action.ERROR
        self.note(kind, action, f"upstream error in {where}: {error.message[:300]}", once=False)

    # -- chunk level --------------------------------------------------------------------------

    def feed_chunk(self, obj: Any, where: Where | None = None) -> list[AccItem]:
        """Absorb one parsed chunk (a ``chat.completion.chunk`` dict, PROTOCOLS.md 1.3)."""
        self._where = where or Where()
        self._chunk(obj)
        return self._take()

    def _chunk(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            self.note(K.NON_CHUNK_FRAME, Action.RETRY, "data frame is JSON but not an object", once=False)
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
            self.note(K.IDENTITY_FIELD_BLANK, Action.IGNORED, "chunk without a completion id")
        elif self.turn_id is None:
            self.turn_id = cid
        elif cid != self.turn_id:
            self.note(K.COMPLETION_ID_CHANGED, Action.RETRY,
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
        if isinstance(choices, list) and choices:
            for c in choices:
                if isinstance(c, dict):
                    self._choice(c)
        elif "prompt_filter_results" in obj:
            self.note(K.CONTENT_FILTER_ANNOTATION_CHUNKS, Action.IGNORED, "prompt filter chunk skipped")
        elif isinstance(choices, list) or "usage" in obj:
            usage_only = isinstance(obj.get("usage"), dict)
            # Asked for with stream_options.include_usage, this chunk is the protocol (PROTOCOLS.md 1.4),
            # not a quirk: only unrequested ones are findings (C36).
            if not (usage_only and self.request.usage_requested):
                detail = "usage-only chunk" if usage_only else "chunk with no choices"
                self.note(K.USAGE_ONLY_CHUNK_EMPTY_CHOICES, Action.IGNORED, detail)
        else:
            self.note(K.NON_CHUNK_FRAME, Action.IGNORED, "JSON frame without choices ignored")

    def _choice(self, c: dict[str, Any]) -> None:
        idx = c.get("index")
        ch = self._choice_state(idx if isinstance(idx, int) and not isinstance(idx, bool) and idx >= 0 else 0)
        finish = c.get("finish_reason")
        delta = c.get("delta")
        if delta is None and isinstance(c.get("message"), dict) and not (ch.text or ch.slots):
            delta = c["message"]  # a whole non-stream message inside a stream: read it once, as a delta
        if isinstance(delta, dict):
            self._delta(ch, delta, finishing=ident(finish) is not None)
        elif "content_filter_results" in c or "content_filter_offsets" in c or ident(finish) is None:
            self.note(K.CONTENT_FILTER_ANNOTATION_CHUNKS, Action.IGNORED,
                      "choice without delta skipped (filter annotation)", ch.index)
        self._finish(ch, finish)

    def _choice_state(self, index: int) -> ChoiceState:
        ch = self.choices.get(index)
        if ch is None:
            ch = self.choices[index] = ChoiceState(index)
        return ch

    # -- deltas -------------------------------------------------------------------------------

    def _delta(self, ch: ChoiceState, delta: dict[str, Any], *, finishing: bool) -> None:
        if ch.finished_at is not None and _has_payload(delta):
            self.note(K.INTERMEDIATE_FINISH_REASON, Action.NORMALIZED,
                      "deltas after the choice's finish_reason", ch.index)
        self._role(ch, delta.get("role"))
        self._texts(ch, delta)
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for tc in calls:
                if isinstance(tc, dict):
                    self._tool_delta(ch, tc, finishing=finishing)
        elif isinstance(calls, dict):
            self._tool_delta(ch, calls, finishing=finishing)
        self._legacy_function_call(ch, delta.get("function_call"), finishing=finishing)

    def _role(self, ch: ChoiceState, role: Any) -> None:
        if role is None:
            return
        if ch.role_seen:
            self.note(K.ROLE_REPEATED, Action.NORMALIZED, "role repeated on a later delta", ch.index)
        ch.role_seen = True

    def _texts(self, ch: ChoiceState, delta: dict[str, Any]) -> None:
        seen: set[str] = set()
        for key, channel in _TEXT_KEYS:
            text = _text_value(delta.get(key))
            if text and channel not in seen:
                seen.add(channel)
                ch.text.setdefault(channel, []).append(text)
                self._out.append(TextDelta(ch.index, channel, text))

    def _legacy_function_call(self, ch: ChoiceState, fc: Any, *, finishing: bool) -> None:
        """Deprecated ``function_call`` deltas: empty stubs dropped (C34), real ones become a slot."""
        if not isinstance(fc, dict):
            return
        if ident(fc.get("name")) is None and not fc.get("arguments"):
            self.note(K.EMPTY_STRING_FINISH_REASON_AND_LEGACY_STUB, Action.NORMALIZED,
                      "empty legacy function_call stub dropped", ch.index)
            return
        self._tool_delta(ch, {"index": "function_call", "function": fc}, finishing=finishing)

    def _tool_delta(self, ch: ChoiceState, tc: dict[str, Any], *, finishing: bool) -> None:
        tid = ident(tc.get("id"))
        raw_fn = tc.get("function")
        fn: dict[str, Any] = raw_fn if isinstance(raw_fn, dict) else {}
        name = ident(fn.get("name"))
        frag, is_object = _fragment(fn.get("arguments"))
        slot, new = self._route(ch, tc.get("index"), tid, name, frag)
        blank = not (frag and frag.strip())
        if new:
            self._opened(ch, slot, tc, tid, name)
        elif slot.args.complete and not blank and self._is_duplicate(slot, frag or ""):
            self.note(K.FULL_ARGUMENTS_RESENT_AT_END, Action.NORMALIZED,
                      "complete arguments re-sent; duplicate dropped", ch.index, slot.position)
            return
        elif slot.args.complete and name and blank and not finishing:
            # Same name, no arguments, after the call completed: a repeat (C03) or the header of a
            # next call with the same tool and no id (C09): decided by what follows.
            slot.pending = (tid, name)
            return
        else:
            self._continued(ch, slot, tid, name, "name" in fn, finishing)
        for key, value in tc.items():
            if key not in _TOOL_KEYS:
                slot.extra.setdefault(key, value)
        self._arguments(ch, slot, frag, is_object, opening=new)

    def _route(self, ch: ChoiceState, index: Any, tid: str | None, name: str | None,
               frag: str | None) -> tuple[Slot, bool]:
        """The slot a tool delta belongs to, and whether it was just opened (C07, C09, C10)."""
        missing = not _valid_index(index)
        if missing:
            self.note(K.TOOL_CALL_INDEX_MISSING, Action.NORMALIZED,
                      "tool-call delta without an index; assigned by order", ch.index)
            slot = ch.current
        else:
            slot = ch.by_index.get(index)
        if slot is None:
            return self._open(ch, None if missing else index, split=None), True
        if self._splits(slot, tid, name, frag):
            self.note(K.PARALLEL_CALLS_SHARE_INDEX_0, Action.NORMALIZED,
                      "another call at an occupied index; new slot opened", ch.index, slot.position)
            return self._open(ch, None if missing else index, split=slot), True
        ch.current = slot
        return slot, False

    def _splits(self, slot: Slot, tid: str | None, name: str | None, frag: str | None) -> bool:
        """C09 vs C07/C15: does this delta start a different call at the slot's index?

        A different id with a name on a named slot; or, once the slot's arguments are complete,
        another declared tool name, or a non-duplicate new value (C15 re-sends are duplicates).
        """
        if tid and name and slot.id and slot.names and tid != slot.id:
            return True
        if name and (slot.args.blank or slot.args.complete) and self._other_tool(slot, name):
            return True  # a named call with nothing / everything already, then another declared tool
        if not slot.args.complete:
            return False
        if not (frag and frag.strip()):
            return False
        return not _trailing_residue(frag) and not self._is_duplicate(slot, frag)

    def _other_tool(self, slot: Slot, name: str) -> bool:
        """``name`` is a declared tool other than the declared one the slot's name fragments amount to."""
        if not slot.names or name in slot.names or resolve_name(name, self.names, self.policy) is None:
            return False
        current = resolve_slot_name(slot.names, self.names, self.policy)
        return name != current and resolve_name(current, self.names, self.policy) is not None

    def _is_duplicate(self, slot: Slot, frag: str) -> bool:
        value = _loads(frag)
        return value is not _NOT_JSON and value == slot.args.parsed()

    def _open(self, ch: ChoiceState, index: Any, *, split: Slot | None) -> Slot:
        for s in ch.slots:
            if not s.closed and s.args.complete:
                s.closed = True
                self._out.append(SlotClosed(ch.index, s.position))
        slot = Slot(len(ch.slots))
        ch.slots.append(slot)
        if index is not None:
            ch.by_index[index] = slot
        ch.current = slot
        if split is not None and split.pending is not None:
            slot.id, name = split.pending  # the header that announced this call (C09 without ids)
            slot.names.append(name)
            split.pending = None
        if isinstance(index, int) and index != slot.position and split is None:
            self.note(K.TOOL_CALL_INDEX_GAP, Action.NORMALIZED,
                      f"tool-call index {index} for slot {slot.position}", ch.index, slot.position)
        return slot

    def _opened(self, ch: ChoiceState, slot: Slot, tc: dict[str, Any], tid: str | None,
                name: str | None) -> None:
        """First delta of a slot: id, type (C12), name (C05 when absent)."""
        inherited = bool(slot.names)
        slot.id = tid or slot.id
        if ident(tc.get("type")) is None and not inherited:
            self.note(K.TOOL_CALL_TYPE_MISSING, Action.NORMALIZED,
                      "tool call without type; 'function' assumed", ch.index, slot.position)
        if name and not inherited:
            slot.names.append(name)
        elif not name and not inherited:
            slot.opened_nameless = True

    def _continued(self, ch: ChoiceState, slot: Slot, tid: str | None, name: str | None,
                   name_key: bool, finishing: bool) -> None:
        """A later delta of a slot: set-once identity with its quirks recorded (C01-C07, C18)."""
        pos = slot.position
        repeats = (tid or name) and (tid is None or tid == slot.id) and (name is None or name in slot.names)
        if finishing and repeats:
            self.note(K.FINAL_CHUNK_REPEATS_METADATA_WITH_FINISH, Action.NORMALIZED,
                      "final delta repeats id/name together with finish_reason", ch.index, pos)
            return
        self._continued_id(ch, slot, tid)
        if name:
            self._continued_name(ch, slot, name)
        elif name_key and slot.names:
            self.note(K.EMPTY_NAME_ON_CONTINUATION, Action.NORMALIZED,
                      "continuation delta with an empty name", ch.index, pos)

    def _continued_id(self, ch: ChoiceState, slot: Slot, tid: str | None) -> None:
        if tid is None:
            return
        if slot.id is None:
            slot.id = tid
        elif tid != slot.id:
            self.note(K.TOOL_CALL_ID_CHANGES_MID_STREAM, Action.NORMALIZED,
                      f"continuation with another id ({tid[:60]}); first kept", ch.index, slot.position)
        else:
            self.note(K.TOOL_CALL_ID_REPEATED, Action.NORMALIZED, "id repeated on a continuation delta",
                      ch.index, slot.position)

    def _continued_name(self, ch: ChoiceState, slot: Slot, name: str) -> None:
        pos = slot.position
        if not slot.names:
            self.note(K.NAME_ARRIVES_LATE, Action.NORMALIZED, "name arrived after the call opened",
                      ch.index, pos)
            slot.names.append(name)
        elif slot.add_name(name):
            self.note(K.NAME_REPEATED_EVERY_CHUNK, Action.NORMALIZED, "name repeated on a later delta",
                      ch.index, pos)
        else:
            self.note(K.NAME_SPLIT_ACROSS_CHUNKS, Action.NORMALIZED, "name streamed in fragments",
                      ch.index, pos)

    def _arguments(self, ch: ChoiceState, slot: Slot, frag: str | None, is_object: bool, *,
                   opening: bool) -> None:
        if frag is None:
            return
        a = slot.args
        was_dead = a.dead
        if is_object:
            self._object_arguments(ch, slot)
        elif frag.strip():
            if a.had_object:
                self._mixed(ch, slot)
            a.had_string = True
        a.add(frag)
        if opening and self.stream and a.complete and slot.id and slot.names and not is_object:
            self.note(K.SINGLE_CHUNK_COMPLETE_CALL, Action.NORMALIZED,
                      "whole call in one delta", ch.index, slot.position)
        if a.dead and not was_dead:
            self.note(K.ARGUMENTS_NOT_JSON, Action.RETRY,
                      "arguments can no longer become valid JSON", ch.index, slot.position)

    def _object_arguments(self, ch: ChoiceState, slot: Slot) -> None:
        self.note(K.ARGUMENTS_AS_JSON_OBJECT, Action.NORMALIZED,
                  "arguments sent as a JSON value, not a string; serialised", ch.index, slot.position)
        if slot.args.had_string or slot.args.had_object:
            self._mixed(ch, slot)
        slot.args.had_object = True

    def _mixed(self, ch: ChoiceState, slot: Slot) -> None:
        self.note(K.MIXED_ARGUMENT_FRAGMENT_TYPES, Action.RETRY,
                  "object and string argument fragments mixed in one call", ch.index, slot.position)

    # -- finish ---------------------------------------------------------------------------------

    def _finish(self, ch: ChoiceState, raw: Any) -> None:
        if raw is None:
            return
        value = ident(raw)
        if value is None:
            self.note(K.EMPTY_STRING_FINISH_REASON_AND_LEGACY_STUB, Action.NORMALIZED,
                      f"finish_reason {json.dumps(raw)[:20]} read as null", ch.index)
            return
        if value == "error":
            self.note(K.MID_STREAM_ERROR_CHUNK, Action.RETRY, "finish_reason error", ch.index)
        if ch.finishes:
            self.note(K.DUPLICATE_TERMINAL_FINISH_REASON, Action.NORMALIZED,
                      f"second finish_reason {value[:30]} after {ch.finishes[0][:30]} ignored", ch.index)
        ch.finishes.append(value)
        ch.finished_at = self._where.frame if self._where.frame is not None else -1
        for s in ch.slots:
            if not s.closed and s.args.complete:
                s.closed = True
                self._out.append(SlotClosed(ch.index, s.position, by_finish=True))

    # -- end of stream ---------------------------------------------------------------------------

    def close(self) -> list[AccItem]:
        """EOF: record a missing ``[DONE]`` (PROTOCOLS.md 1.5)."""
        self._where = Where()
        if self.stream and not self.done:
            self.note(K.EOF_WITHOUT_DONE, Action.NORMALIZED, "stream ended without [DONE]")
        return self._take()

    def closed_call(self, choice: int, position: int) -> tuple[ToolCall, list[AccItem]]:
        """The call of a closed slot as it stands (id minted now if missing, C08) and new findings."""
        ch = self.choices[choice]
        slot = ch.slots[position]
        self._where = Where()
        call, _ = self._resolve_slot(ch, slot)
        return call, self._take()

    def slot_names(self) -> dict[tuple[int, int], str]:
        """The name each tool-call slot amounts to so far, by (choice, slot position); '' when unnamed.

        For the audit (findings name the tool they are about), also of attempts that were aborted.
        """
        out = {}
        for i, ch in self.choices.items():
            for slot in ch.slots:
                name = resolve_slot_name(slot.names, self.names, self.policy)
                out[(i, slot.position)] = resolve_name(name, self.names, self.policy) or name
        return out

    def raw_texts(self) -> dict[tuple[int, str], str]:
        """The raw text per (choice, channel) as received (before markup extraction)."""
        return {(i, k): "".join(v) for i, ch in self.choices.items() for k, v in ch.text.items()}

    def resolve(self, texts: dict[tuple[int, str], str] | None = None,
                extra_calls: dict[int, list[ToolCall]] | None = None) -> tuple[Turn, list[Finding]]:
        """Build the turn: slots -> calls (dedup, synthesized ids), texts, one finish per choice.

        ``texts`` replaces the raw text per (choice, channel) (markup-cleaned text from
        ``proxy.guard.markup``); ``extra_calls`` are calls recovered from text, appended per choice.
        Returns the turn and the findings of the resolution (C08, C14, C19, C24, C32, duplicates,
        missing finish reason).
        """
        self._where = Where()
        texts = self.raw_texts() if texts is None else texts
        extra_calls = extra_calls or {}
        turn = Turn(id=self.turn_id, model=self.model, created=self.created,
                    system_fingerprint=self.fingerprint, usage=self.usage)
        indexes = sorted(set(self.choices) | set(extra_calls) | {i for i, _ in texts})
        for i in indexes:
            turn.choices.append(self._resolve_choice(i, texts, extra_calls.get(i, [])))
        return turn, [f for f in self._take() if isinstance(f, Finding)]

    def _resolve_choice(self, i: int, texts: dict[tuple[int, str], str], extra: list[ToolCall]) -> ChoiceTurn:
        ch = self.choices.get(i) or ChoiceState(i)
        calls, complete = self._resolve_calls(ch)
        calls.extend(extra)
        out = ChoiceTurn(index=i, content=texts.get((i, "content")) or None,
                         reasoning=texts.get((i, "reasoning")) or None,
                         refusal=texts.get((i, "refusal")) or None, tool_calls=calls)
        out.finish_reason = self._decide_finish(ch, bool(calls), bool(ch.slots))
        if not complete:
            self._incomplete(ch, out)
        elif not ch.finishes:
            self._missing_finish(ch)
        if out.finish_reason == "content_filter" and out.tool_calls:
            self.note(K.CONTENT_FILTERED, Action.NORMALIZED, "content_filter finish: tool calls dropped", i)
            out.tool_calls = []
        return out

    def _resolve_calls(self, ch: ChoiceState) -> tuple[list[ToolCall], bool]:
        calls: list[ToolCall] = []
        values: list[tuple[str | None, str, Any]] = []
        complete = True
        for slot in ch.slots:
            call, value = self._resolve_slot(ch, slot)
            complete = complete and slot.args.finished(self.policy)
            if self._duplicate_call(ch, slot, call, value, values):
                continue
            values.append((None if slot.minted else call.id, call.name, value))
            calls.append(call)
        return calls, complete

    def _resolve_slot(self, ch: ChoiceState, slot: Slot) -> tuple[ToolCall, Any]:
        a = slot.args
        pos = slot.position
        if a.blank:
            if not a.had_object:
                self.note(K.EMPTY_ARGUMENTS_FOR_NO_ARG_TOOL, Action.NORMALIZED, "empty arguments read as {}",
                          ch.index, pos)
            text = "{}"
        else:
            text = a.current()
            if a.snapshot_mode and text == a.last and text != a.text:
                self.note(K.CUMULATIVE_ARGUMENTS_SNAPSHOTS, Action.NORMALIZED,
                          "arguments streamed as cumulative snapshots; last snapshot used", ch.index, pos)
        if slot.id is None:
            slot.id, slot.minted = synthesize_call_id(), True
            self.note(K.TOOL_CALL_ID_MISSING, Action.NORMALIZED, "tool call without id; synthesized",
                      ch.index, pos)
        name = resolve_slot_name(slot.names, self.names, self.policy)
        return ToolCall(slot.id, name, text, dict(slot.extra)), _loads(text)

    def _duplicate_call(self, ch: ChoiceState, slot: Slot, call: ToolCall, value: Any,
                        seen: list[tuple[str | None, str, Any]]) -> bool:
        """Drop a slot that repeats an earlier call: same id+name+value, or a nameless copy."""
        for sid, name, v in seen:
            if value is _NOT_JSON or v != value:
                continue
            if (not call.name and slot.minted) or (sid == call.id and name == call.name):
                self.note(K.DUPLICATE_TOOL_CALL, Action.NORMALIZED, "duplicate of an earlier call dropped",
                          ch.index, slot.position)
                return True
        if not slot.minted and any(sid == call.id for sid, _, _ in seen):
            self.note(K.DUPLICATE_TOOL_CALL, Action.NORMALIZED, "repeated call id re-minted",
                      ch.index, slot.position)
            call.id = synthesize_call_id()
        return False

    def _decide_finish(self, ch: ChoiceState, has_calls: bool, structured: bool) -> str | None:
        """C32-C34: ``length`` / ``content_filter`` > ``tool_calls`` when calls exist > ``stop``."""
        seen = {_FINISH_ALIASES.get(v, "other") for v in ch.finishes if v != "error"}
        if "other" in seen:
            self.note(K.UNKNOWN_FINISH_REASON, Action.NORMALIZED, "unknown finish_reason read as stop",
                      ch.index)
        for strong in ("length", "content_filter"):
            if strong in seen:
                return strong
        if has_calls:
            if structured and ch.finishes and "tool_calls" not in seen:
                self.note(K.FINISH_REASON_STOP_WITH_TOOL_CALLS, Action.NORMALIZED,
                          "finish_reason stop with tool calls; tool_calls emitted", ch.index)
            return "tool_calls"
        return "stop" if seen or "error" in ch.finishes else None

    def _incomplete(self, ch: ChoiceState, out: ChoiceTurn) -> None:
        """Arguments that never completed: truncation (C24) or a cut stream; never an executable call."""
        if out.finish_reason == "length":
            self.note(K.TRUNCATED_ARGUMENTS_LENGTH, Action.RETRY,
                      "tool-call arguments cut off by finish_reason length", ch.index)
        elif not ch.finishes:
            self.note(K.MISSING_FINISH_REASON, Action.RETRY,
                      "stream ended without finish_reason inside tool-call arguments", ch.index)

    def _missing_finish(self, ch: ChoiceState) -> None:
        if self.stream and not self.done:
            self.note(K.MISSING_FINISH_REASON, Action.RETRY,
                      "stream ended without finish_reason and without [DONE]", ch.index)
        else:
            self.note(K.MISSING_FINISH_REASON, Action.NORMALIZED, "no finish_reason; decided at the end",
                      ch.index)


def _valid_index(index: Any) -> bool:
    return (isinstance(index, int) and not isinstance(index, bool) and index >= 0) or index == "function_call"


def _fragment(value: Any) -> tuple[str | None, bool]:
    """An arguments value as text: strings as is; objects/arrays/scalars serialised (C13)."""
    if value is None:
        return None, False
    if isinstance(value, str):
        return value, False
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")), True
    except (TypeError, ValueError, RecursionError):
        return None, False


def _text_value(value: Any) -> str:
    """A text delta: a string, or the joined ``text`` of a list of content parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _has_payload(delta: dict[str, Any]) -> bool:
    if any(_text_value(delta.get(k)) for k, _ in _TEXT_KEYS):
        return True
    return bool(delta.get("tool_calls"))


def _trailing_residue(frag: str) -> bool:
    """Whitespace or a closing code fence after complete arguments (C23), not a new value."""
    return not frag.strip(" \t\r\n`")
