"""Which tool-call slot a delta belongs to, and the set-once identity of each slot (families A, B).

Rules (``shared/fault-cases/CASES.md``, cross-cutting): slot key = ``index`` (by order of appearance
when missing, C10); a new slot opens at an occupied index only when the delta brings a different
non-empty id *and* a non-empty name, or another declared tool once the slot is blank or complete,
or a new non-duplicate value once the slot's arguments form a complete JSON value (C09); a
different id on an argument-only delta is a continuation (C07). Identity fields are set once:
the first non-empty value wins; repeats (C03), splits (C06), late names (C05) and repeated ids are
recorded as findings.
"""

from __future__ import annotations

from typing import Any

from proxy.guard.checks.repair import resolve_name
from proxy.guard.findings import Action, FindingKind
from proxy.guard.policy import GuardPolicy
from proxy.guard.stream.notes import Notes
from proxy.guard.stream.slots import (
    NOT_JSON,
    Slot,
    SlotClosed,
    ident,
    loads_lenient,
    resolve_slot_name,
    trailing_residue,
    valid_index,
)

K = FindingKind


class SlotTable:
    """The tool-call slots of one choice: ``slots`` in order of opening, ``by_index`` by upstream index,
    ``current`` the slot an index-less delta continues."""

    __slots__ = ("choice", "names", "policy", "notes", "slots", "by_index", "current")

    def __init__(self, choice: int, names: frozenset[str], policy: GuardPolicy, notes: Notes) -> None:
        self.choice = choice
        self.names = names
        self.policy = policy
        self.notes = notes
        self.slots: list[Slot] = []
        self.by_index: dict[Any, Slot] = {}
        self.current: Slot | None = None

    def route(self, index: Any, tid: str | None, name: str | None, frag: str | None) -> tuple[Slot, bool]:
        """The slot a tool delta belongs to, and whether it was just opened (C07, C09, C10)."""
        missing = not valid_index(index)
        if missing:
            self.notes.note(K.TOOL_CALL_INDEX_MISSING, Action.NORMALIZED,
                            "tool-call delta without an index; assigned by order", self.choice)
            slot = self.current
        else:
            slot = self.by_index.get(index)
        if slot is None:
            return self._open(None if missing else index, split=None), True
        reason = self._splits(slot, tid, name, frag)
        if reason:
            self.notes.note(K.PARALLEL_CALLS_SHARE_INDEX_0, Action.NORMALIZED,
                            "another call at an occupied index; new slot opened", self.choice, slot.position)
            # A bare new value (no header of its own) after an open slot: one assembly group with it.
            grouped = reason == "value" and not slot.closed and slot.pending is None and not name
            if grouped:
                slot.followed = True
            opened = self._open(None if missing else index, split=slot)
            if grouped:
                opened.follows = slot.position if slot.follows is None else slot.follows
            return opened, True
        self.current = slot
        return slot, False

    def _splits(self, slot: Slot, tid: str | None, name: str | None, frag: str | None) -> str:
        """C09 vs C07/C15: does this delta start a different call at the slot's index? Why, or ``""``.

        ``"id"``: a different id with a name on a named slot; once the slot's arguments are blank or
        complete, ``"tool"``: another declared tool name; once complete, ``"value"``: a non-duplicate
        new value (C15 re-sends are duplicates, unless they bring an id of their own: then the
        assembly rule decides between one call and two, ``proxy.guard.stream.assemble``).
        """
        if tid and name and slot.id and slot.names and tid != slot.id:
            return "id"
        if name and (slot.args.blank or slot.args.complete) and self._other_tool(slot, name):
            return "tool"  # a named call with nothing / everything already, then another declared tool
        if not slot.args.complete:
            return ""
        if not (frag and frag.strip()):
            return ""
        if trailing_residue(frag):
            return ""
        if self.is_duplicate(slot, frag):  # a re-send (C15), unless under an id of its own: then the
            return "value" if tid and slot.id and tid != slot.id else ""  # assembly decides (two calls?)
        return "value"

    def _other_tool(self, slot: Slot, name: str) -> bool:
        """``name`` is a declared tool other than the declared one the slot's name fragments amount to."""
        if not slot.names or name in slot.names or resolve_name(name, self.names, self.policy) is None:
            return False
        current = resolve_slot_name(slot.names, self.names, self.policy)
        return name != current and resolve_name(current, self.names, self.policy) is not None

    @staticmethod
    def is_duplicate(slot: Slot, frag: str) -> bool:
        """True when ``frag`` parses to the value the slot's arguments already amount to (C15)."""
        value = loads_lenient(frag)
        return value is not NOT_JSON and value == slot.args.parsed()

    def close_complete(self, *, by_finish: bool = False) -> None:
        """Close every open slot whose arguments are complete (a later slot opened, or the choice finished)."""
        for s in self.slots:
            if not s.closed and s.args.complete:
                s.closed = True
                self.notes.push(SlotClosed(self.choice, s.position, by_finish=by_finish))

    def _open(self, index: Any, *, split: Slot | None) -> Slot:
        self.close_complete()
        slot = Slot(len(self.slots))
        self.slots.append(slot)
        if index is not None:
            self.by_index[index] = slot
        self.current = slot
        if split is not None and split.pending is not None:
            slot.id, name = split.pending  # the header that announced this call (C09 without ids)
            slot.names.append(name)
            split.pending = None
        if isinstance(index, int) and index != slot.position and split is None:
            self.notes.note(K.TOOL_CALL_INDEX_GAP, Action.NORMALIZED,
                            f"tool-call index {index} for slot {slot.position}", self.choice, slot.position)
        return slot

    def opened(self, slot: Slot, tc: dict[str, Any], tid: str | None, name: str | None) -> None:
        """First delta of a slot: id, type (C12), name (C05 when absent)."""
        inherited = bool(slot.names)
        slot.id = tid or slot.id
        if ident(tc.get("type")) is None and not inherited:
            self.notes.note(K.TOOL_CALL_TYPE_MISSING, Action.NORMALIZED,
                            "tool call without type; 'function' assumed", self.choice, slot.position)
        if name and not inherited:
            slot.names.append(name)
        elif not name and not inherited:
            slot.opened_nameless = True

    def continued(self, slot: Slot, tid: str | None, name: str | None, name_key: bool, finishing: bool) -> None:
        """A later delta of a slot: set-once identity with its quirks recorded (C01-C07, C18)."""
        repeats = (tid or name) and (tid is None or tid == slot.id) and (name is None or name in slot.names)
        if finishing and repeats:
            self.notes.note(K.FINAL_CHUNK_REPEATS_METADATA_WITH_FINISH, Action.NORMALIZED,
                            "final delta repeats id/name together with finish_reason", self.choice, slot.position)
            return
        self._continued_id(slot, tid)
        if name:
            self._continued_name(slot, name)
        elif name_key and slot.names:
            self.notes.note(K.EMPTY_NAME_ON_CONTINUATION, Action.NORMALIZED,
                            "continuation delta with an empty name", self.choice, slot.position)

    def _continued_id(self, slot: Slot, tid: str | None) -> None:
        if tid is None:
            return
        if slot.id is None:
            slot.id = tid
        elif tid != slot.id:
            self.notes.note(K.TOOL_CALL_ID_CHANGES_MID_STREAM, Action.NORMALIZED,
                            f"continuation with another id ({tid[:60]}); first kept", self.choice, slot.position)
        else:
            self.notes.note(K.TOOL_CALL_ID_REPEATED, Action.NORMALIZED, "id repeated on a continuation delta",
                            self.choice, slot.position)

    def _continued_name(self, slot: Slot, name: str) -> None:
        pos = slot.position
        if not slot.names:
            self.notes.note(K.NAME_ARRIVES_LATE, Action.NORMALIZED, "name arrived after the call opened",
                            self.choice, pos)
            slot.names.append(name)
        elif slot.add_name(name):
            self.notes.note(K.NAME_REPEATED_EVERY_CHUNK, Action.NORMALIZED, "name repeated on a later delta",
                            self.choice, pos)
        else:
            self.notes.note(K.NAME_SPLIT_ACROSS_CHUNKS, Action.NORMALIZED, "name streamed in fragments",
                            self.choice, pos)
