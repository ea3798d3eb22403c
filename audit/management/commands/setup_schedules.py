"""``setup_schedules``: register the periodic tasks (retention purge, alert rules, reports) with
django-celery-beat (idempotent).

Beat then runs them (``celery -A config beat``, scheduler ``DatabaseScheduler``); each schedule is
a PeriodicTask row that stays editable in the admin (Periodic tasks). Running this again creates
only what is missing, so edits made in the admin survive (``docker compose up`` runs it every
time); ``--replace`` resets the rows it names to the given options.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from audit.models import Report
from tenants.models import Tenant

RETENTION_TASK = "audit.tasks.retention_purge_task"
REPORT_TASK = "audit.tasks.report_schedule_task"
RETENTION_NAME = "audit: retention purge"
ALERTS_TASK = "alerts.tasks.alerts_evaluate_task"
ALERTS_NAME = "alerts: evaluate the webhook rules"


def crontab(expression: str) -> CrontabSchedule:
    """The (shared) UTC crontab row for ``"minute hour day_of_month month_of_year day_of_week"``."""
    parts = expression.split()
    if len(parts) != 5:
        raise CommandError(f"{expression!r}: expected five crontab fields")
    minute, hour, day_of_month, month_of_year, day_of_week = parts
    schedule, _ = CrontabSchedule.objects.get_or_create(
        minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year,
        day_of_week=day_of_week, timezone="UTC")
    return schedule


def schedule_task(*, name: str, task: str, cron: str, args: list[Any], replace: bool = False
                  ) -> tuple[PeriodicTask, bool]:
    """The PeriodicTask ``name``, created if missing (or reset when ``replace``); True when written."""
    row = PeriodicTask.objects.filter(name=name).first()
    if row is not None and not replace:
        return row, False
    row, _ = PeriodicTask.objects.update_or_create(
        name=name, defaults={"task": task, "crontab": crontab(cron), "interval": None, "args": json.dumps(args),
                             "enabled": True})
    return row, True


class Command(BaseCommand):
    help = (
        "Register the daily retention purge, the alert rules' evaluation (every minute) and optionally a "
        "periodic report of one tenant as "
        "django-celery-beat schedules, editable afterwards in the admin."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--retention-cron", default="17 3 * * *", metavar="CRON",
                            help="When the purge runs (UTC crontab; default 03:17 daily).")
        parser.add_argument("--report-tenant", metavar="SLUG", help="Also schedule a report of this tenant.")
        parser.add_argument("--report-days", type=int, default=7, help="Whole days the report covers (default 7).")
        parser.add_argument("--report-format", choices=Report.Format.values, default=Report.Format.HTML)
        parser.add_argument("--report-cron", default="0 6 * * 1", metavar="CRON",
                            help="When the report is made (UTC crontab; default Mondays 06:00).")
        parser.add_argument("--alerts-cron", default="* * * * *", metavar="CRON",
                            help="When the tenants' alert rules are evaluated (UTC crontab; default every minute).")
        parser.add_argument("--replace", action="store_true",
                            help="Reset existing schedules of these names (default: leave them as edited).")

    def handle(self, *args: Any, **options: Any) -> None:
        replace = options["replace"]
        self._say(RETENTION_NAME, *schedule_task(name=RETENTION_NAME, task=RETENTION_TASK,
                                                 cron=options["retention_cron"], args=[], replace=replace))
        self._say(ALERTS_NAME, *schedule_task(name=ALERTS_NAME, task=ALERTS_TASK, cron=options["alerts_cron"],
                                              args=[], replace=replace))
        slug = options["report_tenant"]
        if slug:
            if not Tenant.objects.filter(slug=slug).exists():
                raise CommandError(f"no tenant with slug {slug!r}")
            if options["report_days"] < 1:
                raise CommandError("--report-days must be at least 1")
            name = f"audit: {options['report_format']} report of {slug} ({options['report_days']} days)"
            self._say(name, *schedule_task(name=name, task=REPORT_TASK, cron=options["report_cron"],
                                           args=[slug, options["report_days"], options["report_format"]],
                                           replace=replace))

    def _say(self, name: str, row: PeriodicTask, written: bool) -> None:
        cron = row.crontab
        when = f"{cron.minute} {cron.hour} {cron.day_of_month} {cron.month_of_year} {cron.day_of_week} UTC" \
            if cron else "(not a crontab)"
        self.stdout.write(f"{name}: {when}" + ("" if written else " (kept as it was)"))
