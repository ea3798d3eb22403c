"""The request path's audit records, appended to the process's journal (never the database).

``request_started``, ``attempt_finished``, ``limit_learned`` and ``request_finished`` each append one
self-contained record (a few microseconds; never raises or waits for the database). The journal
writer (``audit.journal_writer``) moves them into the database through ``audit.services``. Nothing
here ever sees request headers or credentials.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from proxy.guard.findings import Finding as GuardFinding
from proxy.guard.policy import FragmentStorage


@dataclass(slots=True)
class RequestRecord:
    """What is known of a client request when it starts. ``id`` is also the client's x-request-id."""

    id: uuid.UUID
    tenant_id: int
    api_key_id: int | None
    model: str
    path: str
    client_protocol: str = "openai-chat"
    client_user_agent: str = ""
    route_id: int | None = None
    upstream_id: int | None = None
    upstream_model: str = ""
    fragments: FragmentStorage = FragmentStorage.OFFENDING
    created: datetime = field(default_factory=timezone.now)
    #: Request-level findings (not about an upstream answer: client fields not forwarded).
    findings: Sequence[GuardFinding] = ()
    #: The membership owning the key (``Principal.member_id``) and its user name then; None / "" for tenant keys.
    member_id: int | None = None
    member_username: str = ""


@dataclass(slots=True)
class AttemptRecord:
    """One finished upstream attempt. Durations in milliseconds; ``body`` is the raw upstream body
    (kept only when the policy stores whole attempts, capped at ``AUDIT_BODY_CAP``)."""

    number: int
    upstream_id: int | None
    upstream_model: str
    outcome: str
    upstream_status: int | None = None
    abort_reason: str = ""
    ttfb_ms: float | None = None
    duration_ms: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    bytes_received: int = 0
    frames: int = 0
    findings: Sequence[GuardFinding] = ()
    body: bytes = b""
    #: Parts of ``prompt_tokens`` read from / written to the upstream's prompt cache; part of
    #: ``completion_tokens`` spent reasoning (``proxy.guard.checks.usage``).
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    #: The upstream sent no (usable) usage: the counts are estimates.
    usage_estimated: bool = False
    #: USD this attempt cost at the price in force (``billing``); None: no price for its model (unpriced).
    cost_usd: float | None = None


@dataclass(slots=True)
class RequestResult:
    """How a request ended. Times in milliseconds; tokens summed over every attempt."""

    outcome: str
    status: int | None
    attempts: int
    ttft_ms: float | None = None
    total_ms: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wasted_completion_tokens: int = 0
    wasted_ms: float = 0.0
    error: str = ""
    #: What the client received at the end (``audit.delivered`` shapes); None when not recorded.
    delivered: dict[str, Any] | None = None
    #: Request-level findings decided at the end (the loop breaker's ``agent-loop``).
    findings: Sequence[GuardFinding] = ()
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    #: Some attempt's usage was estimated.
    usage_estimated: bool = False
    #: USD of the attempt the client got (``delivered_usd``) and of the attempts thrown away as broken, cut
    #: or refused (``wasted_usd``); ``unpriced``: some attempt with tokens had no price (its cost not counted).
    delivered_usd: float = 0.0
    wasted_usd: float = 0.0
    unpriced: bool = False


def _journal_append(record: dict[str, Any]) -> None:
    from audit.journal_writer import journal

    journal().append(record)


def _request_json(record: RequestRecord) -> dict[str, Any]:
    return {
        "tenant_id": record.tenant_id, "api_key_id": record.api_key_id, "route_id": record.route_id,
        "upstream_id": record.upstream_id, "client_protocol": record.client_protocol,
        "client_user_agent": record.client_user_agent[:200], "model": record.model[:200],
        "upstream_model": record.upstream_model[:200], "path": record.path,
        "created": record.created.timestamp(), "fragments": record.fragments.value,
        "member_id": record.member_id, "member_username": record.member_username[:150],
    }


def _finding_json(f: GuardFinding, keep_frames: bool) -> dict[str, Any]:
    return {"kind": f.kind.value, "severity": f.severity.value, "action": f.action.value, "choice": f.choice,
            "slot": f.slot, "frame": f.frame, "offset": f.offset, "fragment": f.fragment if keep_frames else "",
            "detail": f.detail, "tool": f.tool}


def request_started(*, request: RequestRecord) -> None:
    """Journal that ``request`` started (a request with a start and no end becomes ``interrupted``)."""
    record: dict[str, Any] = {"t": "start", "id": str(request.id), "req": _request_json(request)}
    if request.findings:
        record["findings"] = [_finding_json(f, False) for f in request.findings]
    _journal_append(record)


def attempt_finished(*, request: RequestRecord, attempt: AttemptRecord) -> None:
    """Journal one finished upstream attempt with its findings and, per policy, its raw body."""
    keep_frames = request.fragments != FragmentStorage.NONE
    a = attempt
    record: dict[str, Any] = {
        "t": "attempt", "id": str(request.id), "tenant_id": request.tenant_id, "number": a.number,
        "upstream_id": a.upstream_id, "upstream_model": a.upstream_model[:200], "outcome": a.outcome,
        "upstream_status": a.upstream_status, "abort_reason": a.abort_reason, "ttfb_ms": a.ttfb_ms,
        "duration_ms": a.duration_ms, "prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens,
        "bytes_received": a.bytes_received, "frames": a.frames, "created": timezone.now().timestamp(),
        "findings": [_finding_json(f, keep_frames) for f in a.findings],
        "cache_read_tokens": a.cache_read_tokens, "cache_write_tokens": a.cache_write_tokens,
        "reasoning_tokens": a.reasoning_tokens, "usage_estimated": a.usage_estimated, "cost_usd": a.cost_usd,
    }
    if request.fragments == FragmentStorage.ATTEMPT and a.body:
        cap = settings.AUDIT_BODY_CAP
        record["body"] = base64.b64encode(a.body[:cap]).decode("ascii")
        record["truncated"] = len(a.body) > cap
    _journal_append(record)


def limit_learned(*, fact: Any) -> None:
    """Journal a fact the upstream client learned (a ``tenants.learned.LearnedFact``)."""
    _journal_append({"t": "learned", "fact": {"upstream_id": fact.upstream_id, "model": fact.model[:200],
                                              "parameter": fact.parameter[:100], "limit": fact.limit,
                                              "learned_at": fact.learned_at, "expires_at": fact.expires_at,
                                              "detail": fact.detail[:1000]}})


def routing_changed(*, event: str, severity: str, tenant_id: int | None, upstream_id: int, title: str,
                    detail: str = "") -> None:
    """Journal a routing state change (``proxy.routing.router``: ``circuit-open``, ``circuit-closed``,
    ``key-disabled``); ``audit.incidents`` makes it an incident."""
    _journal_append({"t": "routing", "id": f"routing-{upstream_id}", "tenant_id": tenant_id, "event": event,
                     "severity": severity, "upstream_id": upstream_id, "title": title[:200], "detail": detail[:300],
                     "created": timezone.now().timestamp()})


def request_finished(*, request: RequestRecord, result: RequestResult) -> None:
    """Journal how ``request`` ended (self-contained: the row can be created from this record alone)."""
    r = result
    record: dict[str, Any] = {"t": "finish", "id": str(request.id), "req": _request_json(request), "res": {
        "outcome": r.outcome, "status": r.status, "attempts": r.attempts, "ttft_ms": r.ttft_ms,
        "total_ms": r.total_ms, "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
        "wasted_completion_tokens": r.wasted_completion_tokens, "wasted_ms": r.wasted_ms,
        "error": r.error[:2000], "delivered": r.delivered, "cache_read_tokens": r.cache_read_tokens,
        "cache_write_tokens": r.cache_write_tokens, "reasoning_tokens": r.reasoning_tokens,
        "usage_estimated": r.usage_estimated, "delivered_usd": r.delivered_usd, "wasted_usd": r.wasted_usd,
        "unpriced": r.unpriced, "finished": timezone.now().timestamp()}}
    if r.findings:
        record["findings"] = [_finding_json(f, False) for f in r.findings]
    _journal_append(record)
