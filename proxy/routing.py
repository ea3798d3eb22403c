"""``/v1/*`` routes to the proxy consumers. The router matches the path only, so query strings
(Claude Code's ``/v1/messages?beta=true``) are ignored."""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, re_path

from proxy.consumers import ChatCompletionsConsumer, ModelsConsumer, ProxyConsumer
from proxy.consumers_agents import CountTokensConsumer, MessagesConsumer, ResponsesConsumer


def asgi_path(pattern: str, consumer: type[ProxyConsumer]) -> URLPattern:
    """``re_path`` for an ASGI consumer (Channels routes them like views; django-stubs only types views)."""
    app: Any = consumer.as_asgi()
    route: URLPattern = re_path(pattern, app)
    return route


proxy_urlpatterns = [
    asgi_path(r"^v1/chat/completions/?$", ChatCompletionsConsumer),
    asgi_path(r"^v1/models/?$", ModelsConsumer),
    asgi_path(r"^v1/messages/count_tokens/?$", CountTokensConsumer),
    asgi_path(r"^v1/messages/?$", MessagesConsumer),
    asgi_path(r"^v1/responses/?$", ResponsesConsumer),
    asgi_path(r"^v1/", ProxyConsumer),
]
