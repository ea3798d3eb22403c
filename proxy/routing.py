"""``/v1/*`` routes to the proxy consumers. The router matches the path only, so query strings
(Claude Code's ``/v1/messages?beta=true``) are ignored."""

from __future__ import annotations

from django.urls import re_path

from proxy.consumers import ChatCompletionsConsumer, ModelsConsumer, ProxyConsumer
from proxy.consumers_agents import CountTokensConsumer, MessagesConsumer, ResponsesConsumer

proxy_urlpatterns = [
    re_path(r"^v1/chat/completions/?$", ChatCompletionsConsumer.as_asgi()),
    re_path(r"^v1/models/?$", ModelsConsumer.as_asgi()),
    re_path(r"^v1/messages/count_tokens/?$", CountTokensConsumer.as_asgi()),
    re_path(r"^v1/messages/?$", MessagesConsumer.as_asgi()),
    re_path(r"^v1/responses/?$", ResponsesConsumer.as_asgi()),
    re_path(r"^v1/", ProxyConsumer.as_asgi()),
]
