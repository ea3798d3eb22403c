"""``/v1/*`` routes to the proxy consumers (query strings are ignored by the router)."""

from __future__ import annotations

proxy_urlpatterns: list = []
