"""``audit_report``: build an analysis report for a period now, in this process, and say where it is."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q
from django.db.models.fields.files import FieldFile
from django.utils.dateparse import parse_date, parse_datetime

from audit.models import Report
from audit.tasks import report_build_task, report_request
from tenants.models import Tenant, Upstream


def parse_moment(value: str) -> datetime:
    """``YYYY-MM-DD`` (midnight UTC) or an ISO 8601 date-time (naive = UTC)."""
    moment = parse_datetime(value)
    if moment is None:
        day = parse_date(value)
        if day is None:
            raise CommandError(f"{value!r} is not a date (YYYY-MM-DD) or an ISO 8601 date-time")
        moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def tenants_named(names: list[str]) -> list[Tenant]:
    """Tenants by slug or name; ``CommandError`` for any unknown one."""
    found = []
    for name in names:
        tenant = Tenant.objects.filter(Q(slug=name) | Q(name=name)).order_by("pk").first()
        if tenant is None:
            raise CommandError(f"no tenant named {name!r}")
        found.append(tenant)
    return found


def upstreams_named(names: list[str], tenants: list[Tenant]) -> list[Upstream]:
    """Upstreams by name, among ``tenants``' when given; ``CommandError`` when a name matches none."""
    rows = Upstream.objects.filter(tenant__in=tenants) if tenants else Upstream.objects.all()
    found = []
    for name in names:
        matches = list(rows.filter(name=name))
        if not matches:
            raise CommandError(f"no upstream named {name!r}" + (" in the chosen tenants" if tenants else ""))
        found += matches
    return found


def _copy(field: FieldFile, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    with field.open("rb") as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return target


def _where(field: FieldFile) -> str:
    try:
        return field.path
    except NotImplementedError:  # a storage without local paths (an object store)
        return field.name or ""


class Command(BaseCommand):
    help = (
        "Build an analysis report of [--since, --until) for some tenants (default: all) in this process and print "
        "where its file is (or copy it to --output). CSV gives two files: requests and findings. "
        "With --enqueue the Celery worker builds it instead and this command returns at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", required=True, help="Start, inclusive: YYYY-MM-DD or ISO date-time (UTC).")
        parser.add_argument("--until", required=True, help="End, exclusive: YYYY-MM-DD or ISO date-time (UTC).")
        parser.add_argument("--tenant", action="append", default=[], metavar="SLUG",
                            help="Tenant slug or name; repeatable. Default: every tenant.")
        parser.add_argument("--upstream", action="append", default=[], metavar="NAME",
                            help="Upstream name (of the chosen tenants); repeatable. Default: every upstream.")
        parser.add_argument("--format", required=True, choices=Report.Format.values)
        parser.add_argument("--output", type=Path, metavar="PATH",
                            help="Copy the file here (CSV: the findings go next to it as <name>-findings.csv).")
        parser.add_argument("--enqueue", action="store_true", help="Hand the build to the Celery worker.")

    def handle(self, *args: Any, **options: Any) -> None:
        since, until = parse_moment(options["since"]), parse_moment(options["until"])
        if since >= until:
            raise CommandError("--since must be before --until")
        tenants = tenants_named(options["tenant"])
        upstreams = upstreams_named(options["upstream"], tenants)
        report = report_request(since=since, until=until, format=options["format"], tenants=tenants,
                                upstreams=upstreams, origin=Report.Origin.COMMAND, enqueue=options["enqueue"])
        if options["enqueue"]:
            self.stdout.write(f"report #{report.pk} queued; see the admin's Reports page")
            return
        report_build_task.apply(args=(report.pk,))
        report.refresh_from_db()
        if report.status != Report.Status.DONE:
            raise CommandError(f"report #{report.pk} failed: {report.error}")
        for line in self._deliver(report, options["output"]):
            self.stdout.write(line)

    def _deliver(self, report: Report, output: Path | None) -> list[str]:
        if output is None:
            return [_where(f) for f in (report.file, report.findings_file) if f]
        paths = [_copy(report.file, output)]
        if report.findings_file:
            paths.append(_copy(report.findings_file, output.with_name(f"{output.stem}-findings{output.suffix}")))
        return [str(p) for p in paths]
