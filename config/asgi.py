"""ASGI entry point: ``/v1/*`` goes to the proxy consumers, everything else to Django; one WebSocket, the
admin's live incident feed (``audit.consumers``)."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.core.asgi import get_asgi_application  # noqa: E402 - settings must be set first

django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import re_path  # noqa: E402

from audit.consumers import IncidentConsumer  # noqa: E402
from audit.origin import ExactOriginValidator  # noqa: E402
from audit.views import SOCKET_PATH  # noqa: E402
from proxy.edge.routing import proxy_urlpatterns  # noqa: E402
from proxy.telemetry import tracing  # noqa: E402

# OpenTelemetry from the OTEL_* environment, set up when the server loads the application (not on its first
# request, which would pay for it); off without an OTLP endpoint (proxy.telemetry.tracing).
tracing.setup()

_django: Any = ASGIStaticFilesHandler(django_application) if settings.SERVE_STATIC else django_application
# Channels routes ASGI apps with Django's URL patterns; the stubs type those for views only.
_routes: list[Any] = [*proxy_urlpatterns, re_path(r"", _django)]

# The admin's live incident feed: the admin session authenticates it; a page of another origin (scheme, host
# and port compared exactly: audit.origin) cannot open it.
_feed: Any = IncidentConsumer.as_asgi()
_sockets: list[Any] = [re_path(rf"^{SOCKET_PATH.lstrip('/')}$", _feed)]

application = ProtocolTypeRouter({
    "http": URLRouter(_routes),
    "websocket": ExactOriginValidator(AuthMiddlewareStack(URLRouter(_sockets))),
})
