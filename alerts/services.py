"""Alert services: post a recorded delivery, record the end of its retries (STYLE.md rule 7).

``alert_deliver`` makes one POST (Celery retries it with backoff when it raises ``DeliveryFailed``);
``alert_delivery_fail`` records the end of the retries; ``cooling`` says whether a rule already fired
for a subject within its webhook's window. Evaluating the rules and queueing posts is
``alerts.tasks`` (``alerts_evaluate``, ``alert_test``), which calls these. Posts go through
``infra.outbound_http.sync_outbound_client`` (the outbound address policy at connect time, no
redirects), never from the request path.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
from django.utils import timezone

from alerts.models import AlertDelivery, AlertWebhook
from infra import webhook as wire
from infra.outbound_http import sync_outbound_client

#: Seconds one POST may take (connect, send, answer).
POST_TIMEOUT = 10.0
#: Characters of a receiver's answer kept in the delivery log.
ANSWER_CAP = 500


class DeliveryFailed(Exception):
    """The receiver did not take the alert (a non-2xx answer or a transport error): retry later."""


def cooling(webhook: AlertWebhook, rule: str, subject: str, now: datetime) -> bool:
    since = now - timedelta(minutes=webhook.window_minutes)
    return AlertDelivery.objects.filter(webhook=webhook, rule=rule, subject=subject, created__gt=since).exists()


def _post(hook: AlertWebhook, delivery: AlertDelivery) -> httpx.Response:
    payload = wire.body(delivery.payload, hook.format)
    with sync_outbound_client(timeout=POST_TIMEOUT) as client:
        return client.post(hook.url, content=payload, headers=wire.headers(hook.secret(), payload, delivery.rule))


def alert_deliver(*, delivery_id: int) -> str:
    """POST delivery ``delivery_id`` once; returns its status. Raises ``DeliveryFailed`` when the receiver
    did not take it (the attempt is recorded first). A delivered or failed one is left alone."""
    delivery = AlertDelivery.objects.select_related("webhook").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != AlertDelivery.Status.PENDING:
        return delivery.status if delivery is not None else "missing"
    delivery.attempts += 1
    try:
        answer = _post(delivery.webhook, delivery)
    except httpx.HTTPError as exc:  # OutboundRefused is an httpx.ConnectError
        delivery.response_status, delivery.error = None, f"{type(exc).__name__}: {exc}"[:ANSWER_CAP]
        delivery.save(update_fields=["attempts", "response_status", "error"])
        raise DeliveryFailed(delivery.error) from exc
    delivery.response_status = answer.status_code
    if answer.is_success:
        delivery.status, delivery.delivered, delivery.error = AlertDelivery.Status.DELIVERED, timezone.now(), ""
        delivery.save(update_fields=["attempts", "response_status", "status", "delivered", "error"])
        return delivery.status
    delivery.error = f"HTTP {answer.status_code}: {answer.text[:ANSWER_CAP]}"
    delivery.save(update_fields=["attempts", "response_status", "error"])
    raise DeliveryFailed(delivery.error)


def alert_delivery_fail(*, delivery_id: int, error: str) -> None:
    """The retries ran out: mark delivery ``delivery_id`` failed (keeping its last answer when it has one)."""
    rows = AlertDelivery.objects.filter(pk=delivery_id, status=AlertDelivery.Status.PENDING)
    rows.update(status=AlertDelivery.Status.FAILED, error=error[:ANSWER_CAP])
