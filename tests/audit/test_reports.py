"""``audit.reports``: figures over the fixture set equal the hand-computed ones."""

from __future__ import annotations

from datetime import timedelta

from audit.reports import Scope, build_figures
from tests.audit.conftest import PERIOD, T0, AuditRows
from tests.audit.expected import expected_figures, without_generated_at


def test_it_computes_the_hand_computed_figures(audit_rows: AuditRows) -> None:
    """Every figure of tenant A's period matches the table in tests/audit/expected.py."""
    scope = Scope(*PERIOD, tenant_ids=(audit_rows.upstream_a.tenant_id,))
    assert without_generated_at(build_figures(scope)) == expected_figures(audit_rows)


def test_it_keeps_other_tenants_and_the_period_bounds_out(audit_rows: AuditRows) -> None:
    """All tenants add only B's r9; rows at T0 - 1 s and at the period's end stay out."""
    figures = build_figures(Scope(*PERIOD))
    assert figures["totals"]["requests"] == 8
    assert figures["totals"]["corrupted"] == 4
    assert figures["scope"] == {"tenants": None, "upstreams": None}
    assert {row["tool"] for row in figures["tools"]} == {"read_file", "edit_file", "bash"}


def test_it_restricts_to_the_chosen_upstreams(audit_rows: AuditRows) -> None:
    """An upstream scope keeps only that upstream's requests and findings."""
    scope = Scope(*PERIOD, upstream_ids=(audit_rows.qwen_a.pk,))
    figures = build_figures(scope)
    assert figures["totals"]["requests"] == 2
    assert figures["totals"]["findings"] == 3
    assert figures["scope"]["upstreams"] == ["tenant-a/tenant-a-qwen"]


def test_it_buckets_short_periods_by_hour(audit_rows: AuditRows) -> None:
    """A one-day period has 24 zero-filled hourly buckets."""
    figures = build_figures(Scope(T0, T0 + timedelta(days=1), tenant_ids=(audit_rows.upstream_a.tenant_id,)))
    assert figures["period"]["bucket"] == "hour"
    assert len(figures["over_time"]) == 24
    busy = {row["bucket"]: row["requests"] for row in figures["over_time"] if row["requests"]}
    assert busy == {"2026-01-01T10:00:00Z": 1, "2026-01-01T11:00:00Z": 1, "2026-01-01T12:00:00Z": 1}


def test_it_gives_zeros_for_an_empty_period(db: None) -> None:
    """No rows: counts are zero, rates 0.0, tables empty, buckets still listed."""
    figures = build_figures(Scope(*PERIOD))
    assert figures["totals"]["requests"] == 0
    assert figures["totals"]["corruption_rate"] == 0.0
    assert figures["by_kind"] == [] and figures["clients"] == []
    assert [row["requests"] for row in figures["over_time"]] == [0, 0, 0]


def test_it_reports_progress_in_increasing_steps_up_to_100(audit_rows: AuditRows) -> None:
    """The progress callback sees strictly increasing percentages ending at 100."""
    seen: list[int] = []
    build_figures(Scope(*PERIOD), progress=seen.append)
    assert seen == sorted(set(seen)) and seen[-1] == 100 and len(seen) > 5


