"""``audit.services``: journal records in, rows out; idempotent batches; any upstream bytes stored.

The batch writer is what the journal writer thread calls; here it is called directly on records built
by the same functions the relay uses, read back from a real journal file.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest

from audit import records, services
from audit.journal import Journal, read_lines
from audit.models import Attempt, Finding, Fragment, ProxyRequest
from proxy.guard.findings import Action, FindingKind, Severity
from proxy.guard.findings import Finding as GuardFinding
from proxy.guard.policy import FragmentStorage
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

_COMPARED = ("tenant_id", "api_key_id", "upstream_id", "model", "path", "outcome", "status", "attempts", "ttft_ms",
             "total_ms", "prompt_tokens", "completion_tokens", "wasted_completion_tokens", "wasted_ms", "error")


def _records(world: TenantWorld, **request: Any) -> tuple[records.RequestRecord, records.RequestResult,
                                                          records.AttemptRecord]:
    record = records.RequestRecord(id=uuid.uuid4(), tenant_id=world.tenant.pk, api_key_id=world.api_key.pk,
                                    model="m", path="pass-through", upstream_id=world.upstream.pk, **request)
    result = records.RequestResult(outcome="clean", status=200, attempts=1, ttft_ms=3.5, total_ms=40.0,
                                    prompt_tokens=7, completion_tokens=11, error="")
    attempt = records.AttemptRecord(number=0, upstream_id=world.upstream.pk, upstream_model="m", outcome="clean",
                                     upstream_status=200, completion_tokens=11)
    return record, result, attempt


class Captured:
    """The records the services would journal, captured through a real journal file."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.journal = Journal(tmp, max_bytes=1 << 30)
        monkeypatch.setattr(records, "_journal_append", self.journal.append)

    def read(self) -> services.Batch:
        return services.Batch.of(line.record for line in read_lines(self.journal.path, 0))


@pytest.fixture
def captured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Captured:
    return Captured(tmp_path, monkeypatch)


def _row(request_id: uuid.UUID) -> dict[str, Any]:
    row = ProxyRequest.objects.get(id=request_id)
    assert row.finished is not None
    return {name: getattr(row, name) for name in _COMPARED}


def test_it_writes_a_request_the_same_in_one_batch_or_across_batches(world_a: TenantWorld, captured: Captured,
                                                                     django_assert_num_queries: Any) -> None:
    """Start, attempt and finish in one batch insert the finished row at once; the same records spread over
    three batches (a pending row, then its attempt, then the update) end in the same row."""
    for _ in range(2):
        record, result, attempt = _records(world_a)
        records.request_started(request=record)
        records.attempt_finished(request=record, attempt=attempt)
        records.request_finished(request=record, result=result)
    lines = [line.record for line in read_lines(captured.journal.path, 0)]
    one, spread = lines[0]["id"], lines[3]["id"]
    with django_assert_num_queries(5):  # SAVEPOINT, SELECT requests, INSERT, INSERT attempt, RELEASE (a new
        # request has no attempt row to look for)
        services.journal_batch_write(services.Batch.of(lines[:3]))
    services.journal_batch_write(services.Batch.of(lines[3:4]))
    assert ProxyRequest.objects.get(id=spread).outcome == "pending"
    services.journal_batch_write(services.Batch.of(lines[4:5]))
    services.journal_batch_write(services.Batch.of(lines[5:6]))
    assert _row(uuid.UUID(one)) == _row(uuid.UUID(spread))
    assert Attempt.objects.filter(request_id=spread).count() == 1


def test_it_never_duplicates_a_row_when_a_batch_is_replayed(world_a: TenantWorld, captured: Captured) -> None:
    """A batch written twice (the writer died between the commit and saving its offset) adds nothing."""
    record, result, attempt = _records(world_a, fragments=FragmentStorage.ATTEMPT)
    finding = GuardFinding(FindingKind.ARGUMENTS_NOT_JSON, Severity.ERROR, Action.RETRY, "broken", 0, 0, 3, 120,
                           "data: {", tool="get_weather")
    records.request_started(request=record)
    records.attempt_finished(request=record, attempt=records.AttemptRecord(
        number=0, upstream_id=world_a.upstream.pk, upstream_model="m", outcome="retry", findings=[finding],
        body=b"data: {\n\n"))
    records.attempt_finished(request=record, attempt=records.AttemptRecord(
        number=1, upstream_id=world_a.upstream.pk, upstream_model="m", outcome="clean"))
    records.request_finished(request=record, result=result)
    batch = captured.read()
    for _ in range(2):
        services.journal_batch_write(batch)
    assert ProxyRequest.objects.filter(id=record.id).count() == 1
    assert Attempt.objects.filter(request_id=record.id).count() == 2
    saved = Finding.objects.get(request_id=record.id)
    assert (saved.kind, saved.tool_name, saved.frame, saved.byte_offset) == ("arguments-not-json", "get_weather",
                                                                              3, 120)
    assert Fragment.objects.get(attempt__request_id=record.id).body == "data: {\n\n"


def test_it_stores_any_bytes_the_upstream_sent(world_a: TenantWorld, captured: Captured) -> None:
    """NUL bytes and undecodable bytes in texts, fragments and bodies are stored escaped; the row is never lost."""
    record, result, _ = _records(world_a, fragments=FragmentStorage.ATTEMPT)
    nasty = "a\x00b\udc80c"
    finding = GuardFinding(FindingKind.UNPARSEABLE_DATA_FRAME, Severity.ERROR, Action.RETRY, nasty, fragment=nasty)
    records.request_started(request=record)
    records.attempt_finished(request=record, attempt=records.AttemptRecord(
        number=0, upstream_id=world_a.upstream.pk, upstream_model="m", outcome="retry", abort_reason=nasty,
        findings=[finding], body=b"x\x00y\xff"))
    records.request_finished(request=record, result=records.RequestResult(
        outcome="exhausted", status=200, attempts=1, error=nasty))
    services.journal_batch_write(captured.read())
    row = ProxyRequest.objects.get(id=record.id)
    assert row.error == "a\\x00b\\udc80c"
    assert Finding.objects.get(request_id=record.id).fragment == "a\\x00b\\udc80c"
    assert Fragment.objects.get(attempt__request_id=record.id).body == "x\\x00y\\xff"


def test_it_marks_requests_that_never_ended_interrupted(world_a: TenantWorld) -> None:
    """A start without an end (its process died) becomes ``interrupted``; a finished request is left alone."""
    open_, _, _ = _records(world_a)
    done, result, _ = _records(world_a)
    services.journal_batch_write(services.Batch.of([
        {"t": "start", "id": str(open_.id), "req": records._request_json(open_)},
        {"t": "finish", "id": str(done.id), "req": records._request_json(done), "res": {"outcome": "clean",
                                                                                      "status": 200}},
    ]))
    assert services.requests_interrupt(ids=[str(open_.id), str(done.id)]) == 1
    assert ProxyRequest.objects.get(id=open_.id).outcome == "interrupted"
    assert ProxyRequest.objects.get(id=done.id).outcome == "clean"


def test_it_writes_the_findings_decided_at_a_requests_end_once(world_a: TenantWorld, captured: Captured) -> None:
    """The loop breaker's ``agent-loop`` finding rides on the finish record: written with a new row, or on the
    pending row of an earlier batch, and never again when the batch is replayed."""
    loop = GuardFinding(FindingKind.AGENT_LOOP, Severity.WARNING, Action.IGNORED, "repeat: read_file 4th time")
    for _ in range(2):
        record, result, attempt = _records(world_a)
        records.request_started(request=record)
        records.request_finished(request=record, result=dataclasses.replace(result, findings=(loop,)))
    lines = [line.record for line in read_lines(captured.journal.path, 0)]
    together, spread = lines[0]["id"], lines[2]["id"]
    services.journal_batch_write(services.Batch.of(lines[:2]))
    services.journal_batch_write(services.Batch.of(lines[2:3]))
    for _ in range(2):  # the finish, then its replay
        services.journal_batch_write(services.Batch.of(lines[3:4]))
    for rid in (together, spread):
        found = Finding.objects.filter(request_id=rid)
        assert [(f.kind, f.detail, f.attempt_id) for f in found] == [("agent-loop", "repeat: read_file 4th time",
                                                                       None)]
