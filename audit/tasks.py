"""Celery tasks of the audit app: thin, id-based wrappers over ``audit.report_services`` (STYLE.md rule 9).

``report_request`` creates a report and queues its build (``report_enqueue``:
``report_build_task.delay_on_commit(report.pk)``); ``report_schedule`` is beat's periodic request.
With a broker configured a normal worker runs them. With none (``CELERY_TASK_ALWAYS_EAGER``, the default
of ``make run``),
``OffThreadEagerTask`` runs the task eagerly in a background thread of the calling process, so an
admin request that asks for a report returns at once instead of building it on the request thread
(docs/reports.md, "Running without a broker"). At most ``EAGER_TASK_WORKERS`` of those threads run at
once (each may hold a database connection), the others wait their turn; past ``EAGER_TASK_QUEUE``
waiting, a task is not started and logged (issue 24 item 9: 120 test alerts against a receiver that
never answered held every Postgres connection).

Time limits are per task; the hard limit needs the prefork pool (``--pool=solo`` ignores it), the
soft one raises ``SoftTimeLimitExceeded`` inside the task, which ``on_failure`` records.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import shared_task
from celery.contrib.django.task import DjangoTask
from celery.result import AsyncResult
from celery.utils import uuid
from django.conf import settings
from django.db import OperationalError, connections, transaction
from django.utils import timezone

from audit.models import Report
from audit.report_services import report_build, report_fail, retention_purge
from tenants.models import Tenant, Upstream

logger = logging.getLogger(__name__)

REPORT_SOFT_LIMIT = 15 * 60
REPORT_HARD_LIMIT = REPORT_SOFT_LIMIT + 60


class _EagerSlots:
    """The bound on eager task threads: ``running`` at most ``EAGER_TASK_WORKERS``, ``waiting`` at most
    ``EAGER_TASK_QUEUE`` (both read when a task is queued)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting = 0
        self.running = 0
        self.turn = threading.Condition(self.lock)

    def admit(self) -> bool:
        """Count one more waiting task; False when ``EAGER_TASK_QUEUE`` are already waiting."""
        with self.lock:
            if self.waiting >= settings.EAGER_TASK_QUEUE:
                return False
            self.waiting += 1
            return True

    def run(self, work: Callable[[], None]) -> None:
        """Wait for one of ``EAGER_TASK_WORKERS`` turns, then ``work()``."""
        with self.turn:
            while self.running >= max(1, settings.EAGER_TASK_WORKERS):
                self.turn.wait()
            self.waiting -= 1
            self.running += 1
        try:
            work()
        finally:
            with self.turn:
                self.running -= 1
                self.turn.notify()


_eager = _EagerSlots()


class OffThreadEagerTask(DjangoTask):  # type: ignore[misc]  # celery ships no type information
    """A task that, in eager mode, runs in a background thread instead of the caller's thread, at most
    ``EAGER_TASK_WORKERS`` at once (``_EagerSlots``)."""

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None, producer: Any = None,
                    link: Any = None, link_error: Any = None, shadow: str | None = None, **options: Any
                    ) -> AsyncResult:
        if not self.app.conf.task_always_eager:
            return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow, **options)
        task_id = task_id or uuid()
        if not _eager.admit():
            logger.error("eager task %s (%s) not started: %s tasks are already waiting (EAGER_TASK_QUEUE); "
                         "configure a Celery broker for this load", self.name, task_id, settings.EAGER_TASK_QUEUE)
            return self.AsyncResult(task_id)
        thread = threading.Thread(target=_eager.run, args=(lambda: self._run_eager(args, kwargs, task_id),),
                                  name=f"eager {self.name}", daemon=True)
        thread.start()
        return self.AsyncResult(task_id)

    def _run_eager(self, args: Any, kwargs: Any, task_id: str) -> None:
        try:
            self.apply(args, kwargs, task_id=task_id)
        finally:
            connections.close_all()  # this thread's connections only (they are thread-local)


class ReportTask(OffThreadEagerTask):
    """Marks the report (first positional argument) failed, with the error, when the task fails."""

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        report_id = args[0] if args else (kwargs or {}).get("report_id")
        if report_id is not None:
            report_fail(report_id=int(report_id), error=f"{type(exc).__name__}: {exc}")
        logger.error("report %s failed: %s", report_id, exc)


_REPORT_TASK_OPTIONS: dict[str, Any] = {
    "soft_time_limit": REPORT_SOFT_LIMIT, "time_limit": REPORT_HARD_LIMIT,
    "autoretry_for": (OperationalError,), "retry_backoff": 5, "max_retries": 3,
}


@shared_task(base=ReportTask, bind=True, **_REPORT_TASK_OPTIONS)  # type: ignore[untyped-decorator]
def report_build_task(self: ReportTask, report_id: int) -> None:
    """Build report ``report_id`` (figures, then its export file)."""
    report_build(report_id=report_id)


@shared_task(base=OffThreadEagerTask, soft_time_limit=60, time_limit=120)  # type: ignore[untyped-decorator]
def report_schedule_task(tenant_slug: str, days: int, format: str) -> int:
    """Create a report of ``tenant_slug`` over the last ``days`` whole days and enqueue its build."""
    return report_schedule(tenant_slug=tenant_slug, days=int(days), format=format).pk


@shared_task(base=OffThreadEagerTask, soft_time_limit=30 * 60, time_limit=31 * 60)  # type: ignore[untyped-decorator]
def retention_purge_task() -> dict[str, int]:
    """Purge raw fragments past each tenant's retention days; returns what was removed."""
    result = retention_purge()
    return {"fragments": result.fragments, "finding_fragments": result.finding_fragments}


def report_request(*, since: datetime, until: datetime, format: str, tenants: Iterable[Tenant] = (),
                   upstreams: Iterable[Upstream] = (), requested_by: Any = None,
                   origin: str = Report.Origin.ADMIN, enqueue: bool = True) -> Report:
    """Create a queued report and (unless ``enqueue`` is False) enqueue its build on commit."""
    with transaction.atomic():
        report = Report.objects.create(since=since, until=until, format=format, origin=origin,
                                       requested_by=requested_by)
        report.tenants.set(list(tenants))
        report.upstreams.set(list(upstreams))
        if enqueue:
            report_enqueue(report=report)
    return report


def report_enqueue(*, report: Report) -> None:
    """Reset ``report`` to queued and hand its build to Celery once the transaction commits."""
    Report.objects.filter(pk=report.pk).update(status=Report.Status.QUEUED, progress=0, error="", finished=None)
    report_build_task.delay_on_commit(report.pk)


def report_schedule(*, tenant_slug: str, days: int, format: str, now: datetime | None = None) -> Report:
    """A scheduled report of ``tenant_slug`` over the ``days`` whole UTC days before today; enqueued."""
    tenant = Tenant.objects.get(slug=tenant_slug)
    until = (now or timezone.now()).astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return report_request(since=until - timedelta(days=days), until=until, format=format, tenants=[tenant],
                          origin=Report.Origin.SCHEDULE)
