"""The end of an attempt: each choice's slots, texts and finish reasons -> one ``ChoiceTurn``.

Per choice: slots become calls (ids minted when missing, C08; arguments assembled by the schema,
``proxy.guard.stream.assemble``: plain concatenation, cumulative snapshots C14, a repeated value C15, a
placeholder then the real value, separate calls; blank arguments as ``{}``, C19; exact duplicates
dropped), calls recovered from leaked markup are appended unless the same call already came as a
structured one (the same call in two channels), and ``finish_reason`` is decided once: ``length`` / ``content_filter`` >
``tool_calls`` when calls exist > ``stop`` (C32-C34). Arguments that never completed are fatal
(C24 under ``length``; a cut stream otherwise); a stream that ends with no finish reason and no
``[DONE]`` is fatal too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from proxy.guard.checks.repair import resolve_name
from proxy.guard.findings import Action, FindingKind
from proxy.guard.policy import GuardPolicy
from proxy.guard.stream import assemble as asm
from proxy.guard.stream.choice import ChoiceAccumulator
from proxy.guard.stream.notes import Notes
from proxy.guard.stream.slots import NOT_JSON, Slot, loads_lenient, resolve_slot_name
from proxy.guard.turn import ChoiceTurn, ToolCall, synthesize_call_id

K = FindingKind
_FINISH_ALIASES = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "content_filter": "content_filter",
    "function_call": "tool_calls", "tool_use": "tool_calls", "end_turn": "stop", "eos": "stop",
    "stop_sequence": "stop", "max_tokens": "length", "model_length": "length",
}


class ChoiceResolver:
    """Resolves the choices of one attempt. ``terminated``: the stream ended with ``[DONE]`` (or is not a
    stream at all), which makes a missing finish reason absorbable. ``accepts(name, value)``: is a
    parsed argument object valid for tool ``name`` (``validate.arguments_accepted``; None: any object);
    ``parallel``: the request allows parallel calls."""

    __slots__ = ("names", "policy", "notes", "terminated", "accepts", "parallel", "fused")

    def __init__(self, names: frozenset[str], policy: GuardPolicy, notes: Notes, *, terminated: bool,
                 accepts: Callable[[str, dict[str, Any]], bool] | None = None, parallel: bool = True) -> None:
        self.names = names
        self.policy = policy
        self.notes = notes
        self.terminated = terminated
        self.accepts = accepts or (lambda _name, _value: True)
        self.parallel = parallel
        #: the later calls of a slot read as fused calls, by (choice, slot position): (tool, arguments text)
        self.fused: dict[tuple[int, int], list[tuple[str, str]]] = {}

    def choice(self, ch: ChoiceAccumulator, texts: dict[tuple[int, str], str], extra: list[ToolCall]) -> ChoiceTurn:
        """The turn of choice ``ch``: its calls plus ``extra`` (recovered from markup), ``texts`` by channel."""
        i = ch.index
        calls, complete = self._calls(ch)
        calls.extend(self._not_repeated(i, calls, extra))
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
        legacy = ch.table.by_index.get("function_call")
        for group in _groups(ch.slots):
            complete = complete and all(s.args.finished(self.policy) for s in group)
            pairs = self._group_calls(ch.index, group) if len(group) > 1 else None
            for slot, (call, value) in pairs or [(s, self.slot_call(ch.index, s)) for s in group]:
                if self._duplicate(ch.index, slot, call, value, values, legacy):
                    continue
                values.append((None if slot.minted or slot is legacy else call.id, call.name, value))
                calls.append(call)
                for name, text in self.fused.pop((ch.index, slot.position), []):
                    calls.append(ToolCall(synthesize_call_id(), name, text, {}))
        return calls, complete

    def slot_call(self, choice: int, slot: Slot) -> tuple[ToolCall, Any]:
        """The call a slot amounts to now (an id minted if missing, C08) and its parsed arguments."""
        a = slot.args
        pos = slot.position
        name = resolve_slot_name(slot.names, self.names, self.policy)
        if a.blank:
            if not a.had_object:
                self.notes.note(K.EMPTY_ARGUMENTS_FOR_NO_ARG_TOOL, Action.NORMALIZED, "empty arguments read as {}",
                                choice, pos)
            text = "{}"
        else:
            text = self._assembled(choice, slot, name)
        self._mint(choice, slot)
        assert slot.id is not None
        return ToolCall(slot.id, name, text, dict(slot.extra)), loads_lenient(text)

    def _mint(self, choice: int, slot: Slot) -> None:
        if slot.id is None:
            slot.id, slot.minted = synthesize_call_id(), True
            self.notes.note(K.TOOL_CALL_ID_MISSING, Action.NORMALIZED, "tool call without id; synthesized",
                            choice, slot.position)

    def _assembled(self, choice: int, slot: Slot, name: str) -> str:
        """The argument text of one slot by the assembly rule (``proxy.guard.stream.assemble``); with no unique
        survivor the plain reading (validation then says what is wrong) and, when several, a retry."""
        a = slot.args
        out = asm.assemble(a.frags, self._accepts(name), self.policy, parallel=self.parallel, tools=self._tools)
        if out.chosen is not None and (len(out.chosen.texts) == 1 or out.chosen.how == asm.FUSED):
            self._chosen(choice, slot.position, out)
            if out.chosen.how == asm.FUSED:
                self.fused[(choice, slot.position)] = list(zip(out.chosen.names, out.chosen.texts[1:], strict=True))
            return out.chosen.texts[0]
        if out.ambiguous:
            self._ambiguous(choice, slot.position, out)
        return a.current()

    def _group_calls(self, choice: int, group: list[Slot]) -> list[tuple[Slot, tuple[ToolCall, Any]]] | None:
        """A slot and the headerless slots its later complete values opened: one call (a repeat, a
        placeholder then the real value) or one call per slot (separate calls, each with its id).
        None when no reading is unique (then each slot stands as it is and validation judges)."""
        head = group[0]
        name = resolve_slot_name(head.names, self.names, self.policy)
        texts = [s.args.text for s in group]
        ids = len({s.id for s in group if s.id is not None})
        readings = asm.sequence_readings(texts, self._accepts(name), self.policy, ids=ids, parallel=self.parallel)
        if self.parallel and ids <= 1:
            readings += asm.fused_reading("".join(texts), self._accepts(name), self._tools, self.policy)
        out = asm.decide(readings)
        if out.chosen is None:
            if out.ambiguous:
                self._ambiguous(choice, head.position, out)
            return None
        many = out.chosen.how in (asm.SEPARATE, asm.FUSED)
        if many and len(out.chosen.texts) != len(group):
            return None  # values and slots do not line up (a name between values in one fragment): as they stand
        self._chosen(choice, head.position, out)
        if not many:
            self._mint(choice, head)
            assert head.id is not None
            text = out.chosen.texts[0]
            return [(head, (ToolCall(head.id, name, text, dict(head.extra)), loads_lenient(text)))]
        names = (name, *out.chosen.names) if out.chosen.how == asm.FUSED else (name,) * len(group)
        pairs = []
        for s, text, tool in zip(group, out.chosen.texts, names, strict=True):
            self._mint(choice, s)
            assert s.id is not None
            pairs.append((s, (ToolCall(s.id, tool, text, dict(head.extra)), loads_lenient(text))))
        return pairs

    def _tools(self, name: str | None, value: dict[str, Any]) -> tuple[str, ...]:
        """The declared tools ``name`` means (None: any declared tool) whose schema accepts ``value``."""
        if name is not None:
            resolved = resolve_name(name, self.names, self.policy)
            return (resolved,) if resolved is not None and self.accepts(resolved, value) else ()
        return tuple(n for n in sorted(self.names) if self.accepts(n, value))

    def _accepts(self, name: str) -> asm.Accepts:
        return lambda value: self.accepts(name, value)

    def _chosen(self, choice: int, pos: int, out: asm.Outcome) -> None:
        """The finding of a reading other than plain concatenation, with the alternatives it rejected."""
        chosen = out.chosen
        assert chosen is not None
        if chosen.how == asm.CONCATENATION:
            return
        kind = {asm.SNAPSHOTS: K.CUMULATIVE_ARGUMENTS_SNAPSHOTS, asm.REPEATED: K.FULL_ARGUMENTS_RESENT_AT_END,
                asm.BRACE: K.ARGUMENTS_MISSING_BRACE, asm.FUSED: K.FUSED_PARALLEL_ARGUMENTS,
                }.get(chosen.how, K.ARGUMENTS_ASSEMBLED)
        detail = f"arguments read as {chosen.how}"
        if chosen.how == asm.SNAPSHOTS:
            detail = "arguments streamed as cumulative snapshots; last snapshot used"
        elif chosen.how == asm.FUSED:
            detail = f"arguments read as {len(chosen.texts)} fused calls (then {', '.join(chosen.names)[:200]})"
        action = Action.REPAIRED if chosen.how == asm.BRACE else Action.NORMALIZED
        self.notes.note(kind, action, f"{detail} (rejected: {out.rejected()})"[:500], choice, pos)

    def _ambiguous(self, choice: int, pos: int, out: asm.Outcome) -> None:
        hows = ", ".join(a.how for a in out.survivors)
        self.notes.note(K.AMBIGUOUS_ARGUMENTS, Action.RETRY,
                        f"several different readings of the arguments are valid ({hows}): retried, never a guess",
                        choice, pos)

    def _not_repeated(self, choice: int, calls: list[ToolCall], extra: list[ToolCall]) -> list[ToolCall]:
        """Calls recovered from text, less those that repeat a structured call (same tool, same arguments
        value): the same call in two channels counts once (a markup copy has no upstream id)."""
        if not calls or not extra:
            return extra
        seen = {(resolve_name(c.name, self.names, self.policy) or c.name, _value_key(c.arguments)) for c in calls}
        out = []
        for c in extra:
            if (resolve_name(c.name, self.names, self.policy) or c.name, _value_key(c.arguments)) in seen:
                self.notes.note(K.DUPLICATE_TOOL_CALL, Action.NORMALIZED,
                                "the same call in tool_calls and in text markup; counted once", choice)
                continue
            out.append(c)
        return out

    def _duplicate(self, choice: int, slot: Slot, call: ToolCall, value: Any,
                   seen: list[tuple[str | None, str, Any]], legacy: Slot | None = None) -> bool:
        """Drop a slot that repeats an earlier call: same id+name+value, or a nameless copy."""
        for sid, name, v in seen:
            if value is NOT_JSON or v != value:
                continue
            # The same call in two channels (the legacy function_call next to tool_calls, C34's family):
            # one call. Nameless copies too; two upstream ids at two indexes are two calls.
            if (not call.name and slot.minted) or (sid == call.id and name == call.name) \
                    or (name == call.name and (slot is legacy or (sid is None and legacy is not None))):
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
        aliases = sorted({v for v in ch.finishes if v in _FINISH_ALIASES and _FINISH_ALIASES[v] != v})
        if aliases:
            self.notes.note(K.ENVELOPE_VARIANT, Action.NORMALIZED,
                            f"finish_reason {aliases[0][:30]!r} read as {_FINISH_ALIASES[aliases[0]]!r}", ch.index)
        for strong in ("length", "content_filter"):
            if strong in seen:
                return strong
        if has_calls:
            if structured and ch.finishes and "tool_calls" not in seen:
                self.notes.note(K.FINISH_REASON_STOP_WITH_TOOL_CALLS, Action.NORMALIZED,
                                "finish_reason stop with tool calls; tool_calls emitted", ch.index)
            return "tool_calls"
        if "tool_calls" in seen:
            self.notes.note(K.ENVELOPE_VARIANT, Action.NORMALIZED,
                            "finish_reason tool_calls but no tool call was assembled; stop", ch.index)
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
        run out, the retryable ``upstream_truncated`` error, ``proxy.guard.decisions.answer``), unless what arrived
        is provably a whole turn: tool calls whose arguments are complete JSON values, nothing after
        them; such a turn ends as a tool-call turn with a finding (its calls are still validated against
        their schemas, and retried when invalid). Issue: fault tolerance, item 6. With ``[DONE]`` the turn
        is whole: ``tool_calls`` when it has calls, else ``stop`` (waybarrios/vllm-mlx#628)."""
        if not self.terminated and out.tool_calls and not ch.text_after_calls:
            self.notes.note(K.MISSING_FINISH_REASON, Action.NORMALIZED, "stream ended without finish_reason "
                            "and without [DONE] after complete tool calls: taken as a tool-call turn", ch.index)
        elif not self.terminated:
            self.notes.note(K.MISSING_FINISH_REASON, Action.RETRY,
                            "stream ended without finish_reason and without [DONE]", ch.index)
        else:  # [DONE] ended a whole turn: its finish reason is what the emitter gives it (vllm-mlx#628)
            out.finish_reason = out.finish_reason or "stop"
            self.notes.note(K.MISSING_FINISH_REASON, Action.NORMALIZED,
                            f"no finish_reason before [DONE]: {out.finish_reason}", ch.index)


def _groups(slots: list[Slot]) -> list[list[Slot]]:
    """The slots in assembly groups: a head and the headerless slots that follow it (``Slot.follows``)."""
    groups: dict[int, list[Slot]] = {}
    for slot in slots:
        head = slot.follows if slot.follows is not None and slot.follows in groups else slot.position
        groups.setdefault(head, []).append(slot)
    return list(groups.values())


def _value_key(arguments: str) -> Any:
    """A hashable canonical form of an argument text's value (the text itself when not JSON)."""
    value = loads_lenient(arguments)
    if value is NOT_JSON:
        return arguments
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)
