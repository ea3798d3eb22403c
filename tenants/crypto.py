"""Encryption at rest for upstream credentials and extra headers (Fernet, several keys for rotation).

``CREDENTIAL_KEYS`` lists Fernet keys newest first: encryption uses the first, decryption tries each
(``cryptography.fernet.MultiFernet``), so operators put a new key in front, then re-encrypt at leisure
with ``python manage.py credential_key --rotate``. With no key configured (DEBUG only; the system
checks refuse it otherwise) a key is derived from ``SECRET_KEY``.
"""

from __future__ import annotations

import base64
import functools
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class CredentialError(Exception):
    """A stored credential cannot be decrypted with any configured key."""


@functools.lru_cache(maxsize=8)
def _fernet(keys: tuple[str, ...], secret_key: str) -> MultiFernet:
    if not keys:
        derived = base64.urlsafe_b64encode(hashlib.sha256(b"toolrelay-credentials:" + secret_key.encode()).digest())
        keys = (derived.decode(),)
    return MultiFernet([Fernet(k.encode()) for k in keys])


def _current() -> MultiFernet:
    return _fernet(tuple(settings.CREDENTIAL_KEYS), settings.SECRET_KEY)


def encrypt(plaintext: str) -> str:
    """Return the Fernet token (ASCII text) for ``plaintext`` under the newest key."""
    return _current().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    """Return the plaintext of ``token``; raise ``CredentialError`` when no key opens it."""
    try:
        return _current().decrypt(token.encode()).decode()
    except (InvalidToken, ValueError) as exc:
        raise CredentialError("the credential cannot be decrypted with the configured CREDENTIAL_KEYS") from exc


def rotate(token: str) -> str:
    """Re-encrypt ``token`` under the newest key (``MultiFernet.rotate``)."""
    try:
        return _current().rotate(token.encode()).decode()
    except (InvalidToken, ValueError) as exc:
        raise CredentialError("the credential cannot be decrypted with the configured CREDENTIAL_KEYS") from exc


def generate_key() -> str:
    """A new random Fernet key."""
    return Fernet.generate_key().decode()
