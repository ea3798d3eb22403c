"""The attempt driver: upstream bytes -> guard events -> one ``Decision`` (sans-IO).

``AttemptGuard`` wires ``sse`` -> ``accumulate`` -> ``AttemptText`` (``markup``, ``residue``) and, at the end,
``validate``:

- ``feed(bytes)`` returns, in stream order, ``TextDelta`` (text safe to release, per choice and
  channel; leaked-markup prefixes held back), ``ToolCallValid`` (a call that is complete and valid
  before the end: a commit trigger), ``Finding`` and at most one ``Abort``.
- ``finish()`` returns the remaining events and ends with exactly one ``Done(decision)``; or, when
  a tool call is over the inline validation budget (``RequestSpec.inline_cost``), with
  ``Pending(checks)``: the caller gets their verdicts off the event loop (``proxy.relay.schema_pool``),
  ``supply``-es them and calls ``finish()`` again. Such a call is never a commit trigger.

The guard releases every text delta as soon as it is safe; whether it reaches the client now, later
or not at all (text streaming off, a retry after text was sent) is ``proxy.guard.decisions.delivery.Delivery``'s
rule. Findings about a tool-call slot carry the tool's name in the decision (``Finding.tool``).

``Abort`` comes the moment the attempt is provably unrecoverable and ``policy.early_abort`` is on:
an upstream error (C41, C43), an unparseable or foreign data frame (C45), a changed completion id,
arguments no normalisation can turn into JSON (snapshots, C14, and re-sent arguments, C15, never
count), mixed object/string argument fragments, a closed call whose name is undeclared and not
repairable, an unparseable leaked-markup block. After it ``feed`` ignores further bytes.

Decision: an in-band upstream error -> ``UPSTREAM_ERROR`` (its ``UpstreamError``); any other fatal
finding -> ``RETRY`` (``reason`` = the first one's detail); else ``REPAIRED`` if a repair was
applied, ``NORMALIZED`` if a quirk was absorbed or metadata ignored, ``CLEAN`` otherwise. Nothing
here raises on any input; a guard bug becomes a ``GUARD_INTERNAL_ERROR`` retry, never a pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from proxy.guard.checks.repair import resolve_name
from proxy.guard.checks.validate import NeedVerdicts, Verdict, check_turn, offloaded_verdict
from proxy.guard.events import Abort, Channel, Done, Event, Pending, TextDelta, ToolCallValid
from proxy.guard.findings import Action, Finding, FindingKind, Severity, Where, cap_fragment
from proxy.guard.policy import GuardPolicy, Repair
from proxy.guard.stream.accumulate import AccItem, Accumulator, SlotClosed
from proxy.guard.stream.markup import MarkupScanner, ScanResult
from proxy.guard.stream.residue import ResidueHold, end_of_turn
from proxy.guard.stream.sse import SSEDecoder, SSEEvent
from proxy.guard.turn import ChoiceTurn, Decision, Outcome, RequestSpec, ToolCall, Turn, UpstreamError

K = FindingKind


class AttemptGuard:
    """One upstream attempt: ``feed(bytes) -> list[Event]`` any number of times, then ``finish()``."""

    def __init__(self, request: RequestSpec, policy: GuardPolicy, *, stream: bool = True,
                 max_line: int | None = None, max_bytes: int | None = None) -> None:
        """``max_line``: the longest SSE line held (bytes; settings ``MAX_SSE_LINE_BYTES``); ``max_bytes``:
        the most body bytes one attempt may bring (settings ``MAX_ATTEMPT_BYTES``). Past either the
        attempt is broken (``SSE_LINE_TOO_LONG`` / ``UPSTREAM_BODY_TOO_LARGE``, retried). None: unbounded."""
        self.request = request
        self.policy = policy
        self.max_bytes = max_bytes
        self._size = 0
        self._sse = SSEDecoder(max_line=max_line)
        self._acc = Accumulator(request, policy, stream=stream)
        self._text = AttemptText(request, policy, self._finding)
        self.findings: list[Finding] = []
        self._aborted = False
        self._decision: Decision | None = None
        self._drained = False
        self._turn: Turn | None = None  # the resolved turn, kept while verdicts are pending
        self._verdicts: dict[tuple[str, str], Verdict] = {}

    # -- input ---------------------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Event]:
        """Absorb a piece of the upstream body (any split) and return the events it produced."""
        out: list[Event] = []
        if self._aborted or self._decision is not None:
            return out
        try:
            self._size += len(data)
            if self.max_bytes is not None and self._size > self.max_bytes:
                self._bound(K.UPSTREAM_BODY_TOO_LARGE, f"the attempt's body passed {self.max_bytes} bytes", out)
                return out
            for ev in self._sse.feed(data):
                self._event(ev, out)
                if self._stopped():
                    break
            if self._sse.corrupt_fields or self._sse.overflow:
                self._decoder_checks(out)
        except Exception as exc:  # noqa: BLE001 - the invariant: garbage in, a decision out
            self._internal(exc, out)
        return out

    def _decoder_checks(self, out: list[Event]) -> None:
        """What the SSE decoder could not hand on as events: a frame lost under a corrupted field name,
        a line past the bound."""
        if self._sse.corrupt_fields:
            self._bound(K.CORRUPTED_KEY, "an SSE field name is corrupted (invalid UTF-8 or one edit from "
                        "'data'): the frame under it is lost", out)
        if self._sse.overflow:
            self._bound(K.SSE_LINE_TOO_LONG, f"an SSE line longer than {self._sse.max_line} bytes", out)

    def _bound(self, kind: FindingKind, detail: str, out: list[Event]) -> None:
        """A size bound passed or a frame lost to a corrupted SSE field: the attempt is broken whatever
        the policy says about early abort (the guard never holds more), and the rest is ignored."""
        if self._aborted:
            return
        f = Finding(kind, Severity.ERROR, Action.RETRY, detail, frame=self._acc.frames)
        self._finding(f, out)
        if not self._aborted:
            self._aborted = True
            out.append(Abort(f))

    def feed_completion(self, obj: Any, raw: str = "", *, invalid_utf8: bool = False) -> list[Event]:
        """Absorb a whole non-stream ``chat.completion`` object (PROTOCOLS.md 1.2) as one chunk;
        ``invalid_utf8``: its body had bytes that are not UTF-8 (decoded as U+FFFD)."""
        out: list[Event] = []
        try:
            where = Where(0, 0, raw)
            items = self._acc.feed_chunk(_completion_as_chunk(obj), where, invalid_utf8=invalid_utf8)
            self._items(items, where, out)
        except Exception as exc:  # noqa: BLE001
            self._internal(exc, out)
        return out

    def finish(self) -> list[Event]:
        """End of the body: remaining events, ending with exactly one ``Done``, or with ``Pending`` when
        calls over the inline validation budget need verdicts first (``supply`` them, call again)."""
        if self._decision is not None:
            return [Done(self._decision)]
        out: list[Event] = []
        try:
            if not self._drained:
                self._drained = True
                self._drain(out)
            decision = self._decide(out)
        except NeedVerdicts as need:
            out.append(Pending(need.checks))
            return out
        except Exception as exc:  # noqa: BLE001
            self._internal(exc, out)
            decision = _decision(self.findings, None, None)
        decision = self._named(decision)
        self._decision = decision
        out.append(Done(decision))
        return out

    def supply(self, verdicts: dict[tuple[str, str], Verdict]) -> None:
        """Verdicts of ``Pending`` checks, by ``(schema, arguments)``, for the next ``finish()``."""
        self._verdicts.update(verdicts)

    @property
    def usage(self) -> dict[str, Any] | None:
        """The last usage object the upstream sent so far (raw; ``read_usage`` bounds it), or None."""
        return self._acc.usage

    @property
    def calls_started(self) -> bool:
        """True once any choice has a tool-call slot (a call begun, complete or not)."""
        return any(choice.slots for choice in self._acc.choices.values())

    @property
    def unfinished(self) -> bool:
        """True when the stream so far has neither ``[DONE]`` nor a finish reason on any choice (a stream
        that ends here was cut, whatever its last frame held)."""
        return not self._acc.done and not any(choice.finishes for choice in self._acc.choices.values())

    @property
    def frames(self) -> int:
        """The number of SSE events read so far."""
        return self._acc.frames

    def _named(self, decision: Decision) -> Decision:
        """``decision`` with each slot finding naming the tool its slot amounts to (for the audit)."""
        if not any(f.slot is not None for f in decision.findings):
            return decision
        names = self._acc.slot_names()
        findings = tuple(replace(f, tool=names.get((f.choice or 0, f.slot), "")) if f.slot is not None else f
                         for f in decision.findings)
        return replace(decision, findings=findings)

    # -- wiring ----------------------------------------------------------------------------------

    def _stopped(self) -> bool:
        """True once aborted (a method, so type checkers do not pin the flag across calls)."""
        return self._aborted

    def _event(self, ev: SSEEvent, out: list[Event]) -> None:
        self._items(self._acc.feed(ev), Where(ev.frame, ev.offset, ev.raw), out)

    def _items(self, items: list[AccItem], where: Where, out: list[Event]) -> None:
        for item in items:
            if self._aborted:
                return
            if isinstance(item, TextDelta):
                self._text.feed(item, where, out)
            elif isinstance(item, SlotClosed):
                self._slot_closed(item, out)
            else:
                self._finding(item, out)

    def _finding(self, f: Finding, out: list[Event]) -> None:
        self.findings.append(f)
        out.append(f)
        if f.fatal and self.policy.early_abort and not self._aborted:
            self._aborted = True
            out.append(Abort(f))

    def _slot_closed(self, item: SlotClosed, out: list[Event]) -> None:
        """A finished call: abort on an unrepairable name, else announce it when already valid."""
        name = self._acc.slot_name(item.choice, item.slot)
        if name is None:
            return  # a name may still arrive late (C05): never judged before it exists
        if resolve_name(name, self.request.names, self.policy) is None:
            f = Finding(K.UNDECLARED_OR_PREFIXED_TOOL_NAME, Severity.ERROR, Action.RETRY,
                        f"tool {name[:80]!r} is not declared", item.choice, item.slot)
            self._finding(f, out)
            return
        if item.by_finish or self._acc.choices[item.choice].slots[item.slot].followed:
            return  # the turn ends now (Done follows), or a later value may still be the real one
        call, minted = self._acc.closed_call(item.choice, item.slot)
        self._items(minted, Where(), out)
        try:
            checked, problems = check_turn(_single(item.choice, call), self.request, self.policy)
        except NeedVerdicts:
            return  # too costly to validate here: decided at the end, off the event loop
        if not any(p.fatal for p in problems):
            out.append(ToolCallValid(item.choice, item.slot, checked.choices[0].tool_calls[0]))

    def _internal(self, exc: Exception, out: list[Event]) -> None:
        f = Finding(K.GUARD_INTERNAL_ERROR, Severity.ERROR, Action.RETRY,
                    f"guard error {type(exc).__name__}: {str(exc)[:200]}")
        self._aborted = False  # make sure the finding is recorded and aborts
        self._finding(f, out)
        self._aborted = True

    # -- the end ---------------------------------------------------------------------------------

    def _drain(self, out: list[Event]) -> None:
        """Flush the SSE decoder, the accumulator's EOF checks and the markup scanners."""
        if self._aborted:
            return
        for ev in self._sse.flush():
            self._event(ev, out)
        self._decoder_checks(out)
        if not self._aborted:
            self._items(self._acc.close(), Where(), out)
        self._text.finish(out, self._stopped, self._has_slots)

    def _has_slots(self, choice: int) -> bool:
        acc = self._acc.choices.get(choice)
        return acc is not None and bool(acc.slots)

    def _decide(self, out: list[Event]) -> Decision:
        if self._aborted:
            return _decision(self.findings, None, self._acc.error)
        if self._turn is None:
            self._record(self._replaced_bytes(), out)
            self._turn, resolved = self._acc.resolve(self._text.texts(), self._text.calls)
            self._record(resolved, out)
        turn = self._turn
        if not any(f.fatal for f in self.findings):
            turn, checked = check_turn(turn, self.request, self.policy, self._verdicts)
            self._record(checked, out)
        if not any(f.fatal for f in self.findings):
            self._record(_empty_choices(turn, self.request), out)
        return _decision(self.findings, turn, self._acc.error)

    def _replaced_bytes(self) -> list[Finding]:
        """Bytes that were not UTF-8, or a lone surrogate, replaced by U+FFFD anywhere in an attempt whose
        text is read for calls (tools declared): the replaced byte may sit in a call's marker or markup (a
        fuzzed marker left a call as text; a recogniser skipped a parameter it could not read), so the
        attempt is retried, never delivered with a call changed or lost. Without tools it stays a finding."""
        if not self._text.reads_markup:
            return []
        replaced = next((f for f in self.findings if f.kind in (K.INVALID_UTF8_IN_FRAME, K.LONE_SURROGATE)), None)
        if replaced is None or replaced.fatal:
            return []
        return [Finding(replaced.kind, Severity.ERROR, Action.RETRY,
                        "a replaced byte (U+FFFD) in a stream whose text is read for tool calls", replaced.choice)]

    def _record(self, findings: list[Finding], out: list[Event]) -> None:
        self.findings.extend(findings)
        out.extend(findings)


class AttemptText:
    """One attempt's text, per choice and channel, as the turn's content: leaked tool-call markup read out
    of it (``MarkupScanner``, when tools are declared and ``tool_choice`` is not ``none``; the calls it
    recovers in ``calls``), content that may be markup residue held (``ResidueHold``) and settled at the
    end, and everything released kept for ``texts()``. Findings go to ``finding(f, out)``, the guard's
    (which may abort the attempt)."""

    def __init__(self, request: RequestSpec, policy: GuardPolicy,
                 finding: Callable[[Finding, list[Event]], None]) -> None:
        self.request = request
        self.reads_markup = bool(request.tools) and request.tool_choice != "none"
        self.allow_markup = policy.allows(Repair.LEAKED_MARKUP)
        self.calls: dict[int, list[ToolCall]] = {}  # per choice: calls recovered from markup
        self._finding = finding
        self._scanners: dict[tuple[int, Channel], MarkupScanner] = {}
        self._texts: dict[tuple[int, str], list[str]] = {}  # the attempt's text, markup removed
        self._holds: dict[int, ResidueHold] = {}  # per choice: content that may be markup residue

    def texts(self) -> dict[tuple[int, str], str]:
        """The text released so far, by (choice, channel)."""
        return {k: "".join(v) for k, v in self._texts.items()}

    def feed(self, item: TextDelta, where: Where, out: list[Event]) -> None:
        """A raw text delta of the accumulator: what is safe to release goes to ``out`` as ``TextDelta``."""
        if not self.reads_markup or item.channel == "refusal":
            self._release(item.choice, item.channel, item.text, out)
            return
        key = (item.choice, item.channel)
        scanner = self._scanners.get(key)
        if scanner is None:
            scanner = self._scanners[key] = MarkupScanner(item.choice, self.request.tools,
                                                          allow=self.allow_markup)
        self._absorb(scanner.feed(item.text, where), item.choice, item.channel, out)

    def finish(self, out: list[Event], stopped: Callable[[], bool], has_slots: Callable[[int], bool]) -> None:
        """The end of the body: each scanner's held tail, then the residue, unless ``stopped()`` (aborted);
        ``has_slots(choice)``: the choice has structured tool-call slots."""
        for (choice, channel), scanner in self._scanners.items():
            if not stopped():
                self._absorb(scanner.finish(), choice, channel, out)
        if not stopped():
            self._settle_residue(out, has_slots)

    def _absorb(self, res: ScanResult, choice: int, channel: Channel, out: list[Event]) -> None:
        self._release(choice, channel, res.text, out)
        if res.calls:
            self.calls.setdefault(choice, []).extend(res.calls)
        for f in res.findings:
            self._finding(f, out)

    def _release(self, choice: int, channel: Channel, text: str, out: list[Event]) -> None:
        if not text:
            return
        if self.reads_markup and channel == "content":
            hold = self._holds.get(choice)
            if hold is None:
                hold = self._holds[choice] = ResidueHold()
            text = hold.feed(text)
            if not text:
                return
        self._put(choice, channel, text, out)

    def _put(self, choice: int, channel: Channel, text: str, out: list[Event]) -> None:
        self._texts.setdefault((choice, channel), []).append(text)
        out.append(TextDelta(choice, channel, text))

    def _settle_residue(self, out: list[Event], has_slots: Callable[[int], bool]) -> None:
        """The text reading (``proxy.guard.stream.residue``): a held run of markup is stripped when its
        choice has calls (structured or recovered), or when it is only end-of-turn tokens
        (``residue.end_of_turn``), and the policy allows leaked-markup repairs; else it is content after
        all, released as it came."""
        for choice, hold in self._holds.items():
            held, residue = hold.held, hold.residue()
            hold.held = ""
            if not held:
                continue
            calls = bool(self.calls.get(choice)) or has_slots(choice)
            if self.allow_markup and (calls and residue or end_of_turn(held)):
                why = "the choice's calls are settled" if calls else "only end-of-turn tokens end the text"
                f = Finding(K.MARKUP_RESIDUE_IN_CONTENT, Severity.WARNING, Action.REPAIRED,
                            f"markup residue {held.strip()[:80]!r} stripped from content (rejected: content, plain: "
                            f"{why})", choice)
                self._finding(f, out)
                continue
            self._put(choice, "content", held, out)


def _single(choice: int, call: ToolCall) -> Turn:
    return Turn(choices=[ChoiceTurn(index=choice, tool_calls=[call], finish_reason="tool_calls")])


def _empty_choices(turn: Turn, request: RequestSpec) -> list[Finding]:
    """Never an empty success: a choice with no text, refusal or call (unless cut by a content filter).

    A turn of only ``finish_reason: length`` is no answer either (issue 12: it became an empty success):
    retried, and when retries run out the client learns why instead of getting nothing.
    """
    if not turn.choices:
        return [Finding(K.EMPTY_TURN, Severity.ERROR, Action.RETRY, "the upstream sent no choice at all")]
    return [Finding(K.EMPTY_TURN, Severity.ERROR, Action.RETRY,
                    "choice has only finish_reason length, no text and no tool call" if c.finish_reason == "length"
                    else "choice has no text and no tool call", c.index)
            for c in turn.choices
            if not (c.content or c.refusal or c.tool_calls) and c.finish_reason != "content_filter"]


def _decision(findings: list[Finding], turn: Turn | None, error: UpstreamError | None) -> Decision:
    """Map findings to the outcome (module docstring)."""
    fatal = next((f for f in findings if f.fatal), None)
    if fatal is not None:
        outcome = Outcome.UPSTREAM_ERROR if error is not None else Outcome.RETRY
        return Decision(outcome, None, tuple(findings), fatal.detail, error)
    actions = {f.action for f in findings}
    if Action.REPAIRED in actions:
        outcome = Outcome.REPAIRED
    elif actions & {Action.NORMALIZED, Action.IGNORED}:
        outcome = Outcome.NORMALIZED
    else:
        outcome = Outcome.CLEAN
    return Decision(outcome, turn, tuple(findings))


def _completion_as_chunk(obj: Any) -> Any:
    """A ``chat.completion`` as one chunk: each ``message`` becomes the choice's delta."""
    if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
        return obj
    choices = []
    for c in obj["choices"]:
        if not isinstance(c, dict):
            continue
        message = dict(c["message"]) if isinstance(c.get("message"), dict) else {}
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message["tool_calls"] = [_indexed(tc, i) for i, tc in enumerate(calls)]
        choices.append({"index": c.get("index", 0), "delta": message, "finish_reason": c.get("finish_reason")})
    return {**obj, "choices": choices}


def _indexed(tc: Any, i: int) -> Any:
    """A non-stream tool call gets its list position as index (the stream's slot key)."""
    if isinstance(tc, dict) and not isinstance(tc.get("index"), int):
        return {**tc, "index": i}
    return tc


def finished_inline(guard: AttemptGuard) -> Decision:
    """``guard.finish()``'s decision, any ``Pending`` validation run here, inline (tests, sans-IO use;
    the relay runs them in the validation pool instead, ``proxy.relay.schema_pool``)."""
    last = guard.finish()[-1]
    while isinstance(last, Pending):
        guard.supply({(c.schema, c.arguments): offloaded_verdict(c.schema, c.arguments) for c in last.checks})
        last = guard.finish()[-1]
    assert isinstance(last, Done)
    return last.decision


def guard_body(body: bytes, request: RequestSpec, policy: GuardPolicy) -> Decision:
    """The decision for a whole SSE body (tests, buffered use): ``feed(body)`` then ``finish()``."""
    guard = AttemptGuard(request, policy)
    guard.feed(body)
    return finished_inline(guard)


def completion_guard(body: bytes, request: RequestSpec, policy: GuardPolicy) -> AttemptGuard | Decision:
    """A guard that has read a whole non-stream answer (``chat.completion`` JSON bytes), ready to
    ``finish()``; or, for a body that is not JSON, the decision (a retry, ``UNPARSEABLE_DATA_FRAME``).
    Bytes that are not UTF-8 are read as U+FFFD and noted (``feed_completion(invalid_utf8=True)``)."""
    invalid_utf8 = False
    try:
        text = body.decode("utf-8") if isinstance(body, bytes | bytearray) else ""
    except UnicodeDecodeError:
        text, invalid_utf8 = body.decode("utf-8", errors="replace"), True
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        f = Finding(K.UNPARSEABLE_DATA_FRAME, Severity.ERROR, Action.RETRY, "response body is not JSON",
                    frame=0, offset=0, fragment=cap_fragment(text))
        return Decision(Outcome.RETRY, None, (f,), f.detail)
    guard = AttemptGuard(request, policy, stream=False)
    guard.feed_completion(obj, text, invalid_utf8=invalid_utf8)
    return guard


def decide_completion(body: bytes, request: RequestSpec, policy: GuardPolicy) -> Decision:
    """Validate a non-stream upstream answer (``chat.completion`` JSON bytes) like a stream.

    Tool calls, markup leaked into ``message.content`` / ``reasoning_content``, finish reason
    and in-band ``error`` objects are handled exactly as for streams; an unparseable body is a retry
    (``UNPARSEABLE_DATA_FRAME``). Validations over the inline budget run inline (``finished_inline``).
    """
    guard = completion_guard(body, request, policy)
    return guard if isinstance(guard, Decision) else finished_inline(guard)
