"""Liveness, readiness and Prometheus metrics endpoints."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 while the process serves requests."""
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the database answers, 503 otherwise."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any driver error means "not ready"
        return JsonResponse({"status": "unavailable", "database": type(exc).__name__}, status=503)
    return JsonResponse({"status": "ok"})


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition of the proxy metrics (``proxy.metrics``); 401 without the bearer
    ``METRICS_TOKEN`` when one is configured."""
    from proxy.metrics import render

    token = settings.METRICS_TOKEN
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if token and not hmac.compare_digest(given.encode(), token.encode()):
        return HttpResponse("metrics need the bearer METRICS_TOKEN\n", status=401, content_type="text/plain")
    body, content_type = render()
    return HttpResponse(body, content_type=content_type)
