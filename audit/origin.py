"""The live feed's exact-origin check (issue 24 item 11).

Channels' ``AllowedHostsOriginValidator`` compares only the host of a WebSocket's ``Origin`` with
``ALLOWED_HOSTS``, not its scheme or port: a page served on another port of the same host (or over plain
HTTP beside HTTPS) could open the admin's feed with the admin's cookie (3/10 foreign origins accepted).
``ExactOriginValidator`` accepts an ``Origin`` only when it is exactly (scheme, host, port) the socket's
own origin (its ``Host`` header, ``https`` when the socket is ``wss`` or ``SECURE_PROXY_SSL_HEADER``
says so) or one of ``CSRF_TRUSTED_ORIGINS``, and its host is in ``ALLOWED_HOSTS``. Anything else, a
missing ``Origin`` included, is refused before the handshake (a 403, as Channels' denier does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(text: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin such as ``https://admin.example.com:8443``, lowercased, the default
    port made explicit; None when it is not an http(s) origin."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not host:
        return None
    return scheme, host, port or DEFAULT_PORTS[scheme]


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _scheme(scope: Mapping[str, Any]) -> str:
    if scope.get("scheme") in ("wss", "https"):
        return "https"
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name, expected = proxy
        header = name.lower().removeprefix("http_").replace("_", "-").encode()
        seen = _header(scope, header)
        if seen is not None and seen.split(",")[0].strip() == expected:
            return "https"
    return "http"


def origin_allowed(scope: Mapping[str, Any]) -> bool:
    """Is the socket's ``Origin`` exactly its own origin or a trusted one (module docstring)?"""
    origin_text = _header(scope, b"origin")
    origin = _origin(origin_text) if origin_text else None
    if origin is None or not validate_host(origin[1], settings.ALLOWED_HOSTS):
        return False
    trusted = {o for o in (_origin(t) for t in settings.CSRF_TRUSTED_ORIGINS if "*" not in t) if o}
    host = _header(scope, b"host")
    if host:
        domain, port = split_domain_port(host.lower())
        scheme = _scheme(scope)
        if domain:
            trusted.add((scheme, domain, int(port) if port.isdigit() else DEFAULT_PORTS[scheme]))
    return origin in trusted


class ExactOriginValidator:
    """ASGI middleware: WebSockets whose ``Origin`` is not allowed (``origin_allowed``) are denied."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        if scope.get("type") == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
