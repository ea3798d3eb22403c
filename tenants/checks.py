"""System checks for cross-setting invariants (STYLE.md rule 10): fail loudly on misconfiguration."""

from __future__ import annotations

import base64
import binascii
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Warning, register


def _is_fernet_key(key: str) -> bool:
    try:
        return len(base64.urlsafe_b64decode(key.encode())) == 32
    except (binascii.Error, ValueError):
        return False


def _url_ok(url: str, schemes: tuple[str, ...]) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in schemes and bool(parts.netloc or parts.path)


@register()
def check_secrets(app_configs: Any, **kwargs: Any) -> list[Error]:
    """Refuse the placeholder SECRET_KEY and a missing credential key outside DEBUG; reject malformed keys."""
    errors: list[Error] = []
    if not settings.DEBUG and settings.SECRET_KEY in ("", settings.INSECURE_SECRET_KEY):
        errors.append(Error("SECRET_KEY is the insecure default.", hint="Set SECRET_KEY (or SECRET_KEY_FILE).",
                            id="toolrelay.E001"))
    if not settings.DEBUG and not settings.CREDENTIAL_KEYS:
        errors.append(Error("CREDENTIAL_KEYS is empty: upstream credentials cannot be encrypted.",
                            hint="Generate one with `python manage.py credential_key` and set CREDENTIAL_KEYS.",
                            id="toolrelay.E002"))
    for position, key in enumerate(settings.CREDENTIAL_KEYS):
        if not _is_fernet_key(key):
            errors.append(Error(f"CREDENTIAL_KEYS entry #{position + 1} is not a Fernet key "
                                "(32 bytes, urlsafe base64).", id="toolrelay.E003"))
    return errors


@register()
def check_urls(app_configs: Any, **kwargs: Any) -> list[Error | Warning]:
    """Reject malformed broker / Redis / site URLs."""
    errors: list[Error | Warning] = []
    for name, schemes in (("CELERY_BROKER_URL", ("redis", "rediss", "amqp", "amqps", "pyamqp", "memory",
                                                 "sqla+sqlite", "filesystem")),
                          ("REDIS_URL", ("redis", "rediss", "unix")),
                          ("SITE_URL", ("http", "https"))):
        value = getattr(settings, name)
        if value and not _url_ok(value, schemes):
            errors.append(Error(f"{name}={value!r} is not a valid URL (expected one of: {', '.join(schemes)}).",
                                id="toolrelay.E004"))
    return errors
