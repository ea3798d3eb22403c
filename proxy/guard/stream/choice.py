"""One choice of an upstream stream: its deltas in (text, role, tool calls, legacy ``function_call``,
finish reason), its slots out.

Per-choice half of the accumulator (``proxy.guard.stream.accumulate`` holds the envelope and frame rules):
text is handed on as ``TextDelta`` items (the attempt keeps it, after markup scanning); tool-call
deltas go to the choice's ``SlotTable``; argument fragments to the slot's ``Args``. Object-valued
arguments are serialised (C13); mixed object/string fragments and arguments that can no longer
become JSON are fatal. ``finish_reason`` values are collected and decided at the end
(``proxy.guard.stream.resolve``).
"""

from __future__ import annotations

import json
from typing import Any

from proxy.guard.events import Channel, TextDelta
from proxy.guard.findings import Action, FindingKind
from proxy.guard.policy import GuardPolicy, Repair
from proxy.guard.stream.integrity import CHOICE_KEYS, DELTA_KEYS, FUNCTION_KEYS, TOOL_KEYS
from proxy.guard.stream.notes import Notes
from proxy.guard.stream.residue import only_markup
from proxy.guard.stream.slot_table import SlotTable
from proxy.guard.stream.slots import Slot, argument_fragment, ident

K = FindingKind
_TOOL_KEYS = frozenset({"index", "id", "type", "function"})
_TEXT_KEYS: tuple[tuple[str, Channel], ...] = (
    # Reasoning first: a delta carrying both comes out as the model wrote it (thought, then answer), so an
    # Anthropic client gets one thinking block before its text block, not text split around a thought.
    ("reasoning_content", "reasoning"), ("reasoning", "reasoning"), ("content", "content"),
    ("refusal", "refusal"),
)


class ChoiceAccumulator:
    """Everything seen for choice ``index``: ``table`` (its tool-call slots), ``finishes`` (raw
    finish_reason values in order), whether text or a role arrived, the frame of the first finish."""

    __slots__ = ("index", "notes", "policy", "stream", "table", "finishes", "has_text", "text_after_calls", "role_seen",
                 "finished_at")

    def __init__(self, index: int, names: frozenset[str], policy: GuardPolicy, notes: Notes, *,
                 stream: bool) -> None:
        self.index = index
        self.notes = notes
        self.stream = stream
        self.policy = policy
        self.table = SlotTable(index, names, policy, notes)
        self.finishes: list[str] = []
        self.has_text = False
        self.text_after_calls = False  # text arrived after a tool call had started (the stream-end rule)
        self.role_seen = False
        self.finished_at: int | None = None

    @property
    def slots(self) -> list[Slot]:
        """The choice's slots in order of opening."""
        return self.table.slots

    def feed(self, c: dict[str, Any]) -> None:
        """Absorb one ``choices[i]`` object of a chunk (PROTOCOLS.md 1.3)."""
        finish = c.get("finish_reason")
        delta = c.get("delta")
        if not CHOICE_KEYS.issuperset(c):
            self.notes.inspect({"choices": [c]})  # an unknown key: a vendor extension, or corrupted?
        if delta is None and isinstance(c.get("message"), dict) and not (self.has_text or self.slots):
            delta = c["message"]  # a whole non-stream message inside a stream: read it once, as a delta
            if self.stream:
                self.notes.note(K.ENVELOPE_VARIANT, Action.NORMALIZED,
                                "a whole message inside a stream chunk; read as one delta", self.index)
        if isinstance(delta, dict):
            self._delta(delta, finishing=ident(finish) is not None)
        elif delta not in (None, "", [], {}):
            self.notes.note(K.ENVELOPE_VARIANT, Action.RETRY,
                            f"delta is a {type(delta).__name__}, not an object: what it meant is a guess", self.index,
                            once=False)
        elif "content_filter_results" in c or "content_filter_offsets" in c or ident(finish) is None:
            self.notes.note(K.CONTENT_FILTER_ANNOTATION_CHUNKS, Action.IGNORED,
                            "choice without delta skipped (filter annotation)", self.index)
        self._finish(finish)

    def _delta(self, delta: dict[str, Any], *, finishing: bool) -> None:
        if not DELTA_KEYS.issuperset(delta):
            self.notes.inspect({"choices": [{"delta": delta}]})
        if self.finished_at is not None and _has_payload(delta):
            self.notes.note(K.INTERMEDIATE_FINISH_REASON, Action.NORMALIZED,
                            "deltas after the choice's finish_reason", self.index)
        self._role(delta.get("role"))
        self._texts(delta)
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for tc in calls:
                if isinstance(tc, dict):
                    self._tool_delta(tc, finishing=finishing)
        elif isinstance(calls, dict):
            self.notes.note(K.ENVELOPE_VARIANT, Action.NORMALIZED, "tool_calls sent as one object, not a list",
                            self.index)
            self._tool_delta(calls, finishing=finishing)
        self._legacy_function_call(delta.get("function_call"), finishing=finishing)

    def _role(self, role: Any) -> None:
        if role is None:
            return
        if self.role_seen:
            self.notes.note(K.ROLE_REPEATED, Action.NORMALIZED, "role repeated on a later delta", self.index)
        self.role_seen = True

    def _texts(self, delta: dict[str, Any]) -> None:
        seen: set[str] = set()
        for key, channel in _TEXT_KEYS:
            text = _text_value(delta.get(key))
            if text and channel not in seen:
                seen.add(channel)
                self.has_text = True
                if self.table.slots:
                    self.text_after_calls = True
                self.notes.push(TextDelta(self.index, channel, text))

    def _legacy_function_call(self, fc: Any, *, finishing: bool) -> None:
        """Deprecated ``function_call`` deltas: empty stubs dropped (C34), real ones become a slot."""
        if not isinstance(fc, dict):
            return
        if ident(fc.get("name")) is None and not fc.get("arguments"):
            self.notes.note(K.EMPTY_STRING_FINISH_REASON_AND_LEGACY_STUB, Action.NORMALIZED,
                            "empty legacy function_call stub dropped", self.index)
            return
        self.notes.note(K.ENVELOPE_VARIANT, Action.NORMALIZED,
                        "deprecated function_call delta read as a tool call", self.index)
        self._tool_delta({"index": "function_call", "function": fc}, finishing=finishing)

    def _tool_delta(self, tc: dict[str, Any], *, finishing: bool) -> None:
        index = tc.get("index")
        if isinstance(index, str) and index.isascii() and index.isdigit() and len(index) < 6:
            self.notes.note(K.ENVELOPE_VARIANT, Action.NORMALIZED, f"tool-call index sent as the string {index!r}",
                            self.index)
            tc = {**tc, "index": int(index)}
        tid = ident(tc.get("id"))
        raw_fn = tc.get("function")
        fn: dict[str, Any] = raw_fn if isinstance(raw_fn, dict) else {}
        if not (TOOL_KEYS.issuperset(tc) and FUNCTION_KEYS.issuperset(fn)):
            self.notes.inspect({"choices": [{"delta": {"tool_calls": [tc]}}]})
        name = ident(fn.get("name"))
        frag, is_object = argument_fragment(fn.get("arguments"))
        slot, new = self.table.route(tc.get("index"), tid, name, frag)
        blank = not (frag and frag.strip())
        if new:
            self.table.opened(slot, tc, tid, name)
        elif slot.args.complete and not blank and self.table.is_duplicate(slot, frag or ""):
            self.notes.note(K.FULL_ARGUMENTS_RESENT_AT_END, Action.NORMALIZED,
                            "complete arguments re-sent; duplicate dropped", self.index, slot.position)
            return
        elif slot.args.complete and name and blank and not finishing:
            # Same name, no arguments, after the call completed: a repeat (C03) or the header of a
            # next call with the same tool and no id (C09): decided by what follows.
            slot.pending = (tid, name)
            return
        else:
            self.table.continued(slot, tid, name, "name" in fn, finishing)
        for key, value in tc.items():
            if key not in _TOOL_KEYS:
                slot.extra.setdefault(key, value)
        self._arguments(slot, frag, is_object, opening=new)

    def _arguments(self, slot: Slot, frag: str | None, is_object: bool, *, opening: bool) -> None:
        if frag is None:
            return
        a = slot.args
        was_dead = a.dead
        if not is_object and a.complete and only_markup(frag) and self.policy.allows(Repair.LEAKED_MARKUP):
            self.notes.note(K.MARKUP_RESIDUE_IN_CONTENT, Action.REPAIRED, f"dialect markup {frag.strip()[:40]!r} "
                            "after complete arguments dropped (rejected: plain, not JSON)", self.index, slot.position)
            return
        if is_object:
            self._object_arguments(slot)
        elif frag.strip():
            if a.had_object:
                self._mixed(slot)
            a.had_string = True
        a.add(frag)
        if opening and self.stream and a.complete and slot.id and slot.names and not is_object:
            self.notes.note(K.SINGLE_CHUNK_COMPLETE_CALL, Action.NORMALIZED,
                            "whole call in one delta", self.index, slot.position)
        if a.dead and not was_dead:
            self.notes.note(K.ARGUMENTS_NOT_JSON, Action.RETRY,
                            "arguments can no longer become valid JSON", self.index, slot.position)

    def _object_arguments(self, slot: Slot) -> None:
        self.notes.note(K.ARGUMENTS_AS_JSON_OBJECT, Action.NORMALIZED,
                        "arguments sent as a JSON value, not a string; serialised", self.index, slot.position)
        if slot.args.had_string or slot.args.had_object:
            self._mixed(slot)
        slot.args.had_object = True

    def _mixed(self, slot: Slot) -> None:
        self.notes.note(K.MIXED_ARGUMENT_FRAGMENT_TYPES, Action.RETRY,
                        "object and string argument fragments mixed in one call", self.index, slot.position)

    def _finish(self, raw: Any) -> None:
        if raw is None:
            return
        value = ident(raw)
        if value is None:
            self.notes.note(K.EMPTY_STRING_FINISH_REASON_AND_LEGACY_STUB, Action.NORMALIZED,
                            f"finish_reason {json.dumps(raw)[:20]} read as null", self.index)
            return
        if value == "error":
            self.notes.note(K.MID_STREAM_ERROR_CHUNK, Action.RETRY, "finish_reason error", self.index)
        if self.finishes:
            self.notes.note(K.DUPLICATE_TERMINAL_FINISH_REASON, Action.NORMALIZED,
                            f"second finish_reason {value[:30]} after {self.finishes[0][:30]} ignored", self.index)
        self.finishes.append(value)
        frame = self.notes.where.frame
        self.finished_at = frame if frame is not None else -1
        self.table.close_complete(by_finish=True)


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
