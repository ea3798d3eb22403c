"""Append-only audit writes (STYLE.md rule 8), called from async code through ``sync_to_async``.

The relay builds plain records in memory on the byte path and hands them here afterwards: a
corrupted attempt is written (awaited) before its retry starts, everything else is written in a
background task after the response ended. Nothing here ever sees request headers or credentials.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.models import Attempt, Finding, Fragment, ProxyRequest
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


def _request_fields(record: RequestRecord) -> dict[str, object]:
    return {
        "tenant_id": record.tenant_id, "api_key_id": record.api_key_id, "route_id": record.route_id,
        "upstream_id": record.upstream_id, "client_protocol": record.client_protocol,
        "client_user_agent": record.client_user_agent[:200], "model": record.model[:200],
        "upstream_model": record.upstream_model[:200], "path": record.path, "created": record.created,
    }


def _result_fields(result: RequestResult) -> dict[str, object]:
    return {
        "outcome": result.outcome, "status": result.status, "attempts": result.attempts, "ttft_ms": result.ttft_ms,
        "total_ms": result.total_ms, "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens, "wasted_completion_tokens": result.wasted_completion_tokens,
        "wasted_ms": result.wasted_ms, "error": result.error[:2000], "finished": timezone.now(),
    }


def _ensure_request(record: RequestRecord) -> None:
    ProxyRequest.objects.get_or_create(id=record.id, defaults=_request_fields(record))


def _write_attempt(record: RequestRecord, attempt: AttemptRecord) -> None:
    row = Attempt.objects.create(
        request_id=record.id, number=attempt.number, upstream_id=attempt.upstream_id,
        upstream_model=attempt.upstream_model[:200], upstream_status=attempt.upstream_status,
        outcome=attempt.outcome, abort_reason=attempt.abort_reason, ttfb_ms=attempt.ttfb_ms,
        duration_ms=attempt.duration_ms, prompt_tokens=attempt.prompt_tokens,
        completion_tokens=attempt.completion_tokens, bytes_received=attempt.bytes_received, frames=attempt.frames,
    )
    keep_frames = record.fragments != FragmentStorage.NONE
    Finding.objects.bulk_create([
        Finding(request_id=record.id, attempt=row, tenant_id_copy=record.tenant_id, kind=f.kind.value,
                severity=f.severity.value, action=f.action.value, choice=f.choice, slot=f.slot, frame=f.frame,
                byte_offset=f.offset, fragment=f.fragment if keep_frames else "", detail=f.detail,
                tool_name=f.tool[:200])
        for f in attempt.findings
    ])
    if record.fragments == FragmentStorage.ATTEMPT and attempt.body:
        cap = settings.AUDIT_BODY_CAP
        Fragment.objects.create(attempt=row, tenant_id_copy=record.tenant_id,
                                body=attempt.body[:cap].decode("utf-8", "replace"), truncated=len(attempt.body) > cap)


def attempt_record(*, request: RequestRecord, attempt: AttemptRecord) -> None:
    """Write one attempt with its findings (and raw body per policy), creating the request row if needed."""
    with transaction.atomic():
        _ensure_request(request)
        _write_attempt(request, attempt)


def request_finish(*, request: RequestRecord, result: RequestResult, attempts: Sequence[AttemptRecord] = (),
                   exists: bool = True) -> None:
    """Write the not-yet-written ``attempts`` and the request's final state, in one transaction.

    ``exists=False`` says nothing of this request was written yet (no attempt recorded before a retry,
    the usual case): the finished row is then inserted at once, without the get-or-create and the
    update (SELECT, SAVEPOINT, RELEASE and UPDATE fewer per request; docs/benchmarks.md).
    """
    with transaction.atomic():
        if not exists:
            ProxyRequest.objects.create(id=request.id, **_request_fields(request), **_result_fields(result))
        else:
            _ensure_request(request)
        for attempt in attempts:
            _write_attempt(request, attempt)
        if exists:
            ProxyRequest.objects.filter(id=request.id).update(**_result_fields(result))
