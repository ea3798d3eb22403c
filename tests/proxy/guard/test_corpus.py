"""The regression corpus: every fault case in ``shared/fault-cases`` and in the project's own
``tests/corpus`` (``D*.json``, same format; ``tests/corpus/pending`` is not loaded) through the attempt guard.

Each case's body (``raw_sse``, else ``upstream_chunks`` as ``data: X\\n\\n`` frames) is fed to
``AttemptGuard`` split at every byte (a dense sample for bodies over 1500 bytes); every split must
give the same decision, which must match the case's ``expected`` block and carry a finding whose
kind is the case's ``kind``. ``upstream_http`` cases (C47) go through ``http_error_decision``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.guard.decisions.attempt import AttemptGuard
from proxy.guard.events import Done, TextDelta
from proxy.guard.policy import GuardPolicy
from proxy.guard.stream.errors import http_error_decision
from proxy.guard.turn import Decision, Outcome, RequestSpec
from tests.fault_corpus import PATHS as CASES
from tests.fault_corpus import case as fault_case

POLICY = GuardPolicy()
DENSE_LIMIT = 1500

ACTIONS = {
    "emit": {Outcome.CLEAN, Outcome.NORMALIZED},
    "emit_after_repair": {Outcome.REPAIRED},
    "retry": {Outcome.RETRY, Outcome.UPSTREAM_ERROR},
    "error_to_client": {Outcome.UPSTREAM_ERROR},
}


def load(path: Path) -> dict[str, Any]:
    case: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return case


def body_of(case: dict[str, Any]) -> bytes:
    if case.get("raw_sse") is not None:
        return str(case["raw_sse"]).encode("utf-8")
    return "".join(f"data: {c}\n\n" for c in case["upstream_chunks"]).encode("utf-8")


def splits(n: int) -> list[int]:
    """Every split for small bodies; else the first/last 200 bytes and every 7th in between."""
    if n <= DENSE_LIMIT:
        return list(range(n + 1))
    return sorted(set(range(201)) | set(range(n - 200, n + 1)) | set(range(0, n, 7)))


def run(body: bytes, request: RequestSpec, *cuts: int) -> tuple[Decision, str]:
    """Feed ``body`` cut at ``cuts``; return the decision and the released content text."""
    guard = AttemptGuard(request, POLICY)
    events = []
    bounds = [0, *cuts, len(body)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        events += guard.feed(body[a:b])
    events += guard.finish()
    done = events[-1]
    assert isinstance(done, Done)
    assert sum(isinstance(e, Done) for e in events) == 1
    text = "".join(e.text for e in events if isinstance(e, TextDelta) and e.channel == "content")
    return done.decision, text


def summary(decision: Decision, text: str) -> tuple[Any, ...]:
    """What must not depend on the split (synthesized ids excluded)."""
    choices = []
    for c in decision.turn.choices if decision.turn else []:
        calls = [(t.name, json.loads(t.arguments), t.extra) for t in c.tool_calls]
        choices.append((c.index, c.content, c.reasoning, c.finish_reason, calls))
    kinds = [(f.kind, f.action, f.choice, f.slot, f.frame) for f in decision.findings]
    return decision.outcome, tuple(choices), tuple(kinds), text


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_it_handles_the_fault_case_at_every_split(path: Path) -> None:
    """The expected action, calls, content and finish reason, and a finding of the case's kind."""
    case = load(path)
    expected = case["expected"]
    request = RequestSpec.from_openai({"tools": case["request_tools"]})
    if case.get("upstream_http"):
        decision = http_error(case["upstream_http"])
        check(case, decision)
        return
    body = body_of(case)
    decision, text = run(body, request)
    check(case, decision)
    if decision.usable:
        assert text == (expected["content"] or "")
    reference = summary(decision, text)
    for cut in splits(len(body)):
        assert summary(*run(body, request, cut)) == reference, f"split at byte {cut}"


def http_error(spec: dict[str, Any]) -> Decision:
    raw = spec["body"] if isinstance(spec["body"], str) else json.dumps(spec["body"])
    return http_error_decision(spec["status"], raw.encode("utf-8"), {"content-type": spec["content_type"]})


def check(case: dict[str, Any], decision: Decision) -> None:
    expected = case["expected"]
    assert decision.outcome in ACTIONS[expected["action"]], decision.reason
    assert case["kind"] in {f.kind.value for f in decision.findings}
    if expected["action"] == "retry" and decision.outcome is Outcome.UPSTREAM_ERROR:
        assert decision.error is not None and decision.error.retryable
    if expected["action"] == "error_to_client":
        assert decision.error is not None and not decision.error.retryable
    if not expected["recoverable"]:
        assert not decision.usable
        return
    assert decision.turn is not None
    choice = decision.turn.choices[0]
    calls = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in choice.tool_calls]
    assert calls == expected["tool_calls"]
    assert choice.content == expected["content"]
    assert choice.finish_reason == expected["finish_reason"]
    assert all(c.id for c in choice.tool_calls)
    assert len({c.id for c in choice.tool_calls}) == len(choice.tool_calls)
    for key in ("tool_call_ids",):
        if key in expected:
            assert [c.id for c in choice.tool_calls] == expected[key]
    if "usage" in expected:
        assert decision.turn.usage == expected["usage"]


def test_it_mints_call_ids_in_the_documented_shape() -> None:
    """C08: a call without id gets ``call_`` + 24 alphanumerics, distinct per call."""
    case = fault_case("C08")
    request = RequestSpec.from_openai({"tools": case["request_tools"]})
    ids = set()
    for _ in range(3):
        decision, _ = run(body_of(case), request)
        assert decision.turn is not None
        (call,) = decision.turn.choices[0].tool_calls
        assert call.id.startswith("call_") and len(call.id) == 29 and call.id[5:].isalnum()
        ids.add(call.id)
    assert len(ids) == 3


def test_it_keeps_provider_extension_fields_on_calls() -> None:
    """C10: Gemini's ``extra_content`` (thought signature) stays attached to the call."""
    case = fault_case("C10")
    decision, _ = run(body_of(case), RequestSpec.from_openai({"tools": case["request_tools"]}))
    assert decision.turn is not None
    extra = decision.turn.choices[0].tool_calls[0].extra
    assert extra == {"extra_content": {"google": {"thought_signature": "<opaque-signature>"}}}


def test_it_aborts_early_on_the_fatal_corpus_cases() -> None:
    """C41, C43, C45: the attempt is aborted at the offending frame, then decided."""
    from proxy.guard.events import Abort

    for name in ("C41", "C43", "C45"):
        case = fault_case(name)
        guard = AttemptGuard(RequestSpec.from_openai({"tools": case["request_tools"]}), POLICY)
        events = guard.feed(body_of(case))
        aborts = [e for e in events if isinstance(e, Abort)]
        assert len(aborts) == 1 and aborts[0].finding.kind.value == case["kind"], name
        assert guard.feed(b"data: {}\n\n") == []
        done = guard.finish()[-1]
        assert isinstance(done, Done) and not done.decision.usable
