"""Typed environment helpers that fail loudly (STYLE.md rule 10).

Each reads ``NAME`` or, when set, the file named by ``NAME_FILE`` (for Docker / Kubernetes
secrets) and raises ``ImproperlyConfigured`` on malformed values.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


#: Where `make run` keeps the secrets it generated for a checkout.
DEV_SECRETS = Path(__file__).resolve().parent.parent / "var" / "secrets.env"


def load_dev_secrets(path: Path = DEV_SECRETS) -> None:
    """Take variables the environment lacks from ``var/secrets.env`` (written by `make run`), so every
    entry point of a checkout (manage.py, Daphne via config.asgi, Celery) uses the same SECRET_KEY and
    CREDENTIAL_KEYS: a key made with `manage.py apikey create` then works against the running demo.
    The environment always wins; deployments set it and have no such file. Settings never read it."""
    if not path.is_file():
        return
    for line in path.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() and not name.lstrip().startswith("#"):
            os.environ.setdefault(name.strip(), value.strip())


def envstr(name: str, default: str = "") -> str:
    """Return the variable ``name`` (or the contents of ``NAME_FILE``), else ``default``."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={path!r} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    """Return ``name`` as a bool (1/true/yes/on, 0/false/no/off); raise on anything else."""
    raw = envstr(name, "1" if default else "0").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def envint(name: str, default: int) -> int:
    """Return ``name`` as an int; raise ``ImproperlyConfigured`` when it is not one."""
    raw = envstr(name, str(default)).strip()
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None


def envfloat(name: str, default: float) -> float:
    """Return ``name`` as a float; raise ``ImproperlyConfigured`` when it is not one."""
    raw = envstr(name, str(default)).strip()
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None


def envlist(name: str, default: str = "") -> list[str]:
    """Return ``name`` split on commas, blanks dropped."""
    return [part.strip() for part in envstr(name, default).split(",") if part.strip()]


def envnetworks(name: str, default: str = "") -> list[str]:
    """Return ``name`` as comma-separated networks in CIDR form (``127.0.0.0/8``, ``fd00::/8``; a bare
    address is one host), normalised (``10.1.2.3/8`` -> ``10.0.0.0/8``); raise on anything else."""
    networks = []
    for part in envlist(name, default):
        try:
            networks.append(str(ipaddress.ip_network(part, strict=False)))
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {part!r} is not a network (use CIDRs such as 10.1.0.0/16)") from None
    return networks
