"""Management commands: ``audit_report``, ``setup_schedules``, ``audit_retention``."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django_celery_beat.models import PeriodicTask

from audit.exports import FINDING_COLUMNS, REQUEST_COLUMNS
from audit.models import Report
from config.celery import app
from tests.audit.conftest import AuditRows
from tests.audit.expected import expected_report_figures, without_generated_at

PERIOD_ARGS = ["--since", "2026-01-01", "--until", "2026-01-04"]


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_it_writes_a_json_report_to_the_output_path(audit_rows: AuditRows, tmp_path: Path) -> None:
    """``--format json --output`` writes the hand-computed summary there and prints the path."""
    target = tmp_path / "out" / "summary.json"
    printed = _run("audit_report", *PERIOD_ARGS, "--tenant", "tenant-a", "--format", "json", "--output", str(target))
    assert printed.strip() == str(target)
    assert without_generated_at(json.loads(target.read_text())) == expected_report_figures(audit_rows)
    assert Report.objects.get().origin == Report.Origin.COMMAND


def test_it_writes_requests_and_findings_csv_next_to_each_other(audit_rows: AuditRows, tmp_path: Path) -> None:
    """CSV gives two files: the requests at --output, the findings beside it as <name>-findings.csv."""
    target = tmp_path / "period.csv"
    printed = _run("audit_report", *PERIOD_ARGS, "--tenant", "tenant-a", "--format", "csv", "--output", str(target))
    findings = tmp_path / "period-findings.csv"
    assert printed.split() == [str(target), str(findings)]
    assert _header(target) == list(REQUEST_COLUMNS)
    assert _header(findings) == list(FINDING_COLUMNS)


def _header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f))


def test_it_prints_where_the_stored_file_is_without_output(audit_rows: AuditRows) -> None:
    """Without --output the command prints the stored file's path."""
    printed = _run("audit_report", *PERIOD_ARGS, "--format", "html").strip()
    assert Path(printed).is_file() and Path(printed).read_text().count("<svg") == 11


def test_it_refuses_unknown_tenants_and_empty_periods(audit_rows: AuditRows) -> None:
    """Unknown tenants and since >= until are command errors; no report row is made."""
    with pytest.raises(CommandError, match="no tenant named 'nope'"):
        _run("audit_report", *PERIOD_ARGS, "--tenant", "nope", "--format", "json")
    with pytest.raises(CommandError, match="--since must be before --until"):
        _run("audit_report", "--since", "2026-01-04", "--until", "2026-01-01", "--format", "json")
    assert not Report.objects.exists()


def test_it_queues_instead_of_building_with_enqueue(audit_rows: AuditRows,
                                                    django_capture_on_commit_callbacks: Any) -> None:
    """``--enqueue`` leaves the report queued for the worker."""
    with django_capture_on_commit_callbacks() as callbacks:
        printed = _run("audit_report", *PERIOD_ARGS, "--format", "json", "--enqueue")
    report = Report.objects.get()
    assert f"report #{report.pk} queued" in printed
    assert report.status == "queued" and len(callbacks) == 1


def test_it_registers_the_schedules_idempotently(world_a: Any) -> None:
    """The purge (and a tenant report) become editable PeriodicTasks for tasks Celery knows."""
    import audit.tasks  # noqa: F401 - registers the tasks with the app

    for _ in range(2):
        _run("setup_schedules", "--report-tenant", "tenant-a", "--report-days", "7", "--report-format", "csv")
    purge = PeriodicTask.objects.get(name="audit: retention purge")
    report = PeriodicTask.objects.get(task="audit.tasks.report_schedule_task")
    assert PeriodicTask.objects.filter(name__startswith="audit:").count() == 2
    assert purge.task in app.tasks and report.task in app.tasks
    assert json.loads(report.args) == ["tenant-a", 7, "csv"]
    assert (report.crontab.minute, report.crontab.hour, report.crontab.day_of_week) == ("0", "6", "1")


def test_it_keeps_schedules_edited_in_the_admin_unless_asked_to_replace(world_a: Any) -> None:
    """A second run leaves an edited schedule alone; ``--replace`` resets it."""
    _run("setup_schedules")
    _run("setup_schedules", "--retention-cron", "0 1 * * *")
    assert PeriodicTask.objects.get(name="audit: retention purge").crontab.hour == "3"
    assert "(kept as it was)" in _run("setup_schedules", "--retention-cron", "0 1 * * *")
    _run("setup_schedules", "--retention-cron", "0 1 * * *", "--replace")
    assert PeriodicTask.objects.get(name="audit: retention purge").crontab.hour == "1"


def test_it_purges_from_the_command(world_a: Any) -> None:
    """``audit_retention`` runs the purge and says what it removed."""
    assert "deleted 0 attempt bodies, cleared 0 finding fragments" in _run("audit_retention")
