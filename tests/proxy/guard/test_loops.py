"""The loop breaker's pure core (``proxy.guard.decisions.loops``): fingerprints, history steps, the three rules.

Sans-IO: no server, no event loop, no database.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.decisions.loops import (
    EXHAUSTION_PREFIX,
    Step,
    chain_session,
    check_exhausted,
    check_turn,
    fingerprint,
    history_steps,
    merge,
    session_id,
    state_dumps,
    state_loads,
    stuck_message,
    turn_key,
)
from proxy.guard.policy import GuardPolicy
from proxy.guard.turn import ChoiceTurn, ToolCall, Turn

POLICY = GuardPolicy()


def call(name: str, args: dict[str, Any], cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def history(*steps: tuple[str, dict[str, Any], str]) -> list[dict[str, Any]]:
    """A chat history: the user's task, then per step an assistant call and its tool result."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "be useful"}, {"role": "user", "content": "fix it"}]
    for n, (name, args, result) in enumerate(steps):
        out.append({"role": "assistant", "content": None, "tool_calls": [call(name, args, f"call_{n}")]})
        out.append({"role": "tool", "tool_call_id": f"call_{n}", "content": result})
    return out


def key_of(name: str, args: dict[str, Any]) -> str:
    return turn_key(Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c", name, json.dumps(args))])]), POLICY)


def verdict(messages: list[dict[str, Any]], name: str, args: dict[str, Any], policy: GuardPolicy = POLICY) -> Any:
    steps, _ = history_steps(messages, policy)
    return check_turn(steps, turn_key(Turn(choices=[ChoiceTurn(tool_calls=[ToolCall("c", name, json.dumps(args))])]),
                                      policy), policy)


def test_a_fingerprint_is_the_name_and_the_canonical_arguments() -> None:
    """Key order and spacing do not matter; values and names do; non-JSON arguments still fingerprint."""
    assert fingerprint("read", '{"a": 1, "b": [2, 3]}') == fingerprint("read", '{"b":[2,3],"a":1}')
    assert fingerprint("read", '{"a": 1}') != fingerprint("read", '{"a": 2}')
    assert fingerprint("read", '{"a": 1}') != fingerprint("write", '{"a": 1}')
    assert fingerprint("read", "{not json").startswith("read:")


def test_the_fourth_identical_call_with_identical_results_is_stopped() -> None:
    """Three deliveries with the same result: the fourth is a loop; the third is not."""
    same = ("read_file", {"path": "a.py"}, "no such file")
    assert verdict(history(same, same), "read_file", {"path": "a.py"}) is None
    stuck = verdict(history(same, same, same), "read_file", {"path": "a.py"})
    assert stuck is not None and stuck.rule == "repeat"
    assert stuck.fingerprints == (key_of("read_file", {"path": "a.py"}),)
    assert "4th" in stuck.detail


def test_a_result_that_changes_resets_the_count() -> None:
    """The agent made progress (the result differs): no loop, until three identical results again."""
    a = ("run_tests", {}, "3 failed")
    b = ("run_tests", {}, "2 failed")
    assert verdict(history(a, a, b), "run_tests", {}) is None
    assert verdict(history(a, a, b, b), "run_tests", {}) is None
    assert verdict(history(a, a, b, b, b), "run_tests", {}) is not None


def test_another_call_in_between_breaks_the_run() -> None:
    same = ("read_file", {"path": "a.py"}, "x")
    other = ("list_dir", {"path": "."}, "a.py")
    assert verdict(history(same, same, other, same), "read_file", {"path": "a.py"}) is None


def test_a_cycle_of_two_is_stopped_at_the_last_call_of_its_third_repetition() -> None:
    """A, B, A, B, A, then B: stopped; A, B, A, B then A is not (the cycle is not complete)."""
    a = ("read_file", {"path": "a.py"}, "x = 1")
    b = ("write_file", {"path": "a.py", "text": "x = 2"}, "ok")
    assert verdict(history(a, b, a, b), "read_file", {"path": "a.py"}) is None
    stuck = verdict(history(a, b, a, b, a), "write_file", {"path": "a.py", "text": "x = 2"})
    assert stuck is not None and stuck.rule == "cycle" and len(stuck.fingerprints) == 2


def test_a_cycle_of_three_is_stopped() -> None:
    a, b, c = ("ls", {}, "1"), ("cat", {"f": "x"}, "2"), ("grep", {"p": "y"}, "3")
    steps = (a, b, c, a, b, c, a, b)
    assert verdict(history(*steps[:-1]), "cat", {"f": "x"}) is None
    stuck = verdict(history(*steps), "grep", {"p": "y"})
    assert stuck is not None and stuck.rule == "cycle" and len(stuck.fingerprints) == 3


def test_a_cycle_whose_results_change_is_progress() -> None:
    a1, a2 = ("read_file", {"path": "a.py"}, "x = 1"), ("read_file", {"path": "a.py"}, "x = 2")
    b = ("edit", {"path": "a.py"}, "ok")
    assert verdict(history(a1, b, a2, b, a2), "edit", {"path": "a.py"}) is None


def test_exempt_tools_never_count() -> None:
    """A polling tool called again and again is not a loop when the policy exempts it."""
    poll = ("job_status", {"id": 7}, "running")
    exempt = GuardPolicy(loop_exempt_tools=frozenset({"job_status"}))
    assert verdict(history(poll, poll, poll), "job_status", {"id": 7}) is not None
    assert verdict(history(poll, poll, poll), "job_status", {"id": 7}, exempt) is None


def test_the_breaker_can_be_turned_off_and_its_thresholds_set() -> None:
    same = ("read_file", {"path": "a.py"}, "x")
    assert verdict(history(same, same, same), "read_file", {"path": "a.py"}, GuardPolicy(loop_breaker=False)) is None
    assert verdict(history(same), "read_file", {"path": "a.py"}, GuardPolicy(loop_repeats=2)) is not None
    assert verdict(history(same, same, same), "read_file", {"path": "a.py"}, GuardPolicy(loop_repeats=5)) is None


def test_exhausted_turns_in_a_row_come_from_the_history() -> None:
    """Toolrelay's own exhaustion answers in the history count; a real answer in between resets."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for _ in range(2):
        msgs += [{"role": "assistant", "content": EXHAUSTION_PREFIX + ": 3 attempt(s) failed"},
                 {"role": "user", "content": "continue"}]
    steps, exhausted = history_steps(msgs, POLICY)
    assert exhausted == 2 and check_exhausted(exhausted, POLICY) is not None
    assert check_exhausted(1, POLICY) is None
    msgs.insert(3, {"role": "assistant", "content": "here is a real answer"})
    assert history_steps(msgs, POLICY)[1] == 1
    assert check_exhausted(2, GuardPolicy(loop_breaker=False)) is None


def history_from(first: int, *steps: tuple[str, dict[str, Any], str]) -> list[dict[str, Any]]:
    """``history`` whose call ids start at ``call_<first>`` (the later requests of a stateless agent)."""
    out = history(*steps)
    for message in out:
        for c in message.get("tool_calls") or ():
            c["id"] = f"call_{int(c['id'][5:]) + first}"
        if message.get("role") == "tool":
            message["tool_call_id"] = f"call_{int(message['tool_call_id'][5:]) + first}"
    return out


def test_session_state_adds_what_the_history_lacks() -> None:
    """An agent that sends only its last step: the remembered steps before it still count."""
    same = ("read_file", {"path": "a.py"}, "x")
    remembered: list[Step] = []
    for n in range(3):  # each request carries only its last call (a new id each time) and its result
        short, _ = history_steps(history_from(n, same), POLICY)
        remembered = merge(remembered, short)
    assert len(remembered) == 3
    assert check_turn(remembered, key_of("read_file", {"path": "a.py"}), POLICY) is not None


def test_a_request_sent_again_adds_no_step() -> None:
    """The same history twice (a client's retry) is one step, not two."""
    same = ("read_file", {"path": "a.py"}, "x")
    steps, _ = history_steps(history(same), POLICY)
    assert merge(merge(steps, steps), steps) == steps
    full, _ = history_steps(history(same, same), POLICY)
    assert merge(steps, full) == full, "a full history covers what was remembered"
    assert merge(full, []) == full


def test_state_round_trips_and_tolerates_garbage() -> None:
    steps = [Step("a:1", "r", "c1"), Step("", None, "t:x"), Step("b:2", None, "c2,c3")]
    assert state_loads(json.loads(json.dumps(state_dumps(steps, 2)))) == (steps, 2)
    for junk in (None, 3, "x", {"steps": "x"}, {"steps": [[1, 2, 3], ["a"]], "exhausted": -1}, {"exhausted": True}):
        assert state_loads(junk) == ([], 0)


def test_the_session_id_prefers_the_clients_header() -> None:
    """Claude Code's header, Codex's ``session_id``; else the chain of the first assistant turn; else new."""
    msgs = history(("ls", {}, "1"))
    a = session_id([(b"X-Claude-Code-Session-Id", b"s1")], tenant=1, key=2, messages=msgs)
    assert a.startswith("h:") and a == session_id([(b"x-claude-code-session-id", b"s1")], tenant=1, key=2,
                                                 messages=[])
    assert a != session_id([(b"x-claude-code-session-id", b"s1")], tenant=9, key=2, messages=msgs)
    assert session_id([(b"session_id", b"c")], tenant=1, key=2, messages=msgs).startswith("h:")
    b = session_id([], tenant=1, key=2, messages=msgs)
    assert b.startswith("c:") and b == session_id([], tenant=1, key=2, messages=[*msgs, {"role": "user",
                                                                                       "content": "more"}])
    assert b != session_id([], tenant=1, key=3, messages=msgs)
    assert session_id([], tenant=1, key=2, messages=msgs[:2]).startswith("n:"), "no assistant turn yet: new"


def _first_turn(call_id: str) -> Turn:
    return Turn(choices=[ChoiceTurn(tool_calls=[ToolCall(call_id, "ls", "{}")])])


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=30), st.text(max_size=30), st.lists(st.from_regex(r"[A-Za-z0-9_.:-]{1,24}",
                                                                                        fullmatch=True),
                                                                          min_size=2, max_size=2, unique=True))
def test_a_conversation_that_continues_joins_its_session_and_an_independent_one_never_does(
        opening: str, system: str, ids: list[str]) -> None:
    """Two conversations with one opening (parallel CI jobs, a retried job) whose first delivered turns
    differ start two chains; each continuation, whatever the client protocol did to the id's punctuation
    (Anthropic replaces it with ``_``), finds its own."""
    start = [{"role": "system", "content": system}, {"role": "user", "content": opening}]
    new = session_id([], tenant=1, key=2, messages=start)
    assert new.startswith("n:") and new == session_id([], tenant=1, key=2, messages=list(start))
    chains = [chain_session(new, _first_turn(i)) for i in ids]
    clean = [i.replace(".", "_").replace(":", "_") for i in ids]
    if re.sub(r"[^A-Za-z0-9]", "", ids[0]) == re.sub(r"[^A-Za-z0-9]", "", ids[1]):
        return  # ids equal up to punctuation: one delivered turn as far as any client can tell
    assert chains[0] != chains[1] and all(c.startswith("c:") for c in chains)
    for call_id, echoed, chain in zip(ids, clean, chains, strict=True):
        later = [*start, {"role": "assistant", "content": None,
                          "tool_calls": [call("ls", {}, echoed)]},
                 {"role": "tool", "tool_call_id": echoed, "content": "ok"},
                 {"role": "assistant", "content": None, "tool_calls": [call("ls", {}, call_id + "x")]}]
        assert session_id([], tenant=1, key=2, messages=later) == chain


def test_a_new_conversation_names_no_chain_without_call_ids() -> None:
    new = session_id([], tenant=1, key=2, messages=[{"role": "user", "content": "hi"}])
    assert chain_session(new, Turn(choices=[ChoiceTurn(content="hello")])) == ""
    assert chain_session(new, _first_turn("")) == ""
    assert chain_session("c:" + "0" * 32, _first_turn("call_1")) == "", "only a new conversation starts a chain"


def test_the_stuck_message_says_why() -> None:
    stuck = check_exhausted(2, POLICY)
    assert stuck is not None
    text = stuck_message(stuck, request_id="r1")
    assert text.startswith("[toolrelay] The agent seems stuck") and "3 turns in a row" in text and "r1" in text


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                       max_size=3), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), json_values, max_size=5), st.randoms())
def test_fingerprints_ignore_key_order_and_spacing(args: dict[str, Any], rnd: Any) -> None:
    items = list(args.items())
    rnd.shuffle(items)
    assert fingerprint("t", json.dumps(args)) == fingerprint("t", json.dumps(dict(items), indent=rnd.choice([None, 2])))


steps_st = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["r1", "r2"])), max_size=12)


@settings(max_examples=300, deadline=None)
@given(steps_st, st.sampled_from(["a", "b", "c"]))
def test_a_changed_last_result_never_completes_a_loop(seq: list[tuple[str, str]], nxt: str) -> None:
    """Whatever came before: if the last step's result differs from every earlier result of the same call,
    the agent made progress and nothing is stopped."""
    steps = [Step(k, r) for k, r in seq]
    if steps:
        last = steps[-1]
        steps[-1] = Step(last.key, "fresh")
    assert check_turn(steps, nxt, POLICY) is None or not steps


@settings(max_examples=300, deadline=None)
@given(steps_st, st.sampled_from(["a", "b", "c"]), st.integers(min_value=2, max_value=6))
def test_identical_repeats_are_stopped_exactly_at_the_threshold(seq: list[tuple[str, str]], k: str, n: int) -> None:
    """After any history, ``n - 1`` identical steps then the same call: stopped; after ``n - 2``: not by the
    repeat rule."""
    policy = GuardPolicy(loop_repeats=n)
    base = [Step(key, r) for key, r in seq] + [Step("")]
    stopped = check_turn(base + [Step(k, "same")] * (n - 1), k, policy)
    assert stopped is not None and stopped.rule == "repeat"
    early = check_turn(base + [Step(k, "same")] * (n - 2), k, policy)
    assert early is None or early.rule != "repeat"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=3),
                          st.dictionaries(st.sampled_from(["role", "content", "tool_calls", "tool_call_id"]),
                                          json_values, max_size=4)), max_size=8))
def test_any_history_is_read_without_raising(messages: list[Any]) -> None:
    steps, exhausted = history_steps(messages, POLICY)
    assert exhausted >= 0
    check_turn(steps, "a", POLICY)
    session_id([], tenant=1, key=None, messages=messages)


step_st = st.builds(Step, st.sampled_from(["a", "b", ""]), st.sampled_from([None, "r1", "r2"]),
                    st.sampled_from(["c1", "c2", "c3", "c4", "t:x", ""]))


@settings(max_examples=300, deadline=None)
@given(st.lists(step_st, max_size=8), st.lists(step_st, max_size=8))
def test_merging_keeps_the_history_last_and_a_resend_changes_nothing(remembered: list[Step],
                                                                    hist: list[Step]) -> None:
    merged = merge(remembered, hist)
    assert merged[len(merged) - len(hist):] == hist
    assert merge(merged, hist) == merged


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=2, max_size=3, unique=True),
       st.lists(st.tuples(st.sampled_from(["x", "y"]), st.sampled_from(["r1", "r2"])), max_size=5))
def test_any_cycle_is_stopped_at_the_last_call_of_its_third_repetition(cycle: list[str],
                                                                       before: list[tuple[str, str]]) -> None:
    """Whatever came before (behind a text turn), a cycle of 2 or 3 distinct calls with constant results:
    its 3rd repetition's last call is stopped, the one before it is not (by the cycle rule)."""
    base = [Step(k, r) for k, r in before] + [Step("")]
    run = [Step(k, f"res-{k}") for k in cycle * 3]
    stopped = check_turn(base + run[:-1], run[-1].key, POLICY)
    assert stopped is not None and stopped.rule == "cycle" and list(stopped.fingerprints) == cycle
    early = check_turn(base + run[:-2], run[-2].key, POLICY)
    assert early is None
