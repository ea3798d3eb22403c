"""The project's URLs plus mozilla-django-oidc's, for the test of the single sign-on login page
(``config.urls`` adds them only when OIDC is configured at start-up)."""

from __future__ import annotations

from django.urls import include, path

from config.urls import urlpatterns as project_urls

urlpatterns = [*project_urls, path("oidc/", include("mozilla_django_oidc.urls"))]
