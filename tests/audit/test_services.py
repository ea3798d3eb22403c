"""``audit.services``: the request row ends the same whether it is inserted finished or created then updated."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from audit import services
from audit.models import Attempt, ProxyRequest
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

_COMPARED = ("tenant_id", "api_key_id", "upstream_id", "model", "path", "outcome", "status", "attempts", "ttft_ms",
             "total_ms", "prompt_tokens", "completion_tokens", "wasted_completion_tokens", "wasted_ms", "error")


def _records(world: TenantWorld) -> tuple[services.RequestRecord, services.RequestResult, services.AttemptRecord]:
    request = services.RequestRecord(id=uuid.uuid4(), tenant_id=world.tenant.pk, api_key_id=world.api_key.pk,
                                     model="m", path="pass-through", upstream_id=world.upstream.pk)
    result = services.RequestResult(outcome="clean", status=200, attempts=1, ttft_ms=3.5, total_ms=40.0,
                                    prompt_tokens=7, completion_tokens=11, error="")
    attempt = services.AttemptRecord(number=0, upstream_id=world.upstream.pk, upstream_model="m", outcome="clean",
                                      upstream_status=200, completion_tokens=11)
    return request, result, attempt


def _row(request_id: uuid.UUID) -> dict[str, Any]:
    row = ProxyRequest.objects.get(id=request_id)
    assert row.finished is not None
    return {name: getattr(row, name) for name in _COMPARED}


def test_it_inserts_a_new_request_finished_in_three_statements(world_a: TenantWorld,
                                                                django_assert_num_queries: Any) -> None:
    """``exists=False``: one insert for the request, one per attempt, inside one transaction."""
    request, result, attempt = _records(world_a)
    with django_assert_num_queries(4):  # SAVEPOINT, INSERT request, INSERT attempt, RELEASE (test transaction)
        services.request_finish(request=request, result=result, attempts=[attempt], exists=False)
    fresh = services.RequestRecord(**{**{f: getattr(request, f) for f in request.__slots__}, "id": uuid.uuid4()})
    services.request_finish(request=fresh, result=result, attempts=[attempt])
    assert _row(request.id) == _row(fresh.id)
    assert Attempt.objects.filter(request_id=request.id).count() == 1


def test_it_updates_a_request_whose_attempt_was_written_before_a_retry(world_a: TenantWorld) -> None:
    """``exists=True`` (an attempt was recorded before the retry): the row is completed, not duplicated."""
    request, result, attempt = _records(world_a)
    services.attempt_record(request=request, attempt=attempt)
    second = services.AttemptRecord(number=1, upstream_id=world_a.upstream.pk, upstream_model="m", outcome="clean")
    services.request_finish(request=request, result=result, attempts=[second], exists=True)
    assert _row(request.id)["outcome"] == "clean"
    assert sorted(Attempt.objects.filter(request_id=request.id).values_list("number", flat=True)) == [0, 1]
