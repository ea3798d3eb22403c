"""The end of an attempt: each choice's slots, texts and finish reasons -> one ``ChoiceTurn``.

Per choice: slots become calls (ids minted when missing, C08; cumulative snapshots read as the last
one, C14; blank arguments as ``{}``, C19; exact duplicates dropped), calls recovered from leaked
markup are appended, and ``finish_reason`` is decided once: ``length`` / ``content_filter`` >
``tool_calls`` when calls exist > ``stop`` (C32-C34). Arguments that never completed are fatal
(C24 under ``length``; a cut stream otherwise); a stream that ends with no finish reason and no
``[DONE]`` is fatal too.
"""

from __future__ import annotations

from typing import Any

from proxy.guard.choice import ChoiceAccumulator
from proxy.guard.findings import Action, FindingKind
from proxy.guard.notes import Notes
from proxy.guard.policy import GuardPolicy
from proxy.guard.slots import NOT_JSON, Slot, loads_lenient, resolve_slot_name
from proxy.guard.turn import ChoiceTurn, ToolCall, synthesize_call_id

K = FindingKind
_FINISH_ALIASES = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "content_filter": "content_filter",
    "function_call": "tool_calls", "tool_use": "tool_calls", "end_turn": "stop", "eos": "stop",
    "stop_sequence": "stop", "max_tokens": "length", "model_length": "length",
}


class ChoiceResolver:
    """Resolves the choices of one attempt. ``terminated``: the stream ended with ``[DONE]`` (or is not a
    stream at all), which makes a missing finish reason absorbable."""

    __slots__ = ("names", "policy", "notes", "terminated")

    def __init__(self, names: frozenset[str], policy: GuardPolicy, notes: Notes, *, terminated: bool) -> None:
        self.names = names
        self.policy = policy
        self.notes = notes
        self.terminated = terminated

    def choice(self, ch: ChoiceAccumulator, texts: dict[tuple[int, str], str], extra: list[ToolCall]) -> ChoiceTurn:
        """The turn of choice ``ch``: its calls plus ``extra`` (recovered from markup), ``texts`` by channel."""
        i = ch.index
        calls, complete = self._calls(ch)
        calls.extend(extra)
        out = ChoiceTurn(index=i, content=texts.get((i, "content")) or None,
                         reasoning=texts.get((i, "reasoning")) or None,
                         refusal=texts.get((i, "refusal")) or None, tool_calls=calls)
        out.finish_reason = self._finish(ch, bool(calls), bool(ch.slots))
        if not complete:
            self._incomplete(ch, out)
        elif not ch.finishes:
            self._missing_finish(ch, out)
        if out.finish_reason == "content_filter" and out.tool_calls:
            self.notes.note(K.CONTENT_FILTERED, Action.NORMALIZED, "content_filter finish: tool calls dropped", i)
            out.tool_calls = []
        return out

    def _calls(self, ch: ChoiceAccumulator) -> tuple[list[ToolCall], bool]:
        calls: list[ToolCall] = []
        values: list[tuple[str | None, str, Any]] = []
        complete = True
        for slot in ch.slots:
            call, value = self.slot_call(ch.index, slot)
            complete = complete and slot.args.finished(self.policy)
            if self._duplicate(ch.index, slot, call, value, values):
                continue
            values.append((None if slot.minted else call.id, call.name, value))
            calls.append(call)
        return calls, complete

    def slot_call(self, choice: int, slot: Slot) -> tuple[ToolCall, Any]:
        """The call a slot amounts to now (an id minted if missing, C08) and its parsed arguments."""
        a = slot.args
        pos = slot.position
        if a.blank:
            if not a.had_object:
                self.notes.note(K.EMPTY_ARGUMENTS_FOR_NO_ARG_TOOL, Action.NORMALIZED, "empty arguments read as {}",
                                choice, pos)
            text = "{}"
        else:
            text = a.current()
            if a.snapshot_mode and text == a.last and text != a.text:
                self.notes.note(K.CUMULATIVE_ARGUMENTS_SNAPSHOTS, Action.NORMALIZED,
                                "arguments streamed as cumulative snapshots; last snapshot used", choice, pos)
        if slot.id is None:
            slot.id, slot.minted = synthesize_call_id(), True
            self.notes.note(K.TOOL_CALL_ID_MISSING, Action.NORMALIZED, "tool call without id; synthesized",
                            choice, pos)
        name = resolve_slot_name(slot.names, self.names, self.policy)
        return ToolCall(slot.id, name, text, dict(slot.extra)), loads_lenient(text)

    def _duplicate(self, choice: int, slot: Slot, call: ToolCall, value: Any,
                   seen: list[tuple[str | None, str, Any]]) -> bool:
        """Drop a slot that repeats an earlier call: same id+name+value, or a nameless copy."""
        for sid, name, v in seen:
            if value is NOT_JSON or v != value:
                continue
            if (not call.name and slot.minted) or (sid == call.id and name == call.name):
                self.notes.note(K.DUPLICATE_TOOL_CALL, Action.NORMALIZED, "duplicate of an earlier call dropped",
                                choice, slot.position)
                return True
        if not slot.minted and any(sid == call.id for sid, _, _ in seen):
            self.notes.note(K.DUPLICATE_TOOL_CALL, Action.NORMALIZED, "repeated call id re-minted",
                            choice, slot.position)
            call.id = synthesize_call_id()
        return False

    def _finish(self, ch: ChoiceAccumulator, has_calls: bool, structured: bool) -> str | None:
        """C32-C34: ``length`` / ``content_filter`` > ``tool_calls`` when calls exist > ``stop``."""
        seen = {_FINISH_ALIASES.get(v, "other") for v in ch.finishes if v != "error"}
        if "other" in seen:
            self.notes.note(K.UNKNOWN_FINISH_REASON, Action.NORMALIZED, "unknown finish_reason read as stop",
                            ch.index)
        for strong in ("length", "content_filter"):
            if strong in seen:
                return strong
        if has_calls:
            if structured and ch.finishes and "tool_calls" not in seen:
                self.notes.note(K.FINISH_REASON_STOP_WITH_TOOL_CALLS, Action.NORMALIZED,
                                "finish_reason stop with tool calls; tool_calls emitted", ch.index)
            return "tool_calls"
        return "stop" if seen or "error" in ch.finishes else None

    def _incomplete(self, ch: ChoiceAccumulator, out: ChoiceTurn) -> None:
        """Arguments that never completed: truncation (C24) or a cut stream; never an executable call."""
        if out.finish_reason == "length":
            self.notes.note(K.TRUNCATED_ARGUMENTS_LENGTH, Action.RETRY,
                            "tool-call arguments cut off by finish_reason length", ch.index)
        elif not ch.finishes:
            self.notes.note(K.MISSING_FINISH_REASON, Action.RETRY,
                            "stream ended without finish_reason inside tool-call arguments", ch.index)

    def _missing_finish(self, ch: ChoiceAccumulator, out: ChoiceTurn) -> None:
        """No finish reason. Without ``[DONE]`` either the stream was broken off (a retry; when retries
        run out, the retryable ``upstream_truncated`` error, ``proxy.guard.answer``), unless what arrived
        is provably a whole turn: tool calls whose arguments are complete JSON values, nothing after
        them; such a turn ends as a tool-call turn with a finding (its calls are still validated against
        their schemas, and retried when invalid). Issue: fault tolerance, item 6."""
        if not self.terminated and out.tool_calls and not ch.text_after_calls:
            self.notes.note(K.MISSING_FINISH_REASON, Action.NORMALIZED, "stream ended without finish_reason "
                            "and without [DONE] after complete tool calls: taken as a tool-call turn", ch.index)
        elif not self.terminated:
            self.notes.note(K.MISSING_FINISH_REASON, Action.RETRY,
                            "stream ended without finish_reason and without [DONE]", ch.index)
        else:
            self.notes.note(K.MISSING_FINISH_REASON, Action.NORMALIZED, "no finish_reason; decided at the end",
                            ch.index)
