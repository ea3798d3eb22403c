"""``audit.tasks`` on a real Celery worker (Redis broker, the test database shared through commits)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from audit.models import Report
from audit.schema import SUMMARY_SCHEMA
from audit.tasks import report_enqueue, report_request
from tests.audit.conftest import PERIOD, AuditRows, Worker, wait_for_report
from tests.audit.expected import expected_report_figures, without_generated_at

ORDER = {"queued": 0, "running": 1, "done": 2, "failed": 2}


@pytest.mark.usefixtures("transactional_db")
def test_it_builds_a_report_on_a_real_worker_with_the_hand_computed_figures(
        audit_rows: AuditRows, on_worker: Worker) -> None:
    """The worker builds the JSON report; its figures and file equal the hand-computed figures."""
    report = report_request(since=PERIOD[0], until=PERIOD[1], format="json",
                            tenants=[audit_rows.upstream_a.tenant])
    assert (report.status, report.progress) == ("queued", 0)
    report, seen = wait_for_report(report.pk)
    assert report.status == "done", report.error
    assert report.progress == 100 and report.started <= report.finished
    assert without_generated_at(report.figures) == expected_report_figures(audit_rows)
    with report.file.open("rb") as stored:
        summary = json.loads(stored.read())
    jsonschema.validate(summary, SUMMARY_SCHEMA)
    assert summary == report.figures
    _assert_moves_forward(seen)


def _assert_moves_forward(seen: list[tuple[str, int]]) -> None:
    """Statuses only move queued -> running -> done, and progress never goes back while running."""
    ranks = [ORDER[status] for status, _ in seen]
    assert ranks == sorted(ranks), seen
    running = [progress for status, progress in seen if status == "running"]
    assert running == sorted(running), seen
    assert seen[-1] == ("done", 100)


@pytest.mark.usefixtures("transactional_db")
def test_it_shows_the_error_of_a_report_that_fails_on_the_worker(audit_rows: AuditRows, on_worker: Worker) -> None:
    """A report the worker cannot build ends failed, with the error recorded by the task's on_failure."""
    report = report_request(since=PERIOD[0], until=PERIOD[1], format="json", enqueue=False)
    Report.objects.filter(pk=report.pk).update(format="pdf")  # no exporter for it
    report_enqueue(report=report)
    report, _ = wait_for_report(report.pk)
    assert report.status == "failed"
    assert "unknown report format 'pdf'" in report.error
    assert report.finished is not None and not report.file


@pytest.mark.usefixtures("transactional_db")
def test_it_builds_csv_files_of_requests_and_findings_on_the_worker(audit_rows: AuditRows, on_worker: Worker
                                                                     ) -> None:
    """A CSV report stores two files: one line per request, one per finding (plus headers)."""
    report = report_request(since=PERIOD[0], until=PERIOD[1], format="csv", tenants=[audit_rows.upstream_a.tenant])
    report, _ = wait_for_report(report.pk)
    assert report.status == "done", report.error
    assert _lines(report.file) == 1 + 7
    assert _lines(report.findings_file) == 1 + 9


def _lines(field: Any) -> int:
    with field.open("rb") as stored:
        return len(stored.read().decode().splitlines())
