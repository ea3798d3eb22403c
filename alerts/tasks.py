"""Celery tasks of the alerts: thin, id-based wrappers over ``alerts.services`` (STYLE.md rule 9).

``alert_deliver_task(delivery_id)`` posts one alert and is retried with exponential backoff and
jitter (``retry_backoff``: about 5, 10, 20, 40, 80, 160 s, at most ``MAX_RETRIES`` times) while the
receiver does not take it; when the retries run out the delivery is marked failed. Without a
broker (``OffThreadEagerTask``) the task runs in a background thread and Celery re-runs a retry at
once: ``on_retry`` then sleeps the backoff in that thread first, so a receiver that is down is not
hit six times in a row. ``alerts_evaluate_task()`` evaluates every webhook's rules (beat schedule
``setup_schedules``; ``manage.py serve`` without a broker).

``alerts_evaluate`` creates an ``AlertDelivery`` per rule that fires and is not cooling down, and
queues its post on commit; ``alert_test`` does the same for the admin's test button.
"""

from __future__ import annotations

import logging
import random
import time
from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from alerts.models import AlertDelivery, AlertWebhook
from alerts.rules import alert, firing
from alerts.services import DeliveryFailed, alert_deliver, alert_delivery_fail, cooling
from audit.tasks import OffThreadEagerTask

logger = logging.getLogger(__name__)

MAX_RETRIES = 6
BACKOFF_SECONDS = 5
BACKOFF_MAX_SECONDS = 600


class AlertTask(OffThreadEagerTask):
    """Marks the delivery (first positional argument) failed when its retries run out; in eager mode,
    waits the backoff before each retry (Celery's eager retries do not)."""

    def on_retry(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        if self.request.is_eager:
            cap = min(float(BACKOFF_MAX_SECONDS), float(self.retry_backoff) * 2 ** self.request.retries)
            time.sleep(random.uniform(0, cap))  # noqa: S311 - jitter, not a secret

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        delivery_id = args[0] if args else (kwargs or {}).get("delivery_id")
        if delivery_id is not None:
            alert_delivery_fail(delivery_id=int(delivery_id), error=f"{type(exc).__name__}: {exc}")
        logger.warning("alert delivery %s failed for good: %s", delivery_id, exc)


@shared_task(base=AlertTask, bind=True, autoretry_for=(DeliveryFailed,), retry_backoff=BACKOFF_SECONDS,  # type: ignore[untyped-decorator]
             retry_backoff_max=BACKOFF_MAX_SECONDS, retry_jitter=True, max_retries=MAX_RETRIES,
             soft_time_limit=60, time_limit=90)
def alert_deliver_task(self: AlertTask, delivery_id: int) -> str:
    """Post alert delivery ``delivery_id``; returns its status."""
    return alert_deliver(delivery_id=delivery_id)


@shared_task(base=OffThreadEagerTask, soft_time_limit=120, time_limit=180)  # type: ignore[untyped-decorator]
def alerts_evaluate_task() -> int:
    """Evaluate every enabled webhook's rules; returns how many alerts were enqueued."""
    return len(alerts_evaluate())


def _enqueue(delivery: AlertDelivery) -> None:
    alert_deliver_task.delay_on_commit(delivery.pk)


def _record(webhook: AlertWebhook, rule: str, subject: str, payload: dict[str, Any]) -> AlertDelivery:
    delivery = AlertDelivery.objects.create(webhook=webhook, tenant_id=webhook.tenant_id, rule=rule,
                                            subject=subject[:200], payload=payload)
    _enqueue(delivery)
    return delivery


def alerts_evaluate(*, now: datetime | None = None) -> list[int]:
    """Evaluate every enabled webhook's rules at ``now``; returns the ids of the deliveries created."""
    now = now or timezone.now()
    created = []
    for hook in AlertWebhook.objects.filter(enabled=True, tenant__active=True).select_related("tenant"):
        for rule, subject, payload in firing(hook, now):
            with transaction.atomic():
                if not cooling(hook, rule, subject, now):
                    created.append(_record(hook, rule, subject, payload).pk)
    return created


def alert_test_refusal(*, webhook: AlertWebhook, now: datetime | None = None) -> str | None:
    """Why a test alert to ``webhook`` may not be sent now (the admin's button is rate limited: one per
    webhook per ``ALERT_TEST_INTERVAL_SECONDS``, ``ALERT_TEST_PER_TENANT_PER_MINUTE`` per tenant), or None."""
    now = now or timezone.now()
    tests = AlertDelivery.objects.filter(rule=AlertDelivery.Rule.TEST.value)
    interval = settings.ALERT_TEST_INTERVAL_SECONDS
    if tests.filter(webhook=webhook, created__gt=now - timedelta(seconds=interval)).exists():
        return f"a test alert to {webhook.name} was queued less than {interval} s ago; see the delivery log"
    per_minute = settings.ALERT_TEST_PER_TENANT_PER_MINUTE
    if tests.filter(tenant_id=webhook.tenant_id, created__gt=now - timedelta(minutes=1)).count() >= per_minute:
        return f"this tenant queued {per_minute} test alerts in the last minute; try again in a minute"
    return None


@transaction.atomic
def alert_test(*, webhook: AlertWebhook) -> AlertDelivery:
    """Record and enqueue a test alert to ``webhook`` (the admin's test button)."""
    payload = alert(webhook, AlertDelivery.Rule.TEST.value, "test", "a test alert from the toolrelay admin",
                    value=None, threshold=None, now=timezone.now())
    return _record(webhook, AlertDelivery.Rule.TEST.value, "test", payload)
