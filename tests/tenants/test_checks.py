"""System checks: loud on bad configuration, silent on a good one."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.test import override_settings

from tenants.checks import check_secrets, check_urls

GOOD = {"DEBUG": False, "SECRET_KEY": "a-real-secret-key-of-decent-length-0123456789",
        "CREDENTIAL_KEYS": [Fernet.generate_key().decode()], "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
        "REDIS_URL": "redis://127.0.0.1:6379/1", "SITE_URL": "https://relay.example.com"}


def _ids(**overrides: Any) -> set[str | None]:
    with override_settings(**{**GOOD, **overrides}):
        return {message.id for message in [*check_secrets(None), *check_urls(None)]}


def test_it_is_silent_on_a_good_configuration() -> None:
    """Production-like settings raise nothing."""
    assert _ids() == set()


def test_it_refuses_the_default_secret_key_outside_debug() -> None:
    """The placeholder SECRET_KEY is an error unless DEBUG."""
    from django.conf import settings

    assert _ids(SECRET_KEY=settings.INSECURE_SECRET_KEY) == {"toolrelay.E001"}
    assert _ids(SECRET_KEY=settings.INSECURE_SECRET_KEY, DEBUG=True) == set()


def test_it_refuses_a_missing_credential_key_outside_debug() -> None:
    """No CREDENTIAL_KEYS is an error unless DEBUG."""
    assert _ids(CREDENTIAL_KEYS=[]) == {"toolrelay.E002"}
    assert _ids(CREDENTIAL_KEYS=[], DEBUG=True) == set()


@pytest.mark.parametrize("key", ["not-a-key", "", "c2hvcnQ=", "!" * 44])
def test_it_refuses_a_malformed_fernet_key(key: str) -> None:
    """Every CREDENTIAL_KEYS entry must be a Fernet key, even in DEBUG."""
    assert _ids(CREDENTIAL_KEYS=[Fernet.generate_key().decode(), key]) == {"toolrelay.E003"}
    assert _ids(CREDENTIAL_KEYS=[key], DEBUG=True) == {"toolrelay.E003"}


@pytest.mark.parametrize("name, value", [
    ("CELERY_BROKER_URL", "redis//127.0.0.1:6379"),
    ("CELERY_BROKER_URL", "http://127.0.0.1:6379/0"),
    ("REDIS_URL", "localhost:6379"),
    ("SITE_URL", "relay.example.com"),
])
def test_it_refuses_malformed_urls(name: str, value: str) -> None:
    """Broker, Redis and site URLs must parse with a known scheme."""
    assert _ids(**{name: value}) == {"toolrelay.E004"}
