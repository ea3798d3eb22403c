"""Without a broker there is no beat: ``manage.py serve`` evaluates the alert rules itself, every
``ALERT_EVALUATE_SECONDS``, in a daemon thread of its own (never on the event loop that serves requests).

Each tick runs ``alerts.tasks.alerts_evaluate`` (a few indexed queries per webhook) and enqueues the
posts, which ``OffThreadEagerTask`` runs in threads of their own. A tick that fails (the database is
down) is logged and the next one tries again. With a broker configured, this does nothing: beat runs
``alerts.tasks.alerts_evaluate_task`` on the schedule ``setup_schedules`` registers.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import connections

logger = logging.getLogger(__name__)


def start() -> threading.Thread | None:
    """Start the ticker when there is no broker and ``ALERT_EVALUATE_SECONDS`` > 0; returns its thread."""
    interval = float(settings.ALERT_EVALUATE_SECONDS)
    if settings.CELERY_BROKER_URL or interval <= 0:
        return None
    thread = threading.Thread(target=_run, args=(interval,), name="toolrelay-alert-ticker", daemon=True)
    thread.start()
    return thread


def _run(interval: float) -> None:
    stop = threading.Event()
    while not stop.wait(interval):
        tick()


def tick() -> int:
    """Evaluate the rules once; returns how many alerts were enqueued (0 when the evaluation failed)."""
    from alerts.tasks import alerts_evaluate

    try:
        return len(alerts_evaluate())
    except Exception as exc:  # noqa: BLE001 - the next tick tries again
        logger.warning("alert rules not evaluated: %s: %s", type(exc).__name__, exc)
        return 0
    finally:
        connections.close_all()
