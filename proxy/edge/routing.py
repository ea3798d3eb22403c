"""``/v1/*`` routes to the proxy consumer, one protocol and endpoint per path. The router matches the
path only, so query strings (Claude Code's ``/v1/messages?beta=true``) are ignored. Any other ``/v1/``
path, and the API paths without ``/v1`` that a misconfigured base URL produces (``/chat/completions``,
``/messages``, ``/responses``, ...), get a 404 naming the path meant (``proxy.edge.not_found``)."""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, re_path

from proxy.edge.consumers import ProxyConsumer
from proxy.edge.not_found import BARE_PATHS
from proxy.edge.protocols import ANTHROPIC_MESSAGES, OPENAI_CHAT, OPENAI_RESPONSES, ClientProtocol


def asgi_path(pattern: str, *, endpoint: str, protocol: ClientProtocol = OPENAI_CHAT) -> URLPattern:
    """``re_path`` for the consumer with ``protocol`` and ``endpoint`` (Channels routes ASGI apps like
    views; django-stubs only types views)."""
    app: Any = ProxyConsumer.as_asgi(protocol=protocol, endpoint=endpoint)
    route: URLPattern = re_path(pattern, app)
    return route


proxy_urlpatterns = [
    asgi_path(r"^v1/chat/completions/?$", endpoint="relay", protocol=OPENAI_CHAT),
    asgi_path(r"^v1/models/?$", endpoint="models"),
    asgi_path(r"^v1/messages/count_tokens/?$", endpoint="count_tokens", protocol=ANTHROPIC_MESSAGES),
    asgi_path(r"^v1/messages/?$", endpoint="relay", protocol=ANTHROPIC_MESSAGES),
    asgi_path(r"^v1/responses/?$", endpoint="relay", protocol=OPENAI_RESPONSES),
    asgi_path(r"^v1(?:/|$)", endpoint="not_found"),
    asgi_path(rf"^(?:{'|'.join(BARE_PATHS)})/?$", endpoint="not_found"),
]
