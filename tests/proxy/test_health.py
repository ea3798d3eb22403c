"""Liveness and readiness endpoints."""

from __future__ import annotations

import pytest
from django.test import Client


def test_it_answers_healthz(client: Client) -> None:
    """``/healthz`` is 200 while the process serves, without touching the database."""
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_it_answers_readyz_when_the_database_is_up(client: Client) -> None:
    """``/readyz`` is 200 when the database answers."""
    response = client.get("/readyz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
