"""The accumulator's outbox: findings tied to the frame being read, in stream order with its other items.

One ``Notes`` per attempt is shared by the envelope (``proxy.guard.stream.accumulate``), the per-choice
accumulators (``proxy.guard.stream.choice``), their slot tables and the turn resolver, so every anomaly is
recorded once, at the frame it was seen in, and handed out in order with the text deltas and
closed slots around it.
"""

from __future__ import annotations

from typing import Any

from proxy.guard.events import TextDelta
from proxy.guard.findings import Action, Finding, FindingKind, Severity, Where, cap_fragment
from proxy.guard.stream.integrity import inspect_chunk
from proxy.guard.stream.slots import SlotClosed

AccItem = TextDelta | Finding | SlotClosed

_SEVERITY = {
    Action.NORMALIZED: Severity.INFO, Action.IGNORED: Severity.INFO, Action.REPAIRED: Severity.WARNING,
    Action.RETRY: Severity.ERROR, Action.ERROR: Severity.ERROR,
}


class Notes:
    """Collects an attempt's accumulator items. ``where`` is the frame being read (set by the envelope);
    ``fatal`` turns True at the first retry or error finding; ``inspected`` whether the current frame was
    walked for protocol violations already (so a level that finds an unknown key walks it only once)."""

    __slots__ = ("where", "fatal", "inspected", "_seen", "_out")

    def __init__(self) -> None:
        self.where = Where()
        self.inspected = False  # the current frame had its integrity walk (proxy.guard.stream.integrity)
        self.fatal = False
        self._seen: set[tuple[Any, ...]] = set()
        self._out: list[AccItem] = []

    def note(self, kind: FindingKind, action: Action, detail: str, choice: int | None = None,
             slot: int | None = None, *, once: bool = True) -> Finding | None:
        """Record a finding at the current frame (once per kind/choice/slot unless ``once=False``);
        its severity follows from ``action``. Returns it, or None when it was a repeat."""
        key = (kind, choice, slot)
        if once and key in self._seen:
            return None
        self._seen.add(key)
        w = self.where
        f = Finding(kind, _SEVERITY[action], action, detail, choice, slot, w.frame, w.offset, cap_fragment(w.raw))
        if f.fatal:
            self.fatal = True
        self._out.append(f)
        return f

    def inspect(self, obj: dict[str, Any], *, invalid_utf8: bool = False, escapes: bool = False) -> None:
        """Walk ``obj`` (a chunk, or ``{"choices": [choice]}``) for protocol violations once per frame and
        record them (``proxy.guard.stream.integrity``); fatal where they touch a tool call."""
        if self.inspected:
            return
        self.inspected = True
        for p in inspect_chunk(obj, invalid_utf8=invalid_utf8, escapes=escapes):
            self.note(p.kind, p.action, p.detail, once=not p.touches_call)

    def push(self, item: TextDelta | SlotClosed) -> None:
        """Queue a text delta or a closed slot in stream order."""
        self._out.append(item)

    def take(self) -> list[AccItem]:
        """The items queued since the last call."""
        out, self._out = self._out, []
        return out
