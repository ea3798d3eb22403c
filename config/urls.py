"""URL routes served by Django (everything that is not ``/v1/*``)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from api import rest
from proxy.edge import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("account/", include("api.urls")),
    path("api/v1/", rest.api.urls),
]

if settings.OIDC_ENABLED:
    urlpatterns.append(path("oidc/", include("mozilla_django_oidc.urls")))
