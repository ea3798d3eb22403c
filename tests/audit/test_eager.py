"""Without a broker (the default), report tasks run eagerly in a background thread, off the caller's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import audit.tasks
from audit.models import Report
from audit.tasks import report_request
from tests.audit.conftest import PERIOD, AuditRows, wait_for_report
from tests.audit.expected import expected_report_figures, without_generated_at


@pytest.mark.usefixtures("transactional_db")
def test_it_builds_a_report_in_a_background_thread_without_a_broker(
        audit_rows: AuditRows, monkeypatch: pytest.MonkeyPatch, eager_threads: Callable[[], None]) -> None:
    """``delay_on_commit`` in eager mode returns at once; another thread builds the report."""
    threads: list[str] = []
    real_build = audit.tasks.report_build

    def build(**kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real_build(**kwargs)

    monkeypatch.setattr(audit.tasks, "report_build", build)
    report = report_request(since=PERIOD[0], until=PERIOD[1], format="html", tenants=[audit_rows.upstream_a.tenant])
    report, _ = wait_for_report(report.pk)
    eager_threads()
    assert report.status == "done", report.error
    assert threads == ["eager audit.tasks.report_build_task"]
    assert threading.current_thread().name not in threads
    assert without_generated_at(report.figures) == expected_report_figures(audit_rows)
    with report.file.open("rb") as stored:
        assert stored.read().count(b"<svg") == 11


@pytest.mark.usefixtures("transactional_db")
def test_it_schedules_a_tenant_report_over_the_last_whole_days(
        audit_rows: AuditRows, eager_threads: Callable[[], None]) -> None:
    """``report_schedule_task(slug, days, format)`` makes a report of that tenant ending at today's midnight."""
    report_id = audit.tasks.report_schedule_task.apply(args=("tenant-a", 3, "json")).get()
    report, _ = wait_for_report(report_id)
    eager_threads()
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert (report.since, report.until) == (midnight - timedelta(days=3), midnight)
    assert [t.slug for t in report.tenants.all()] == ["tenant-a"]
    assert report.origin == Report.Origin.SCHEDULE and report.status == "done"


@pytest.mark.usefixtures("transactional_db")
def test_it_records_the_error_of_a_report_that_fails_in_eager_mode(
        audit_rows: AuditRows, eager_threads: Callable[[], None]) -> None:
    """In eager mode too, the task's on_failure marks the report failed with the error."""
    report = report_request(since=PERIOD[0], until=PERIOD[1], format="json", enqueue=False)
    Report.objects.filter(pk=report.pk).update(format="xlsx")
    audit.tasks.report_build_task.delay_on_commit(report.pk)
    report, _ = wait_for_report(report.pk)
    eager_threads()
    assert report.status == "failed" and "unknown report format 'xlsx'" in report.error
