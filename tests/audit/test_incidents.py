"""``audit.incidents.Detector``: journal records in, incidents out (no database, no I/O)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from audit.incidents import BUDGET_QUIET, Detector, journal_state

REQ = {"tenant_id": 7, "upstream_id": 3, "model": "coder", "path": "guarded"}


def finish(outcome: str, attempts: int = 2, rid: str = "r1", **res: Any) -> dict[str, Any]:
    return {"t": "finish", "id": rid, "req": REQ, "res": {"outcome": outcome, "attempts": attempts,
                                                           "finished": 100.0, **res}}


def attempt(*, at: float, status: int | None = None, kinds: tuple[str, ...] = ("upstream_connection_error",),
            outcome: str = "upstream-error", upstream: int = 3, rid: str = "r1") -> dict[str, Any]:
    return {"t": "attempt", "id": rid, "tenant_id": 7, "number": 0, "upstream_id": upstream, "outcome": outcome,
            "upstream_status": status, "abort_reason": "connection refused", "created": at,
            "findings": [{"kind": k, "severity": "error", "action": "retry", "detail": "x"} for k in kinds]}


def test_it_reports_exhausted_and_retried_requests_with_their_tenant_and_upstream() -> None:
    """An exhausted request is an ``error``, a recovered one a ``retry`` ``warning``; clean ones are nothing."""
    found = Detector().feed([finish("exhausted", 3, error="the arguments were not JSON"),
                             finish("recovered-by-retry", 2, rid="r2"), finish("clean", 1, rid="r3")])
    assert [(i["kind"], i["severity"], i["request_id"]) for i in found] == [
        ("exhausted", "error", "r1"), ("retry", "warning", "r2")]
    assert found[0]["tenant_id"] == 7 and found[0]["upstream_id"] == 3
    assert "3 attempt" in found[0]["title"] and found[0]["detail"] == "the arguments were not JSON"
    assert found[0]["at"] == 100.0


def test_it_reports_a_broken_agent_loop_wherever_its_finding_is() -> None:
    """A finding of kind ``agent-loop`` on a request's start, an attempt or its finish is a ``loop-broken``."""
    loop = [{"kind": "agent-loop", "severity": "warning", "action": "error", "detail": "same call 4 times"}]
    records = [{"t": "start", "id": "a", "req": REQ, "findings": loop},
               {**attempt(at=1.0, kinds=(), outcome="clean", rid="b"), "findings": loop},
               {**finish("clean", 1, rid="c"), "res": {"outcome": "clean", "findings": loop}}]
    found = Detector().feed(records)
    assert [(i["kind"], i["request_id"]) for i in found] == [("loop-broken", "a"), ("loop-broken", "b"),
                                                             ("loop-broken", "c")]
    assert found[0]["detail"] == "same call 4 times"


def test_it_reports_one_incident_per_burst_of_unreachable_calls() -> None:
    """Three failed calls to one upstream within the window: one incident; more within the window are quiet;
    a burst after it is reported again; failures spread out never are."""
    detector = Detector(burst_count=3, burst_window=60)
    burst = detector.feed([attempt(at=t) for t in (0.0, 10.0, 20.0, 30.0, 40.0)])
    assert [(i["kind"], i["at"]) for i in burst] == [("upstream-unreachable", 20.0)]
    assert detector.feed([attempt(at=t) for t in (200.0, 201.0, 202.0)])[0]["at"] == 202.0
    assert Detector().feed([attempt(at=t) for t in (0.0, 100.0, 200.0, 300.0)]) == []


def test_it_counts_5xx_answers_and_keeps_upstreams_apart() -> None:
    """A 503 counts as unreachable; a 400 or broken output does not; two upstreams do not add up."""
    detector = Detector(burst_count=2, burst_window=60)
    assert detector.feed([attempt(at=1.0, status=400, kinds=()), attempt(at=2.0, status=400, kinds=())]) == []
    assert detector.feed([attempt(at=1.0, upstream=1), attempt(at=2.0, upstream=2)]) == []
    assert len(detector.feed([attempt(at=3.0, status=503, kinds=(), upstream=5),
                              attempt(at=4.0, status=503, kinds=(), upstream=5)])) == 1


def test_the_journal_state_is_a_process_incident() -> None:
    """The journal's state change carries no tenant (every viewer may see it) and says the backlog."""
    down = journal_state("down", backlog=12_345, error="OperationalError: gone")
    assert (down["kind"], down["severity"], down["tenant_id"]) == ("journal-not-draining", "error", None)
    assert "12,345 bytes" in down["detail"] and "OperationalError" in down["detail"]
    assert journal_state("ok", backlog=0)["kind"] == "journal-draining"


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                  max_size=4), max_leaves=12)
_record = st.fixed_dictionaries({"t": st.sampled_from(["start", "attempt", "finish", "x"]),
                                 "id": st.one_of(st.text(max_size=4), st.integers())},
                                optional={"tenant_id": _json, "req": _json, "res": _json, "findings": _json,
                                          "outcome": _json, "upstream_status": _json, "created": _json,
                                          "upstream_id": _json})


@given(st.lists(_record, max_size=8))
def test_it_never_raises_on_any_record(records: list[dict[str, Any]]) -> None:
    """Garbage records are skipped: the writer thread must never fail on what the journal holds."""
    for item in Detector(burst_count=1).feed(records):
        assert isinstance(item["kind"], str) and isinstance(item["title"], str)


def test_it_reports_a_spent_retry_budget_once_per_tenant_per_quiet_period() -> None:
    """A ``retry-budget-spent`` finding is a ``retry-budget`` warning; more of the same tenant's within
    ``BUDGET_QUIET`` are not repeated; another tenant's are its own."""
    spent = [{"kind": "retry-budget-spent", "severity": "warning", "action": "ignored", "detail": "50% spent"}]
    other = {**REQ, "tenant_id": 8}
    records = [{**finish("exhausted", 1, rid=f"r{n}", finished=100.0 + n), "findings": spent} for n in range(3)]
    records.append({"t": "finish", "id": "x", "req": other, "res": {"outcome": "exhausted", "attempts": 1,
                                                                     "finished": 101.0}, "findings": spent})
    records.append({**finish("exhausted", 1, rid="late", finished=100.0 + BUDGET_QUIET + 1), "findings": spent})
    found = [i for i in Detector().feed(records) if i["kind"] == "retry-budget"]
    assert [(i["tenant_id"], i["request_id"]) for i in found] == [(7, "r0"), (8, "x"), (7, "late")]
    assert found[0]["detail"] == "50% spent" and found[0]["severity"] == "warning"


def test_routing_changes_are_incidents_and_go_to_the_operators_webhook(monkeypatch: Any) -> None:
    from audit import journal_writer, records
    from audit.incidents import ROUTING_KINDS
    from audit.journal import Line

    journaled: list[dict[str, Any]] = []
    monkeypatch.setattr(records, "_journal_append", journaled.append)
    records.routing_changed(event="circuit-open", severity="error", tenant_id=3, upstream_id=9,
                            title="upstream u: the circuit opened", detail="no response within 1 s")
    records.routing_changed(event="bogus", severity="?", tenant_id=3, upstream_id=9, title="x")
    found = Detector().feed(journaled)
    assert [(i["kind"], i["severity"], i["tenant_id"], i["upstream_id"]) for i in found] == [
        ("circuit-open", "error", 3, 9)]
    assert found[0]["detail"] == "no response within 1 s" and "circuit-open" in ROUTING_KINDS
    posted: list[dict[str, Any]] = []
    monkeypatch.setattr(journal_writer.operator_alert, "post", posted.append)
    monkeypatch.setattr(journal_writer.incident_feed, "publish", lambda items: len(items))
    writer = journal_writer.JournalWriter.__new__(journal_writer.JournalWriter)
    writer._incidents, writer._published = Detector(), 0
    writer._publish([Line(record, 10 * (n + 1)) for n, record in enumerate(journaled)])
    assert [p["kind"] for p in posted] == ["circuit-open"]


def test_a_money_budget_threshold_is_an_incident() -> None:
    """Issue 19 item 4: the admission's ``money-budget-threshold`` finding (on the request's start record)."""
    from audit.incidents import Detector

    record = {"t": "start", "id": "r-money", "req": {"tenant_id": 3, "created": 5.0}, "findings": [
        {"kind": "money-budget-threshold", "severity": "warning", "action": "ignored",
         "detail": "the tenant's daily budget passed 80%"}]}
    (found,) = Detector().feed([record])
    assert (found["kind"], found["tenant_id"], found["request_id"]) == ("money-budget", 3, "r-money")
    assert "daily budget" in found["detail"]
