"""Liveness and readiness endpoints."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client


def test_it_answers_healthz(client: Client) -> None:
    """``/healthz`` is 200 while the process serves, without touching the database."""
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.django_db(transaction=True)
def test_it_answers_readyz_when_the_database_is_up(client: Client) -> None:
    """``/readyz`` is 200 with the database's state, the journal backlog and Redis (off here)."""
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"database": "ok", "journal_backlog_bytes": 0, "redis": "off"}


def test_it_serves_metrics_only_with_the_token_when_one_is_set(client: Client, settings: Any) -> None:
    """``/metrics`` shows tenant traffic: with ``METRICS_TOKEN`` set, only to that bearer token."""
    settings.METRICS_TOKEN = "scrape-me-7f3a"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    allowed = client.get("/metrics", headers={"Authorization": "Bearer scrape-me-7f3a"})
    assert allowed.status_code == 200 and b"toolrelay_requests_in_flight" in allowed.content
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 200
