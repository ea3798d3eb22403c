"""Writes around reports and retention (STYLE.md rule 7): build, fail, delete, purge.

``audit.tasks`` calls these by id (and requests reports: ``report_request`` creates one and queues its
build); the admin and the management commands call them directly.
Status and progress are written with ``update()`` outside long transactions, so the admin sees a
running report move. The slow part (queries, files) runs outside any transaction.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.files import File
from django.utils import timezone

from audit import exports
from audit.models import Finding, Fragment, Report
from audit.people import MEMBER_COLUMNS, member_rows
from audit.reports import Figures, Scope, build_figures
from tenants.models import Tenant

logger = logging.getLogger(__name__)

#: Share of the progress bar given to the figures; the export gets the rest.
FIGURES_SHARE = 60
#: Rows purged per statement, so a large purge never holds one huge transaction.
PURGE_BATCH = 5000
ERROR_CAP = 4000


def scope_of(report: Report) -> Scope:
    """The report's period, tenants and upstreams as a ``Scope`` (empty sets = all)."""
    tenant_ids = tuple(sorted(report.tenants.values_list("pk", flat=True))) or None
    upstream_ids = tuple(sorted(report.upstreams.values_list("pk", flat=True))) or None
    return Scope(report.since, report.until, tenant_ids, upstream_ids)


def report_progress(*, report_id: int, percent: int) -> None:
    """Record ``percent`` (0..100) of a running report."""
    Report.objects.filter(pk=report_id).update(progress=max(0, min(100, percent)))


def report_build(*, report_id: int) -> Report:
    """Build report ``report_id``: running -> figures -> export file(s) -> done.

    Raises on failure; the caller (the task's ``on_failure``) records the error with ``report_fail``.
    Building again replaces the previous files.
    """
    report = Report.objects.get(pk=report_id)
    now = timezone.now()
    Report.objects.filter(pk=report_id).update(status=Report.Status.RUNNING, progress=0, started=now, error="",
                                               finished=None)
    scope = scope_of(report)
    figures = build_figures(scope, progress=lambda p: report_progress(
        report_id=report_id, percent=p * FIGURES_SHARE // 100))
    figures["by_member"] = [{c: row[c] for c in ("member_id", *MEMBER_COLUMNS)} for row in member_rows(scope)]
    _replace_files(report, figures)
    report.figures = figures
    report.status, report.progress, report.finished = Report.Status.DONE, 100, timezone.now()
    report.save(update_fields=["figures", "file", "findings_file", "status", "progress", "finished"])
    return report


def _replace_files(report: Report, figures: Figures) -> None:
    """Write the export(s) of ``report`` to storage (not saved on the row yet), dropping old files."""
    _delete_files(report)
    scope = scope_of(report)
    stem = f"report-{report.pk}"
    if report.format == Report.Format.CSV:
        _store(report, "file", f"{stem}-requests.csv", lambda out: exports.write_requests_csv(scope, out))
        report_progress(report_id=report.pk, percent=80)
        _store(report, "findings_file", f"{stem}-findings.csv", lambda out: exports.write_findings_csv(scope, out))
    elif report.format == Report.Format.JSON:
        _store(report, "file", f"{stem}.json", lambda out: out.write(exports.summary_json(figures)))
    elif report.format == Report.Format.HTML:
        title = f"toolrelay report #{report.pk}"
        _store(report, "file", f"{stem}.html", lambda out: out.write(exports.report_html(figures, title=title)))
    else:
        raise ValueError(f"unknown report format {report.format!r}")
    report_progress(report_id=report.pk, percent=95)


def _store(report: Report, field: str, name: str, write: Any) -> None:
    """Spool ``write(text_file)`` to a temporary file, then save it into ``report.<field>``."""
    with tempfile.TemporaryFile("w+", encoding="utf-8", newline="") as out:
        write(out)
        out.seek(0)
        getattr(report, field).save(name, File(out, name=name), save=False)


def _delete_files(report: Report) -> None:
    for field in (report.file, report.findings_file):
        if field:
            field.delete(save=False)


def report_fail(*, report_id: int, error: str) -> None:
    """Mark report ``report_id`` failed with ``error`` (capped)."""
    Report.objects.filter(pk=report_id).update(status=Report.Status.FAILED, error=error[:ERROR_CAP],
                                               finished=timezone.now())


def report_delete(*, report: Report) -> None:
    """Delete ``report`` and its files."""
    _delete_files(report)
    report.delete()


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """What one retention run removed: Fragment rows deleted, findings whose fragment text was cleared."""

    fragments: int = 0
    finding_fragments: int = 0


def retention_purge(*, now: datetime | None = None) -> PurgeResult:
    """Delete the raw fragments of each tenant older than its retention days (policy, default 30).

    Removes Fragment rows and clears ``Finding.fragment``; requests, attempts, findings (kind,
    action, detail, offsets) and every count stay, so reports over old periods are unchanged.
    """
    now = now or timezone.now()
    fragments = finding_fragments = 0
    for tenant in Tenant.objects.all():
        cutoff = now - timedelta(days=tenant.policy().retention_days)
        fragments += _purge_fragments(tenant.pk, cutoff)
        finding_fragments += _purge_finding_fragments(tenant.pk, cutoff)
    logger.info("retention purge: %d fragments deleted, %d finding fragments cleared", fragments,
                finding_fragments)
    return PurgeResult(fragments, finding_fragments)


def _purge_fragments(tenant_id: int, cutoff: datetime) -> int:
    total = 0
    while ids := list(Fragment.objects.filter(tenant_id_copy=tenant_id, created__lt=cutoff)
                      .order_by().values_list("pk", flat=True)[:PURGE_BATCH]):
        total += Fragment.objects.filter(pk__in=ids).delete()[0]
    return total


def _purge_finding_fragments(tenant_id: int, cutoff: datetime) -> int:
    total = 0
    while ids := list(Finding.objects.filter(tenant_id_copy=tenant_id, created__lt=cutoff).exclude(fragment="")
                      .order_by().values_list("pk", flat=True)[:PURGE_BATCH]):
        total += Finding.objects.filter(pk__in=ids).update(fragment="")
    return total
