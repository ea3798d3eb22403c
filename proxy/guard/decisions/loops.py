"""The loop breaker's pure core: is the agent about to be handed the same step again? (issue 14, item 3)

Sans-IO: plain dicts and strings in, a verdict out; never raises on any input.

A *step* is one assistant turn of the agent's session: the fingerprints of its tool calls (``key``;
``""`` for a turn without calls) and a digest of the tool results the client sent back for them
(``result``; None while unknown). The steps come from the request's own history
(``history_steps``: its chat.completions ``messages``, which every dialect's translation already
pairs, one ``tool`` message per call, ``proxy.guard.protocols.tool_history``), merged with what the session
state remembers (``merge``: the state adds what a compacted or restarted history lacks).

``check_turn`` says whether the turn about to be delivered completes a loop:

- *repeat*: the same call (``GuardPolicy.loop_repeats``, default 4) would be delivered a 4th time in
  a row and the three previous results are identical;
- *cycle*: a cycle of two or three calls would complete its ``loop_cycle_repeats``-th (default 3rd)
  repetition (A, B, A, B, A, B: the last B), every repeat of a call having had the same result;
- a result that differs between the repeats (the agent made progress) breaks the run, so counting
  starts again.

``check_exhausted`` says whether an exhausted request is the ``loop_exhausted_turns``-th (default
3rd) in a row. Calls to the policy's exempt tools (polling tools: ``loop_exempt_tools``) are left out
of every fingerprint; a turn with only exempt calls never counts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.guard.policy import GuardPolicy
from proxy.guard.turn import Turn

#: Steps the session state keeps (the longest window, a 3-cycle repeated 3 times, is 9).
MAX_STEPS = 16
#: The text every exhaustion answer starts with (``proxy.guard.decisions.answer.exhaustion_message``).
EXHAUSTION_PREFIX = "[toolrelay] The upstream model could not produce a valid answer"
#: The text every loop-breaker answer starts with (``stuck_message``).
STUCK_PREFIX = "[toolrelay] The agent seems stuck"
#: The key of a step whose calls are all exempt: never equal to another step's.
_EXEMPT = "\x00exempt"


@dataclass(frozen=True, slots=True)
class Step:
    """One assistant turn: ``key`` (call fingerprints joined by ``" + "``, ``""`` without calls),
    ``result`` (16 hex digits of the tool results' SHA-256, None while unknown) and ``ids``, what
    identifies the turn across requests (its call ids joined by ``,``; ``t:`` + a digest of a text
    turn's text; ``""`` when unknown)."""

    key: str
    result: str | None = None
    ids: str = ""

    @property
    def counts(self) -> bool:
        """True for a step with (non-exempt) tool calls."""
        return bool(self.key) and self.key != _EXEMPT


@dataclass(frozen=True, slots=True)
class Stuck:
    """The loop found: ``rule`` (``repeat`` | ``cycle`` | ``exhausted``), a human ``detail`` and the
    ``fingerprints`` of the calls that repeat (empty for ``exhausted``)."""

    rule: str
    detail: str
    fingerprints: tuple[str, ...] = ()


def fingerprint(name: str, arguments: str) -> str:
    """``name:`` + 16 hex digits of the SHA-256 of the canonical arguments (JSON with sorted keys and no
    spaces; the raw text when it is not JSON), so ``{"a":1,"b":2}`` and ``{"b": 2, "a": 1}`` are one call."""
    try:
        canonical = json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        canonical = str(arguments)
    return f"{name}:{_digest(canonical)}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _key(calls: Sequence[tuple[str, str]], exempt: frozenset[str]) -> str:
    kept = [fingerprint(name, arguments) for name, arguments in calls if name not in exempt]
    if not kept:
        return _EXEMPT if calls else ""
    return " + ".join(kept)


def turn_key(turn: Turn, policy: GuardPolicy) -> str:
    """The key of the turn about to be delivered: its first choice with tool calls (``""`` without any)."""
    for choice in turn.choices:
        if choice.tool_calls:
            return _key([(c.name, c.arguments) for c in choice.tool_calls], policy.loop_exempt_tools)
    return ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "" if content is None else json.dumps(content, sort_keys=True, default=str)


def _call(raw: Any) -> tuple[str, str] | None:
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict):
        return None
    arguments = fn.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, sort_keys=True, default=str)
    return str(fn.get("name") or ""), arguments


def history_steps(messages: Any, policy: GuardPolicy) -> tuple[list[Step], int]:
    """The steps of a chat.completions ``messages`` history and how many of its last assistant turns in a
    row were toolrelay's exhaustion answer (``EXHAUSTION_PREFIX``). Malformed entries are skipped."""
    if not isinstance(messages, list):
        return [], 0
    steps: list[Step] = []
    exhausted = 0
    i = 0
    while i < len(messages):
        message = messages[i]
        i += 1
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        raw = message.get("tool_calls")
        raw_calls: list[Any] = raw if isinstance(raw, list) else []
        calls = [c for c in (_call(r) for r in raw_calls) if c is not None]
        if not calls:
            text = _text(message.get("content"))
            exhausted = exhausted + 1 if EXHAUSTION_PREFIX in text else 0  # after streamed text too
            steps.append(Step("", None, "t:" + _digest(text)))
            continue
        exhausted = 0
        ids = [r.get("id") for r in raw_calls if isinstance(r, dict)]
        ident = ",".join(str(i) for i in ids)
        results: list[str] = []
        while i < len(messages) and isinstance(messages[i], dict) and messages[i].get("role") == "tool":
            if messages[i].get("tool_call_id") in ids or not ids:
                results.append(_text(messages[i].get("content")))
            i += 1
        steps.append(Step(_key(calls, policy.loop_exempt_tools), _digest("\x1e".join(results)) if results else None,
                          ident))
    return steps, exhausted


def merge(remembered: Sequence[Step], history: Sequence[Step]) -> list[Step]:
    """The session's steps: the steps the session state ``remembered`` (seen in earlier requests' histories)
    that this ``history`` lacks (by ``Step.ids``: a compacted history, an agent that sends only its last
    step), then the history. A request sent again adds nothing: its steps are the remembered ones."""
    have = {s.ids for s in history if s.ids}
    return [*(s for s in remembered if s.ids and s.ids not in have), *history]


def check_turn(steps: Sequence[Step], key: str, policy: GuardPolicy) -> Stuck | None:
    """The loop the turn with ``key`` would complete after ``steps`` (oldest first), or None."""
    if not policy.loop_breaker or not key or key == _EXEMPT:
        return None
    return _repeat(steps, key, policy.loop_repeats) or _cycle(steps, key, policy.loop_cycle_repeats)


def _repeat(steps: Sequence[Step], key: str, repeats: int) -> Stuck | None:
    need = repeats - 1
    if repeats < 2 or len(steps) < need:
        return None
    window = steps[len(steps) - need:]
    first = window[0].result
    if first is None or any(s.key != key or s.result != first for s in window):
        return None
    return Stuck("repeat", f"the same tool call would be delivered a {_nth(repeats)} time in a row, "
                           f"and the previous {need} results were identical: {key}", tuple(key.split(" + ")))


def _cycle(steps: Sequence[Step], key: str, repeats: int) -> Stuck | None:
    if repeats < 2:
        return None
    for period in (2, 3):
        size = period * repeats
        if len(steps) < size - 1:
            continue
        window = [*steps[len(steps) - size + 1:], Step(key)]
        cycle = [s.key for s in window[:period]]
        if len(set(cycle)) < 2 or not all(s.counts for s in window):
            continue
        if any(window[j].key != window[j + period].key for j in range(size - period)):
            continue
        known = range(size - 1 - period)  # pairs of repeats whose results are both known
        if any(window[j].result is None or window[j].result != window[j + period].result for j in known):
            continue
        return Stuck("cycle", f"a cycle of {period} tool calls would complete its {_nth(repeats)} repetition, "
                              f"with the same results each time: {' -> '.join(cycle)}", tuple(cycle))
    return None


def check_exhausted(exhausted_before: int, policy: GuardPolicy) -> Stuck | None:
    """The loop when this exhausted request follows ``exhausted_before`` exhausted turns in a row, or None."""
    turns = policy.loop_exhausted_turns
    if not policy.loop_breaker or turns < 1 or exhausted_before < turns - 1:
        return None
    return Stuck("exhausted", f"{exhausted_before + 1} turns in a row ended without a valid answer from the "
                              f"upstream model")


def stuck_message(stuck: Stuck, *, request_id: str) -> str:
    """The terminal assistant message that replaces the looping answer (agents do not retry it)."""
    return (f"{STUCK_PREFIX} and toolrelay stopped it: {stuck.detail}. No tool was run. Change the approach, "
            f"check the tool's output, or ask the user how to go on. Request id: {request_id}.")


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def state_dumps(steps: Sequence[Step], exhausted: int) -> dict[str, Any]:
    """The session state to keep (JSON-ready): the last ``MAX_STEPS`` steps and the exhausted count."""
    return {"steps": [[s.key, s.result, s.ids] for s in steps[-MAX_STEPS:]], "exhausted": exhausted}


def state_loads(data: Any) -> tuple[list[Step], int]:
    """``state_dumps``' value back; anything malformed reads as an empty state."""
    if not isinstance(data, dict):
        return [], 0
    raw, exhausted = data.get("steps"), data.get("exhausted")
    steps = [Step(e[0], e[1] if isinstance(e[1], str) else None, e[2]) for e in raw
             if isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and isinstance(e[2], str)] \
        if isinstance(raw, list) else []
    return steps[-MAX_STEPS:], exhausted if isinstance(exhausted, int) and not isinstance(exhausted, bool) \
        and exhausted >= 0 else 0


#: Request headers that name the agent's session, in the order they are looked at: Claude Code's
#: ``x-claude-code-session-id`` (PROTOCOLS.md); Codex's ``session_id`` / ``conversation_id`` and
#: ``x-codex-session-id`` [3P: openai/codex codex-api ResponsesOptions, codex-lb]; OpenCode's
#: ``x-opencode-session`` [3P: OpenCode plugins and gateways]; the generic ``x-session-id``.
SESSION_HEADERS = (b"x-claude-code-session-id", b"session_id", b"conversation_id", b"x-codex-session-id",
                   b"x-opencode-session", b"x-session-id")


def session_id(headers: Iterable[tuple[bytes, bytes]], *, tenant: int, key: int | None,
               messages: Any) -> str:
    """The agent session's id, joined only with proof (issue 23, item 2): ``h:`` + the client's session
    header (hashed with the tenant and key, so two tenants never share a session); else ``c:`` + the
    conversation's chain, the digest of its *first assistant turn* (the call ids toolrelay delivered, or
    the text's digest) with tenant and key: a continuing conversation carries that turn in every later
    history, an independent one with the same opening does not; else (no assistant turn yet: a new
    conversation) ``n:`` + the tenant and key, which has no state of its own (``chain_session`` names the
    state its first delivered turn starts). 32 hex digits after the prefix."""
    wanted = {name: i for i, name in enumerate(SESSION_HEADERS)}
    found = sorted((wanted[n.lower()], v) for n, v in headers if n.lower() in wanted and v.strip())
    if found:
        value = found[0][1][:200].decode("latin-1")
        return "h:" + hashlib.sha256(f"{tenant}\x1f{key}\x1f{value}".encode()).hexdigest()[:32]
    new = "n:" + hashlib.sha256(f"{tenant}\x1f{key}".encode()).hexdigest()[:32]
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict) and message.get("role") == "assistant":
            return _chained(new, _anchor_of_message(message))
    return new


def chain_session(session: str, turn: Turn) -> str:
    """The session a new conversation (``session`` starts with ``n:``) continues in once ``turn`` is
    delivered: ``c:`` + its chain from the turn's call ids; ``""`` when the turn has no call ids (nothing
    for the next request to prove) or ``session`` is not new."""
    if not session.startswith("n:"):
        return ""
    for choice in turn.choices:
        if choice.tool_calls:
            ids = [c.id for c in choice.tool_calls]
            return _chained(session, _anchor_of_ids(ids)) if all(ids) else ""
    return ""


_ID_NOISE = re.compile(r"[^A-Za-z0-9]")


def _anchor_of_ids(ids: Sequence[Any]) -> str:
    """Call ids as every client protocol gives them back (Anthropic's ``tool_use`` ids are the delivered
    ids with other characters replaced: compare letters and digits only)."""
    return "ids:" + ",".join(_ID_NOISE.sub("", str(i))[:200] for i in ids)


def _anchor_of_message(message: dict[str, Any]) -> str:
    raw = message.get("tool_calls")
    ids = [r.get("id") for r in raw if isinstance(r, dict)] if isinstance(raw, list) else []
    if ids and all(isinstance(i, str) and i for i in ids):
        return _anchor_of_ids(ids)
    return "text:" + _digest(_text(message.get("content")))


def _chained(new: str, anchor: str) -> str:
    return "c:" + hashlib.sha256(f"{new}\x1f{anchor}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
