"""One thin Channels consumer for ``/v1/*``, parameterized by a protocol and an endpoint (STYLE.md 3, 4).

The consumer collects the body, authorizes the key (``tenants.auth.authorize``, the one door),
parses the request and hands it to the endpoint: ``relay`` (the protocol prepares the request, the
route plan is resolved, the relay serves it), ``models``, ``count_tokens`` or ``not_found``. Every
byte to the client goes through the request's ``ClientResponse``.

The request runs in its own task so that ``http.disconnect`` is seen while streaming: the
disconnect handler cancels the task, whose ``async with`` closes the upstream response at once
(stock ``AsyncHttpConsumer`` only notices after Daphne's ``application_close_timeout``, 10 s;
perf-anchors.md 2.3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from channels.consumer import AsyncConsumer, get_handler_name
from channels.exceptions import StopConsumer
from django.conf import settings

from billing.book import ready as prices_ready
from infra import metrics
from infra.background import schedule
from infra.shared_state import Window, get_state
from proxy.edge import not_found as unknown_path
from proxy.edge.protocols import (
    ANTHROPIC_MESSAGES,
    CHARS_PER_TOKEN,
    OPENAI_CHAT,
    ClientProtocol,
    Prepared,
    estimate_tokens,
    listing_protocol,
    translated,
)
from proxy.edge.response import ClientResponse
from proxy.edge.server.backpressure import EXTENSION as BACKPRESSURE
from proxy.guard.checks.request import RequestInvalid
from proxy.guard.decisions.loops import session_id
from proxy.guard.protocols.translate_anthropic import count_tokens_body
from proxy.policy import limits
from proxy.relay import schema_pool
from proxy.relay.loop import Relay, RelayCall, refused
from proxy.routing.router import Router
from proxy.telemetry import semconv, spans
from proxy.upstreams import hops, shares
from proxy.upstreams.client import get_client
from proxy.upstreams.listing import get_models
from tenants.auth import AuthUnavailable, KeyRefused, authorize
from tenants.limits import Limits
from tenants.principal import Principal, RoutePlan

logger = logging.getLogger(__name__)

#: Seconds a client is asked to wait when its key cannot be checked (the database is unavailable).
AUTH_RETRY_AFTER = 5.0
#: Bytes of an upstream answer per output token when it reported no usage (SSE framing included; a rough,
#: deliberately high estimate for token limits).
OUTPUT_BYTES_PER_TOKEN = 16


class RequestError(Exception):
    """A request refused before any upstream call: becomes an HTTP error in the client's protocol.

    ``retry_after`` (seconds) marks a refusal the client may retry (``x-should-retry: true``).
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, retry_after: float | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None, should_retry: bool | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.retry_after = retry_after
        self.headers = headers or []
        self.should_retry = retry_after is not None if should_retry is None else should_retry


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


async def principal_of(scope: Mapping[str, Any]) -> Principal:
    """The caller's principal; ``RequestError`` 401 for a key that cannot be used (unknown, revoked,
    expired, or of a disabled tenant: all look the same, so a disabled tenant's key is not confirmed
    valid), 429 once its address sent too many of them (``wrong_key_throttled``), 503 (retryable) when
    the key is not known and the database cannot be asked."""
    try:
        return await authorize(api_key_from(scope))
    except AuthUnavailable:
        raise RequestError(503, "the key cannot be checked right now (the proxy's database is unavailable); "
                           "retry shortly", type="server_error", code="auth_unavailable",
                           retry_after=AUTH_RETRY_AFTER) from None
    except KeyRefused:
        await wrong_key_counted(scope)
        raise RequestError(401, "invalid API key", type="authentication_error", code="invalid_api_key") from None


def client_address(scope: Mapping[str, Any]) -> str:
    """The client's address: the peer's, or with ``TRUSTED_PROXY_COUNT`` = N > 0 the N-th entry from the
    right of ``X-Forwarded-For`` (the one our own N-th proxy appended; what the client sent to the
    left of it is never trusted)."""
    count = int(settings.TRUSTED_PROXY_COUNT)
    if count > 0:
        forwarded = [p.strip() for p in header(scope, b"x-forwarded-for").split(",") if p.strip()]
        if len(forwarded) >= count:
            return forwarded[-count]
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


async def wrong_key_counted(scope: Mapping[str, Any]) -> None:
    """Count one refused key for the client's address; ``RequestError`` 429 past
    ``WRONG_KEY_LIMIT_PER_MINUTE`` (issue 15 item 6). Valid keys are never counted, so they are never
    throttled, not even behind the NAT of an address that sends wrong ones."""
    limit = int(settings.WRONG_KEY_LIMIT_PER_MINUTE)
    if limit <= 0:
        return
    window = Window(f"wrong-key:{client_address(scope)}", 60, limit, 1)
    verdict = await get_state().admit([window])
    if not verdict.admitted:
        metrics.LIMITS_REFUSED.labels(tenant=metrics.NO_ROUTE, limit="wrong_key").inc()
        retry = max(1.0, verdict.usage[0].reset)
        raise RequestError(429, f"too many invalid API keys from this address; retry in {math.ceil(retry)} s",
                           type="rate_limit_exceeded", code="wrong_key_throttled", retry_after=retry)


class ProxyConsumer(AsyncConsumer):
    """``/v1/*``: ``ProxyConsumer.as_asgi(protocol=..., endpoint=...)`` (``proxy.edge.routing``)."""

    #: No channel layer: an alias that is not configured makes Channels skip it. With the default one,
    #: every request would make a channel name (``new_channel``) and wait on the layer beside the ASGI
    #: receive: one more task per request on the byte path, and with ``REDIS_URL`` set a Redis
    #: round trip and a blocking pop per request, so a Redis outage would reach the proxy. Only the
    #: live incident feed uses the layer (channels/consumer.py ``AsyncConsumer.__call__``).
    channel_layer_alias = "toolrelay-proxy-has-no-channel-layer"

    def __init__(self, *, protocol: ClientProtocol = OPENAI_CHAT, endpoint: str = "not_found", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.protocol = protocol
        self.endpoint = ENDPOINTS[endpoint]
        self._parts: list[bytes] = []
        self._size = 0
        self._task: asyncio.Future[None] | None = None
        self.response: ClientResponse | None = None

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
            self._task = asyncio.ensure_future(self._serve(None))
        elif not message.get("more_body", False):
            self._task = asyncio.ensure_future(self._serve(b"".join(self._parts)))

    async def http_disconnect(self, message: dict[str, Any]) -> None:
        """The client left (or the response ended): cancel the request task, which closes the upstream."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        raise StopConsumer()

    async def _serve(self, body: bytes | None) -> None:
        """Serve one request (``body`` None: too large); every failure becomes an error in the protocol."""
        backpressure = (self.scope.get("extensions") or {}).get(BACKPRESSURE)  # only under `manage.py serve`
        if self.endpoint.protocol_of is not None:
            self.protocol = self.endpoint.protocol_of(self.scope)
        response = self.response = ClientResponse(self.send, error_body=self.protocol.error_body,
                                                  writable=getattr(backpressure, "wait_writable", None))
        trace = spans.start_request(self.scope, request_id=str(response.request_id), route=None if self.endpoint
                                    is ENDPOINTS["not_found"] else str(self.scope.get("path", "")).rstrip("/"))
        try:
            if body is None:
                raise RequestError(413, f"request body larger than {settings.MAX_REQUEST_BYTES} bytes",
                                   code="request_too_large")
            endpoint = self.endpoint
            if endpoint.methods and self.scope.get("method") not in endpoint.methods:
                raise RequestError(405, f"method {self.scope.get('method')} not allowed", code="method_not_allowed")
            await endpoint.serve(self, body)
        except RequestError as exc:
            await response.error(exc.status, exc.message, type=exc.type, param=exc.param, code=exc.code,
                                 should_retry=exc.should_retry, retry_after=exc.retry_after, headers=exc.headers)
        except RequestInvalid as exc:
            await response.error(400, exc.message, type="invalid_request_error", param=exc.param, code=exc.code)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("consumer failed")
            await response.fail_internal()
        finally:
            try:
                await response.finish()
            finally:
                trace.end(response.status)


# ----- endpoints -----

class Endpoint:
    """What a path does once its body is in: the HTTP ``methods`` it allows (empty: any) and ``serve``;
    ``protocol_of(scope)``, when set, picks the protocol of its answers from the request."""

    def __init__(self, methods: tuple[str, ...], serve: Callable[[ProxyConsumer, bytes], Awaitable[None]],
                 protocol_of: Callable[[Mapping[str, Any]], ClientProtocol] | None = None) -> None:
        self.methods = methods
        self.serve = serve
        self.protocol_of = protocol_of


def hops_checked(scope: Mapping[str, Any]) -> None:
    """Note the request's proxy hops for its upstream calls; ``RequestError`` 400 ``proxy_loop_detected``
    when it already passed through ``MAX_PROXY_HOPS`` toolrelays (``proxy.upstreams.hops``)."""
    count = hops.arrived(scope.get("headers") or ())
    if count >= settings.MAX_PROXY_HOPS:
        raise RequestError(400, f"this request already passed through {count} toolrelay proxy(ies) "
                           f"({hops.HEADER}); an upstream of this tenant points back at toolrelay: an operator "
                           "must fix its base URL (MAX_PROXY_HOPS allows chaining on purpose)",
                           code="proxy_loop_detected")
    hops.enter(count)


async def relay(consumer: ProxyConsumer, body: bytes) -> None:
    """Authorize, prepare in the consumer's protocol, route, admit, check large schemas, relay.

    A request refused before admission (a malformed body, a tool declaration or schema past a bound, an
    unknown model) still counts against its key's and tenant's requests per minute (``limits.count_refused``);
    the validation pool's schema checks run after admission, so a key over its rate gets its 429 before
    any pool work. The upstream calls hold one of the tenant's shares of this process's upstream
    connections (``proxy.upstreams.shares``)."""
    hops_checked(consumer.scope)
    principal = await principal_of(consumer.scope)
    shares.enter(principal.tenant_id)
    protocol = consumer.protocol
    data, prepared, plan = await _routed(principal, protocol, body)
    response = consumer.response
    assert response is not None
    estimate = max(1, len(body) // CHARS_PER_TOKEN)  # the client's bytes: O(1), no JSON encoding on the path
    call = RelayCall(principal=principal, plan=plan, request=prepared.request,
                     emitter=protocol.emitter(data, prepared), protocol=protocol.name,
                     passes_through=protocol.passes_through,
                     user_agent=header(consumer.scope, b"user-agent"), dropped=prepared.dropped,
                     session=session_id(consumer.scope.get("headers", ()), tenant=principal.tenant_id,
                                        key=principal.api_key_id, messages=prepared.request.body.get("messages")),
                     prompt_estimate=estimate)
    try:
        admission = await routed(call, estimate=estimate, anthropic=protocol.anthropic_headers)
    except RequestError as exc:
        refused(call, response, status=exc.status, error=exc.message)
        spans.current().event(semconv.EVENT_LIMIT, **{semconv.LIMIT_CODE: str(exc.code or exc.status)})
        raise
    relayed: Relay | None = None
    try:
        await schema_pool.check_schemas(prepared.request)  # large new tool schemas: checked off the event loop
        response.extra_headers = admission.headers
        async with tenant_share(principal, call, response):
            relayed = Relay(call, response, get_client())
            await relayed.run()
    finally:  # detached: a cancelled request (client gone) still gives its slot back and counts its tokens
        if admission.counted:
            schedule(admission.settle(tokens_of(relayed, estimate), tenant=principal.slug, usd=usd_of(relayed)))


async def routed(call: RelayCall, *, estimate: int, anthropic: bool) -> limits.Admission:
    """``admitted``, and the request's routing state read at the same time (``proxy.routing.router``: one
    round trip each, concurrent): ``call.router`` and its routed ``call.plan`` set."""
    principal = call.principal
    admission, router = await asyncio.gather(admitted(principal, estimate=estimate, anthropic=anthropic, call=call),
                                             Router.read(call.plan, tenant_id=principal.tenant_id,
                                                         session=call.session))
    call.router, call.plan = router, router.plan
    return admission


async def _routed(principal: Principal, protocol: ClientProtocol, body: bytes) -> tuple[dict[str, Any], Prepared,
                                                                                    RoutePlan]:
    """The parsed body, the prepared request and its route; a refusal (``RequestError``, ``RequestInvalid``)
    is counted against the key's and tenant's requests per minute before it is raised."""
    try:
        data = parse_json_object(body)
        prepared = protocol.prepare(data, body)
        model = prepared.request.model
        if not principal.allows(model):
            raise RequestError(403, f"the model `{model[:200]}` is not allowed for this key; its owner may use: "
                                    f"{', '.join(principal.member_models)[:1000]}",
                               param="model", code="model_not_allowed", type=protocol.forbidden_type)
        plan = principal.resolve(model)
        if plan is None:
            raise RequestError(404, f"the model `{model}` does not exist or is not routed for this key",
                               param="model", code="model_not_found", type=protocol.not_found_type)
    except (RequestError, RequestInvalid):
        await limits.count_refused(_limits_of(principal))
        raise
    return data, prepared, plan


def _limits_of(principal: Principal) -> tuple[int, int, Limits, Limits]:
    return principal.tenant_id, principal.api_key_id, principal.limits, principal.key_limits


@contextlib.asynccontextmanager
async def tenant_share(principal: Principal, call: RelayCall, response: ClientResponse) -> AsyncIterator[None]:
    """Hold one of the tenant's ``UPSTREAM_TENANT_CONNECTIONS`` shares of this process's upstream
    connections for the block; ``RequestError`` 429 ``concurrency`` (journaled as refused) when none came
    free within ``LIMITS_CONCURRENCY_WAIT_SECONDS``."""
    slots = shares.SHARES.slots("tenant", principal.tenant_id, settings.UPSTREAM_TENANT_CONNECTIONS)
    wait = float(settings.LIMITS_CONCURRENCY_WAIT_SECONDS)
    if not await slots.acquire(wait):
        message = (f"too many concurrent requests: the tenant's share of this server's upstream connections is "
                   f"{slots.limit} at once (waited {wait:g} s for one)")
        metrics.LIMITS_REFUSED.labels(tenant=metrics.bounded("tenant", principal.slug), limit="concurrency").inc()
        refused(call, response, status=429, error=message)
        raise RequestError(429, message, type="rate_limit_exceeded", code="concurrency", retry_after=1.0)
    try:
        yield
    finally:
        slots.release()


async def admitted(principal: Principal, *, estimate: int, anthropic: bool,
                   call: RelayCall | None = None) -> limits.Admission:
    """The request admitted by its key's, its member's and its tenant's limits and money budgets
    (``proxy.policy.limits``; ``call`` prices the money reservation); ``RequestError`` 429 over one
    (``error.code`` names it; a spent budget is ``insufficient_quota``, not retryable)."""
    await prices_ready()  # the process's first request reads the price map once (billing.book)
    member = (principal.member_id, principal.member_limits) if principal.member_id is not None else None
    money = principal.limits.money or principal.key_limits.money or principal.member_limits.money
    reserve = limits.reservation_usd(call.plan.target(0), call.request.body, estimate) if money and call else 0.0
    try:
        admission = await limits.admit(_limits_of(principal), estimate=estimate, anthropic=anthropic,
                                       reserve_usd=reserve, member=member)
    except limits.LimitExceeded as exc:
        metrics.LIMITS_REFUSED.labels(tenant=metrics.bounded("tenant", principal.slug), limit=exc.limit).inc()
        raise RequestError(429, exc.message, type=exc.type, code=exc.code, retry_after=exc.retry_after,
                           headers=exc.headers, should_retry=not exc.quota) from None
    if call is not None:
        call.notes = admission.findings  # a budget past its soft threshold: on the request's audit record
    return admission


def usd_of(relayed: Relay | None) -> float | None:
    """USD of every attempt of ``relayed`` (unpriced ones count 0); None when it never started."""
    return sum(a.cost_usd or 0.0 for a in relayed.log.all) if relayed is not None else None


def tokens_of(relayed: Relay | None, estimate: int) -> int | None:
    """Input + output tokens of every attempt (retries cost too) from their usage; without usage the
    input estimate per attempt plus the bytes received; None when nothing was received (the admission's
    estimate stands; see ``proxy.policy.limits``)."""
    attempts = relayed.log.all if relayed is not None else []
    if not any(a.prompt_tokens or a.completion_tokens for a in attempts):
        received = sum(a.bytes_received or 0 for a in attempts)
        return None if not received else estimate * max(1, len(attempts)) + received // OUTPUT_BYTES_PER_TOKEN
    return sum(a.prompt_tokens + a.completion_tokens for a in attempts)


async def models(consumer: ProxyConsumer, body: bytes) -> None:
    """``GET /v1/models``: the tenant's routed model names, then the models its default upstream lists
    (``proxy.upstreams.listing``: fetched and cached; none when it cannot say), in Anthropic's list format
    when the request carries ``anthropic-version`` (Claude Code's gateway model discovery, PROTOCOLS.md
    4.1), else OpenAI's."""
    hops_checked(consumer.scope)
    principal = await principal_of(consumer.scope)
    protocol = listing_protocol(header(consumer.scope, b"anthropic-version"))
    names = [n for n in principal.model_names() if principal.allows(n)]
    if principal.default_target is not None:
        routed = set(names)
        upstream = await get_models().names(principal.default_target)
        names += [n for n in dict.fromkeys(upstream) if n not in routed and principal.allows(n)]
    assert consumer.response is not None
    await consumer.response.send_json(200, protocol.models_listing(names, principal.slug))


async def count_tokens(consumer: ProxyConsumer, body: bytes) -> None:
    """``POST /v1/messages/count_tokens`` -> ``{"input_tokens": N}``, counted here by the model family's
    own tokenizer where one is installed, else estimated (PROTOCOLS.md 2.5: optional for Claude Code,
    which estimates locally when it is absent). Counted in a worker thread: a family's first count
    loads its vocabulary (up to about a second), which the event loop does not wait for."""
    await principal_of(consumer.scope)  # a valid key is all this endpoint needs
    chat = translated(count_tokens_body, parse_json_object(body))
    tokens = await asyncio.to_thread(estimate_tokens, chat, load=True)
    assert consumer.response is not None
    await consumer.response.send_json(200, {"input_tokens": tokens})


async def not_found(consumer: ProxyConsumer, body: bytes) -> None:
    """Any other ``/v1/`` path, and the paths a base URL without ``/v1`` produces: a 404 naming the path
    meant (``proxy.edge.not_found``), for any method."""
    path, method = str(consumer.scope.get("path", "")), str(consumer.scope.get("method", ""))
    raise RequestError(404, unknown_path.message(method, path, unknown_path.nearest(path)), code="unknown_url",
                       type=consumer.protocol.not_found_type)


def not_found_protocol(scope: Mapping[str, Any]) -> ClientProtocol:
    """The protocol of a 404: Anthropic's for a caller that looks Anthropic (``proxy.edge.not_found``)."""
    meant = unknown_path.nearest(str(scope.get("path", "")))
    return ANTHROPIC_MESSAGES if unknown_path.speaks_anthropic(scope, meant) else OPENAI_CHAT


ENDPOINTS = {
    "relay": Endpoint(("POST",), relay),
    "models": Endpoint(("GET",), models),
    "count_tokens": Endpoint(("POST",), count_tokens),
    "not_found": Endpoint((), not_found, protocol_of=not_found_protocol),
}

__all__ = ["ProxyConsumer", "RequestError"]
