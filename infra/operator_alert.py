"""The operator's own webhook (``ALERT_WEBHOOK_URL``): posted by the web process itself when its audit journal
stops draining into the database, and when it drains again.

Postgres may be what is down, so nothing here touches the database or Celery: the journal writer calls
``post`` on its state change, which starts a daemon thread that makes one POST with a bounded timeout
(``ALERT_WEBHOOK_TIMEOUT_SECONDS``) and logs, never raises. At most ``MAX_IN_FLIGHT`` posts run at
once (a receiver that hangs cannot pile up threads). The URL is the operator's (it may be an internal
Alertmanager or chat bridge), so it is not put through the tenants' outbound address policy;
redirects are not followed and proxy settings from the environment are ignored. The body is
``ALERT_WEBHOOK_FORMAT`` (``slack`` or ``generic``, ``infra.webhook``), signed with
``ALERT_WEBHOOK_SECRET`` when it is set.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

import httpx
from django.conf import settings

from infra import webhook

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 4
_in_flight = threading.BoundedSemaphore(MAX_IN_FLIGHT)


def alert_of(incident: dict[str, Any]) -> dict[str, Any]:
    """The alert (``infra.webhook`` generic shape) of a process-wide incident (``audit.incidents``)."""
    at = datetime.fromtimestamp(float(incident.get("at") or 0), tz=UTC).isoformat()
    return {"event": incident.get("kind", ""), "rule": incident.get("kind", ""), "tenant": None,
            "subject": settings.SITE_URL, "summary": f"{incident.get('title', '')}: {incident.get('detail', '')}",
            "value": None, "threshold": None, "window_minutes": None, "at": at}


def post(incident: dict[str, Any]) -> bool:
    """Post ``incident`` to ``ALERT_WEBHOOK_URL`` in the background; False when unset or too many are in flight."""
    url = settings.ALERT_WEBHOOK_URL
    if not url:
        return False
    if not _in_flight.acquire(blocking=False):
        logger.warning("operator alert not sent: %d posts to ALERT_WEBHOOK_URL still in flight", MAX_IN_FLIGHT)
        return False
    alert = alert_of(incident)
    thread = threading.Thread(target=_send, args=(url, alert), name="toolrelay-operator-alert", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no more threads: give up quietly, the log says why
        _in_flight.release()
        logger.warning("operator alert not sent: no thread could be started")
        return False
    return True


def _send(url: str, alert: dict[str, Any]) -> None:
    try:
        payload = webhook.body(alert, settings.ALERT_WEBHOOK_FORMAT)
        head = webhook.headers(settings.ALERT_WEBHOOK_SECRET, payload, str(alert["event"]))
        with httpx.Client(timeout=settings.ALERT_WEBHOOK_TIMEOUT_SECONDS, follow_redirects=False,
                          trust_env=False) as client:
            answer = client.post(url, content=payload, headers=head)
        if answer.status_code >= 300:
            logger.warning("operator alert %s: ALERT_WEBHOOK_URL answered HTTP %d", alert["event"], answer.status_code)
        else:
            logger.info("operator alert %s sent", alert["event"])
    except Exception as exc:  # noqa: BLE001 - a background notification must never take anything down
        logger.warning("operator alert %s not sent: %s: %s", alert.get("event"), type(exc).__name__, exc)
    finally:
        _in_flight.release()
