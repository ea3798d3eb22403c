"""Thin Channels consumers for ``/v1/*`` (STYLE.md rules 3 and 4).

Each consumer authenticates (one selector), parses the client's request into chat.completions form,
picks the emitter for its protocol and hands over to the relay. The relay runs in its own task so
that ``http.disconnect`` is seen while streaming: the disconnect handler cancels the task, whose
``async with`` closes the upstream response at once (stock ``AsyncHttpConsumer`` only notices after
Daphne's ``application_close_timeout``, 10 s; perf-anchors.md 2.3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from channels.consumer import AsyncConsumer, get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from django.conf import settings

from proxy.guard.emit_openai import OpenAIChatEmitter
from proxy.guard.validate import tool_declaration_problem
from proxy.relay import Relay, RelayRequest, schedule
from proxy.upstream import get_client
from tenants.selectors import TenantSnapshot, cached_tenant_for_key, tenant_for_key

logger = logging.getLogger(__name__)


class RequestError(Exception):
    """A client error detected before any upstream call: becomes an HTTP error in the client's protocol."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


class _Responder:
    """Adapts the consumer's ``send`` to the relay's ``Responder`` protocol."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self.started = False
        self.done = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def send(self, body: bytes, *, more: bool = True) -> None:
        if not more:
            self.done = True
        await self._send({"type": "http.response.body", "body": body, "more_body": more})


async def _refresh_key(raw: str) -> None:
    """Renew a cached key's snapshot off the request path (refresh ahead, ``tenants.selectors``)."""
    try:
        await database_sync_to_async(tenant_for_key)(raw, refresh=True)
    except Exception:  # the cached answer stays until it expires; the next reader tries again
        logger.exception("API key refresh failed")


def header(scope: Mapping[str, Any], name: bytes) -> str:
    """The first value of request header ``name`` (lowercase bytes), decoded as latin-1, or ''."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return ""


def api_key_from(scope: Mapping[str, Any]) -> str:
    """The client's key from ``Authorization: Bearer`` or ``x-api-key`` (both are accepted)."""
    authorization = header(scope, b"authorization")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return header(scope, b"x-api-key").strip()


class ProxyConsumer(AsyncConsumer):
    """Base for the ``/v1/*`` consumers: body collection, size limit, the request task, disconnects.

    Subclasses implement ``handle(body)`` and ``error_body(...)`` for their protocol.
    """

    methods: tuple[str, ...] = ("POST",)
    protocol = "openai-chat"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._parts: list[bytes] = []
        self._size = 0
        self._task: asyncio.Future[None] | None = None
        self.responder = _Responder(self.send)
        self.request_id: uuid.UUID | None = None

    async def websocket_connect(self, message: dict[str, Any]) -> None:  # pragma: no cover - HTTP only
        raise StopConsumer()

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch minus its ``aclose_old_connections()`` before every message.

        That call is a hop to Channels' single database thread, so each ``http.request`` waited there
        behind the previous request's audit write (~4 ms added TTFT at concurrency 1, measured in
        docs/benchmarks.md). These consumers never use the ORM on the event loop: every database
        call goes through ``database_sync_to_async``, which closes stale connections itself.
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def http_request(self, message: dict[str, Any]) -> None:
        """Collect the body (Daphne sends it in pieces); start the request task once it is complete."""
        if self._task is not None:
            return
        self._parts.append(message.get("body", b""))
        self._size += len(self._parts[-1])
        if self._size > settings.MAX_REQUEST_BYTES:
            self._start(self._reject(RequestError(413, f"request body larger than {settings.MAX_REQUEST_BYTES} bytes",
                                                  code="request_too_large")))
        elif not message.get("more_body", False):
            self._start(self._serve(b"".join(self._parts)))

    async def http_disconnect(self, message: dict[str, Any]) -> None:
        """The client left (or the response ended): cancel the request task, which closes the upstream."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        raise StopConsumer()

    def _start(self, coro: Any) -> None:
        self._task = asyncio.ensure_future(coro)

    async def _serve(self, body: bytes) -> None:
        try:
            if self.scope.get("method") not in self.methods:
                raise RequestError(405, f"method {self.scope.get('method')} not allowed", code="method_not_allowed")
            await self.handle(body)
        except RequestError as exc:
            await self._reject(exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("consumer failed")
            if not self.responder.started:
                await self._reject(RequestError(500, "toolrelay failed to serve this request", type="server_error"))
        finally:
            if self.responder.started and not self.responder.done:
                with contextlib.suppress(Exception):
                    await self.responder.send(b"", more=False)

    async def _reject(self, exc: RequestError) -> None:
        request_id = str(self.request_id or uuid.uuid4())
        body = self.error_body(exc.status, f"{exc.message} (request id: {request_id})", type=exc.type,
                               param=exc.param, code=exc.code)
        headers = [(b"content-type", b"application/json"), (b"x-request-id", request_id.encode()),
                   (b"x-should-retry", b"false")]
        await self.responder.start(exc.status, headers)
        await self.responder.send(json.dumps(body).encode(), more=False)

    async def authenticate(self) -> TenantSnapshot:
        """The caller's tenant; ``RequestError`` 401 for a bad key, 403 for a disabled tenant."""
        raw = api_key_from(self.scope)
        found, snapshot, refresh = cached_tenant_for_key(raw) if raw else (True, None, False)
        if not found:
            snapshot = await database_sync_to_async(tenant_for_key)(raw)
        elif refresh:
            schedule(_refresh_key(raw))
        if snapshot is None:
            raise RequestError(401, "invalid API key", type="authentication_error", code="invalid_api_key")
        if not snapshot.active:
            raise RequestError(403, "this tenant is disabled", type="permission_error", code="tenant_disabled")
        return snapshot

    async def handle(self, body: bytes) -> None:
        """Serve the request (subclasses); the base answers 404."""
        raise RequestError(404, "not found", code="not_found")

    def error_body(self, status: int, message: str, *, type: str, param: str | None = None,
                   code: str | None = None) -> dict[str, Any]:
        """OpenAI's error shape (PROTOCOLS.md 1.6); other protocols override."""
        return {"error": {"message": message, "type": type, "param": param, "code": code}}


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object; ``RequestError`` 400 otherwise."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError(400, "the request body nests too deeply") from None
    if not isinstance(data, dict):
        raise RequestError(400, "the request body must be a JSON object")
    return data


def validate_chat_request(data: dict[str, Any]) -> None:
    """Field checks that must fail with 400 and ``param`` before anything goes upstream (PROTOCOLS.md 1.1)."""
    if not isinstance(data.get("model"), str) or not data["model"]:
        raise RequestError(400, "`model` is required and must be a string", param="model")
    if not isinstance(data.get("messages"), list) or not data["messages"]:
        raise RequestError(400, "`messages` is required and must be a non-empty array", param="messages")
    if "stream" in data and not isinstance(data["stream"], bool) and data["stream"] is not None:
        raise RequestError(400, "`stream` must be a boolean", param="stream")
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError(400, "`tools` must be an array", param="tools")
    for position, tool in enumerate(tools or ()):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(400, "each tool needs `function.name`", param=f"tools[{position}].function.name")
    n = data.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128):
        raise RequestError(400, "`n` must be an integer between 1 and 128", param="n")
    check_tool_declarations(data)


def check_tool_declarations(chat_body: dict[str, Any]) -> None:
    """``RequestError`` 400 when the declared tools can never be satisfied (see ``tool_declaration_problem``)."""
    problem = tool_declaration_problem(chat_body)
    if problem is not None:
        raise RequestError(400, problem[0], param=problem[1])


class ChatCompletionsConsumer(ProxyConsumer):
    """``POST /v1/chat/completions`` (OpenAI Chat Completions, stream and non-stream)."""

    async def handle(self, body: bytes) -> None:
        snapshot = await self.authenticate()
        data = parse_json_object(body)
        validate_chat_request(data)
        plan = snapshot.resolve(data["model"])
        if plan is None:
            raise RequestError(404, f"the model `{data['model']}` does not exist or is not routed for this key",
                               param="model", code="model_not_found")
        request = RelayRequest(snapshot=snapshot, plan=plan, body=data, raw_body=body, protocol=self.protocol,
                               user_agent=header(self.scope, b"user-agent"), emitter=self._emitter(data))
        self.request_id = request.id
        await Relay(request, self.responder, get_client()).run()

    @staticmethod
    def _emitter(data: dict[str, Any]) -> OpenAIChatEmitter:
        options = data.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        return OpenAIChatEmitter(model=data["model"], include_usage=include_usage)


class ModelsConsumer(ProxyConsumer):
    """``GET /v1/models``: the tenant's routed model names, in Anthropic's list format when the request
    carries ``anthropic-version`` (Claude Code's gateway model discovery, PROTOCOLS.md 4.1), else OpenAI's."""

    methods = ("GET",)

    async def handle(self, body: bytes) -> None:
        snapshot = await self.authenticate()
        names = snapshot.model_names()
        if header(self.scope, b"anthropic-version"):
            data: dict[str, Any] = {
                "data": [{"type": "model", "id": n, "display_name": n, "created_at": "1970-01-01T00:00:00Z"}
                         for n in names],
                "has_more": False, "first_id": names[0] if names else None, "last_id": names[-1] if names else None,
            }
        else:
            data = {"object": "list",
                    "data": [{"id": n, "object": "model", "created": 0, "owned_by": snapshot.slug} for n in names]}
        await self.responder.start(200, [(b"content-type", b"application/json"),
                                         (b"x-request-id", str(uuid.uuid4()).encode())])
        await self.responder.send(json.dumps(data).encode(), more=False)


__all__ = ["ChatCompletionsConsumer", "ModelsConsumer", "ProxyConsumer", "RequestError"]
