from __future__ import annotations

from django.apps import AppConfig


class ProxyConfig(AppConfig):
    """The request path: guard core, relay, consumers, upstream client and simulator."""

    name = "proxy"
    verbose_name = "Proxy"
