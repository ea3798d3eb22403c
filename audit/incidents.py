"""Incidents: what an operator watching the live feed must see, decided from the audit journal's records.

The journal writer (``audit.journal_writer``) reads every record the relay journals; ``Detector.feed``
turns those records into incidents, without the database (Postgres may be what is down):

- ``exhausted``: a request whose retries ran out (finish record, outcome ``exhausted``);
- ``retry``: a request that needed more than one upstream call and was recovered (``recovered-by-retry``);
- ``loop-broken``: a finding of kind ``agent-loop`` (the loop breaker's), in any record;
- ``retry-budget``: a finding of kind ``retry-budget-spent`` (a tenant's retry budget stopped a retry,
  ``proxy.policy.retry_budget``); one incident per tenant per ``BUDGET_QUIET`` seconds;
- ``money-budget``: a finding of kind ``money-budget-threshold`` (a money budget passed its soft threshold;
  one per budget and window by construction, ``proxy.policy.limits``);
- ``upstream-unreachable``: ``BURST_COUNT`` attempts to one upstream within ``BURST_WINDOW`` seconds that
  could not connect, timed out or got a 5xx; one incident per burst (quiet for a window after it);
- ``circuit-open`` / ``circuit-closed`` / ``key-disabled``: a routing state change (``proxy.routing``; a
  ``routing`` record), as journaled; these also go to the operator's webhook (``ROUTING_KINDS``);
- ``journal-not-draining`` / ``journal-draining``: the writer's database state changed (``journal_state``).

An incident is a plain dict (JSON as sent over the WebSocket): ``kind``, ``severity`` (``error``,
``warning``, ``info``), ``tenant_id`` (None: about the process, not a tenant), ``request_id``,
``upstream_id``, ``title``, ``detail`` (capped at ``DETAIL_CAP`` characters) and ``at`` (unix seconds).
Never raises on a malformed record: it is skipped.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import Any

#: The finding kind the loop breaker records (``proxy.guard.findings.FindingKind``), matched by name.
AGENT_LOOP = "agent-loop"
#: The finding kind of a retry the tenant's retry budget refused.
RETRY_BUDGET_SPENT = "retry-budget-spent"
#: The finding kind of a money budget past its soft threshold.
MONEY_BUDGET_THRESHOLD = "money-budget-threshold"
#: Seconds after a ``retry-budget`` incident during which the same tenant's are not repeated.
BUDGET_QUIET = 600.0
#: Attempt findings that mean the upstream could not be reached or did not answer in time.
UNREACHABLE_KINDS = frozenset({"upstream_connection_error", "upstream_timeout"})
BURST_COUNT = 3
BURST_WINDOW = 60.0
DETAIL_CAP = 300
#: Upstreams whose recent failures are remembered at once (oldest forgotten first).
MAX_TRACKED = 1000

#: The incident kinds of routing records (``audit.records.routing_changed``).
ROUTING_KINDS = frozenset({"circuit-open", "circuit-closed", "key-disabled"})

Incident = dict[str, Any]
#: (kind, label) of every incident kind, in the order the live page offers them.
KINDS = (("exhausted", "exhausted"), ("retry", "recovered by retry"), ("loop-broken", "loop broken"),
         ("retry-budget", "retry budget spent"), ("money-budget", "money budget nearly spent"),
         ("upstream-unreachable", "upstream unreachable"), ("circuit-open", "circuit opened"),
         ("circuit-closed", "circuit closed"), ("key-disabled", "upstream key disabled"),
         ("journal-not-draining", "journal not draining"),
         ("journal-draining", "journal draining again"))


def incident(kind: str, severity: str, title: str, *, tenant_id: int | None = None, request_id: str | None = None,
             upstream_id: int | None = None, detail: str = "", at: float | None = None) -> Incident:
    """One incident (see the module docstring for the fields)."""
    return {"kind": kind, "severity": severity, "tenant_id": tenant_id, "request_id": request_id,
            "upstream_id": upstream_id, "title": title[:200], "detail": (detail or "")[:DETAIL_CAP],
            "at": at if at is not None else time.time()}


def journal_state(database: str, *, backlog: int, error: str = "") -> Incident:
    """The incident of the journal writer's database state becoming ``database`` (``down`` or ``ok``)."""
    if database == "down":
        return incident("journal-not-draining", "error", "The audit journal is not draining into the database",
                        detail=f"{error} (backlog {backlog:,} bytes kept on local disk)")
    return incident("journal-draining", "info", "The audit journal drains into the database again",
                    detail=f"backlog {backlog:,} bytes")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _findings(record: dict[str, Any]) -> list[dict[str, Any]]:
    found = record.get("findings")
    if not isinstance(found, list):
        res = record.get("res")
        found = res.get("findings") if isinstance(res, dict) else None
    return [f for f in found if isinstance(f, dict)] if isinstance(found, list) else []


class Detector:
    """Journal records in, incidents out; remembers recent upstream failures for the burst rule."""

    def __init__(self, *, burst_count: int = BURST_COUNT, burst_window: float = BURST_WINDOW) -> None:
        self.burst_count = burst_count
        self.burst_window = burst_window
        self._failures: dict[tuple[int, int | None], deque[float]] = {}
        self._quiet_until: dict[tuple[int, int | None], float] = {}
        self._budget_quiet: dict[int, float] = {}

    def feed(self, records: Iterable[dict[str, Any]]) -> list[Incident]:
        """The incidents of ``records`` (journal lines in order)."""
        out: list[Incident] = []
        for record in records:
            try:
                out.extend(self._one(record))
            except (TypeError, ValueError, KeyError, AttributeError):
                continue
        return out

    def _one(self, record: dict[str, Any]) -> list[Incident]:
        kind, rid = record.get("t"), record.get("id")
        if not isinstance(rid, str):
            return []
        tenant = _int(record.get("tenant_id"))
        req = record.get("req")
        if tenant is None and isinstance(req, dict):
            tenant = _int(req.get("tenant_id"))
        if tenant is None:
            return []
        if kind == "routing":
            return self._routing(record, tenant, rid)
        out = self._loops(record, tenant, rid)
        out.extend(self._budget(record, tenant, rid))
        out.extend(self._money(record, tenant, rid))
        if kind == "finish":
            out.extend(self._finished(record, tenant, rid))
        elif kind == "attempt":
            out.extend(self._attempt(record, tenant, rid))
        return out

    def _routing(self, record: dict[str, Any], tenant: int, rid: str) -> list[Incident]:
        event = record.get("event")
        if event not in ROUTING_KINDS:
            return []
        severity = record.get("severity") if record.get("severity") in ("error", "warning", "info") else "warning"
        return [incident(str(event), str(severity), str(record.get("title") or event), tenant_id=tenant,
                         upstream_id=_int(record.get("upstream_id")), detail=str(record.get("detail") or ""),
                         at=_at(record))]

    def _loops(self, record: dict[str, Any], tenant: int, rid: str) -> list[Incident]:
        loops = [f for f in _findings(record) if f.get("kind") == AGENT_LOOP]
        if not loops:
            return []
        upstream = _int(record.get("upstream_id")) or _int((record.get("req") or {}).get("upstream_id"))
        return [incident("loop-broken", "warning", "An agent loop was broken", tenant_id=tenant, request_id=rid,
                         upstream_id=upstream, detail=str(loops[0].get("detail") or ""), at=_at(record))]

    def _budget(self, record: dict[str, Any], tenant: int, rid: str) -> list[Incident]:
        spent = [f for f in _findings(record) if f.get("kind") == RETRY_BUDGET_SPENT]
        now = _at(record.get("res") or record, "finished") if record.get("t") == "finish" else _at(record)
        if not spent or now < self._budget_quiet.get(tenant, 0.0):
            return []
        self._budget_quiet[tenant] = now + BUDGET_QUIET
        if len(self._budget_quiet) > MAX_TRACKED:
            self._budget_quiet.pop(next(iter(self._budget_quiet)))
        upstream = _int((record.get("req") or {}).get("upstream_id"))
        return [incident("retry-budget", "warning", "The tenant's retry budget is spent: broken answers get one "
                         "attempt", tenant_id=tenant, request_id=rid, upstream_id=upstream,
                         detail=str(spent[0].get("detail") or ""), at=now)]

    def _money(self, record: dict[str, Any], tenant: int, rid: str) -> list[Incident]:
        if record.get("t") != "start":
            return []
        return [incident("money-budget", "warning", "A money budget is nearly spent", tenant_id=tenant,
                         request_id=rid, detail=str(f.get("detail") or ""), at=_at(record.get("req") or {}))
                for f in _findings(record) if f.get("kind") == MONEY_BUDGET_THRESHOLD]

    def _finished(self, record: dict[str, Any], tenant: int, rid: str) -> list[Incident]:
        req, res = record.get("req") or {}, record.get("res") or {}
        upstream = _int(req.get("upstream_id"))
        outcome, attempts = res.get("outcome"), _int(res.get("attempts")) or 0
        model = str(req.get("model") or "")[:100]
        if outcome == "exhausted":
            return [incident("exhausted", "error", f"Retries ran out after {attempts} attempt(s) ({model})",
                             tenant_id=tenant, request_id=rid, upstream_id=upstream, detail=str(res.get("error", "")),
                             at=_at(res, "finished"))]
        if outcome == "recovered-by-retry":
            return [incident("retry", "warning", f"Recovered by retry after {attempts} attempts ({model})",
                             tenant_id=tenant, request_id=rid, upstream_id=upstream, at=_at(res, "finished"))]
        return []

    def _attempt(self, record: dict[str, Any], tenant: int, rid: str) -> list[Incident]:
        if record.get("outcome") != "upstream-error" or not _unreachable(record):
            return []
        upstream = _int(record.get("upstream_id"))
        key, now = (tenant, upstream), _at(record)
        times = self._failures.setdefault(key, deque())
        times.append(now)
        while times and times[0] < now - self.burst_window:
            times.popleft()
        if len(self._failures) > MAX_TRACKED:
            self._failures.pop(next(iter(self._failures)))
        if len(times) < self.burst_count or now < self._quiet_until.get(key, 0.0):
            return []
        self._quiet_until[key] = now + self.burst_window
        if len(self._quiet_until) > MAX_TRACKED:
            self._quiet_until.pop(next(iter(self._quiet_until)))
        return [incident("upstream-unreachable", "error",
                         f"{len(times)} failed calls to one upstream within {self.burst_window:g} s",
                         tenant_id=tenant, request_id=rid, upstream_id=upstream,
                         detail=str(record.get("abort_reason") or ""), at=now)]


def _unreachable(record: dict[str, Any]) -> bool:
    status = _int(record.get("upstream_status"))
    return (status is not None and status >= 500) or any(f.get("kind") in UNREACHABLE_KINDS
                                                         for f in _findings(record))


def _at(record: dict[str, Any], key: str = "created") -> float:
    value = record.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else time.time()
