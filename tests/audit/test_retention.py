"""Retention: raw fragments past each tenant's retention days go; everything else stays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from audit.models import Attempt, Finding, Fragment, ProxyRequest
from audit.report_services import retention_purge
from audit.tasks import retention_purge_task
from tests.audit.conftest import add_request

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _request_with_fragments(world: Any, name: str, age: timedelta, *, fragment: str = "data: {}",
                            now: datetime = NOW) -> Any:
    """A request of ``world``'s tenant ``age`` before ``now``, with one finding and one stored attempt body."""
    at = now - age
    request = add_request(world.tenant, world.upstream, name, at=at, model="m", outcome="recovered-by-retry",
                          findings=[(0, "arguments-not-json", "error", "retry", "read_file")])
    finding = Finding.objects.get(request=request)
    Finding.objects.filter(pk=finding.pk).update(created=at, fragment=fragment)
    body = Fragment.objects.create(attempt=Attempt.objects.get(request=request), tenant_id_copy=world.tenant.pk,
                                   body=f"data: {name}\n\n", created=at)
    return request, finding, body


def _snapshot() -> dict[str, Any]:
    """What must never change: rows, counts, kinds, details and offsets of every finding."""
    return {
        "requests": list(ProxyRequest.objects.order_by("id").values_list("id", "outcome", "attempts")),
        "attempts": Attempt.objects.count(),
        "findings": list(Finding.objects.order_by("id").values_list("id", "kind", "action", "detail", "frame",
                                                                     "byte_offset", "tool_name")),
    }


def test_it_purges_exactly_the_raw_fragments_past_each_tenants_retention(world_a: Any, world_b: Any) -> None:
    """A keeps 7 days (policy), B the default 30: only A's 9-day-old and B's 45-day-old fragments go."""
    world_a.tenant.retention_days = 7
    world_a.tenant.save(update_fields=["retention_days"])
    a_old = _request_with_fragments(world_a, "a-old", timedelta(days=9))
    a_edge = _request_with_fragments(world_a, "a-edge", timedelta(days=7))  # exactly at the cutoff: kept
    a_new = _request_with_fragments(world_a, "a-new", timedelta(days=4))
    b_mid = _request_with_fragments(world_b, "b-mid", timedelta(days=9))
    b_old = _request_with_fragments(world_b, "b-old", timedelta(days=45))
    a_blank = _request_with_fragments(world_a, "a-blank", timedelta(days=20), fragment="")
    before = _snapshot()

    result = retention_purge(now=NOW)

    purged = {a_old, b_old, a_blank}
    assert set(Fragment.objects.values_list("pk", flat=True)) == {r[2].pk for r in (a_edge, a_new, b_mid)}
    kept_text = {pk for pk, text in Finding.objects.values_list("pk", "fragment") if text}
    assert kept_text == {r[1].pk for r in (a_edge, a_new, b_mid)}
    assert (result.fragments, result.finding_fragments) == (len(purged), 2)
    assert _snapshot() == before


def test_it_purges_from_the_celery_task_and_is_idempotent(world_a: Any, world_b: Any) -> None:
    """The beat task purges what is due; a second run finds nothing more."""
    _request_with_fragments(world_b, "b-ancient", timedelta(days=400), now=datetime.now(UTC))
    _request_with_fragments(world_b, "b-fresh", timedelta(days=1), now=datetime.now(UTC))
    first = retention_purge_task.apply().get()
    second = retention_purge_task.apply().get()
    assert first == {"fragments": 1, "finding_fragments": 1}
    assert second == {"fragments": 0, "finding_fragments": 0}
