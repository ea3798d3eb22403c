"""ASGI entry point: ``/v1/*`` goes to the proxy consumers, everything else to Django."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.core.asgi import get_asgi_application  # noqa: E402 - settings must be set first

django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import re_path  # noqa: E402

from proxy.routing import proxy_urlpatterns  # noqa: E402

_django: Any = ASGIStaticFilesHandler(django_application) if settings.SERVE_STATIC else django_application
# Channels routes ASGI apps with Django's URL patterns; the stubs type those for views only.
_routes: list[Any] = [*proxy_urlpatterns, re_path(r"", _django)]

application = ProtocolTypeRouter({"http": URLRouter(_routes)})
