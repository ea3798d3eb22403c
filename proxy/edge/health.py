"""Liveness, readiness and Prometheus metrics endpoints."""

from __future__ import annotations

import asyncio
import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 while the process serves requests."""
    return JsonResponse({"status": "ok"})


@require_GET
async def readyz(request: HttpRequest) -> JsonResponse:
    """200 while this process can serve, 503 only when it cannot; never waits on the database.

    ``{"database": "ok|down", "journal_backlog_bytes": N, "redis": "ok|down|off"}``. The database state
    is the journal writer's (it pings the database when it has nothing to write); during a database
    outage the process still serves the keys it knows, so a load balancer does not drop every replica.
    It cannot serve when its journal is past its bound (records are being dropped) or when the database
    is down and it knows no key at all.
    """
    from audit.journal_writer import journal, writer
    from tenants import last_good

    journal()
    running = writer()
    assert running is not None
    status = running.status()
    for _ in range(40):  # a fresh writer's first ping: at most ~2 s
        if status.database != "unknown":
            break
        await asyncio.sleep(0.05)
        status = running.status()
    redis = await asyncio.get_running_loop().run_in_executor(None, _redis_state)
    database = "ok" if status.database == "ok" else "down"
    serving = status.backlog <= settings.JOURNAL_MAX_BYTES and (database == "ok" or last_good.known())
    return JsonResponse({"database": database, "journal_backlog_bytes": status.backlog, "redis": redis},
                        status=200 if serving else 503)


def _redis_state() -> str:
    if not settings.REDIS_URL:
        return "off"
    try:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.2, socket_connect_timeout=0.2)
        return "ok" if client.ping() else "down"
    except Exception:  # noqa: BLE001 - any failure means "down"
        return "down"


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition of the proxy metrics (``infra.metrics``); 401 without the bearer
    ``METRICS_TOKEN`` when one is configured."""
    from infra.metrics import render

    token = settings.METRICS_TOKEN
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if token and not hmac.compare_digest(given.encode(), token.encode()):
        return HttpResponse("metrics need the bearer METRICS_TOKEN\n", status=401, content_type="text/plain")
    body, content_type = render()
    return HttpResponse(body, content_type=content_type)
