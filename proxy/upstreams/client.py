"""The upstream HTTP seam: one ``httpx.AsyncClient`` per process, streams opened in context managers.

The client also owns the upstream request body (``upstream_body``: model mapped, output tokens
capped, usage asked for) and what each upstream was learned to refuse (``proxy.upstreams.learned``): an
answer that refuses a parameter (``proxy.upstreams.refusals``: an output budget over the upstream's range,
``stream_options``, ``parallel_tool_calls``, a ``tool_choice`` value, an unknown field) is asked again
at once with the parameter clamped or left out, the fix is remembered per upstream and model (and
shared), and the refused answer is handed to the caller (``UpstreamResponse.refusals``) to audit as
a call of its own. Upstream credentials are decrypted here and nowhere else on the request path. Timeouts are the
upstream's own (``tenants.Upstream``): ``connect_timeout`` for the TCP/TLS connect,
``first_byte_timeout`` until the response headers and first body bytes, ``idle_timeout`` between two
body reads. httpx's own read timeout is only a backstop: the relay enforces first-byte and idle
deadlines itself (perf-anchors.md 2.4: the 5 s httpx defaults kill quiet reasoning streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings

from infra import headers as reserved_headers
from infra.outbound import OutboundRefused
from infra.outbound_http import OutboundTransport
from proxy.guard.checks.request import ChatRequest
from proxy.telemetry import spans
from proxy.upstreams import hops, refusals, shares
from proxy.upstreams.decoding import PIECE, BodyTooLarge, BodyUndecodable, BoundedBody
from proxy.upstreams.learned import LearnedLimits, RedisShare, facts_of, record
from tenants import crypto
from tenants.principal import UpstreamTarget

logger = logging.getLogger(__name__)

USER_AGENT = "toolrelay/0.1"
#: Bytes of a non-200 upstream body kept for the error message and classification.
ERROR_BODY_CAP = 64 * 1024
#: Times one call is asked again past a parameter refusal (each must fix something the last did not).
MAX_REASKS = 2


class UpstreamTimeout(Exception):
    """The upstream did not answer within a first-byte or idle deadline. ``phase`` says which."""

    def __init__(self, phase: str, seconds: float) -> None:
        super().__init__(f"no {phase} from the upstream within {seconds:g} s")
        self.phase = phase


class DeadlineExceeded(UpstreamTimeout):
    """The whole request's deadline passed (``RoutePlan.deadline``) while the upstream was still at it."""

    def __init__(self, seconds: float) -> None:
        Exception.__init__(self, f"the request deadline of {seconds:g} s passed")
        self.phase = "request"


class UpstreamUnavailable(Exception):
    """The upstream could not be reached (connect refused, DNS, TLS, connection reset)."""


class UpstreamBusy(UpstreamUnavailable):
    """Every one of the upstream's ``UPSTREAM_UPSTREAM_CONNECTIONS`` shares of this process's connections
    stayed in use for ``LIMITS_CONCURRENCY_WAIT_SECONDS`` (``proxy.upstreams.shares``): retryable."""


class UpstreamMisconfigured(UpstreamUnavailable):
    """The upstream cannot be called as configured (its stored credential does not decrypt, or the outbound
    address policy refuses its address): retrying cannot help; an operator must fix it. ``detail`` is the
    operators' text for the audit (may name the address); ``str()`` is what the client may read."""

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


class UpstreamRefusedByPolicy(UpstreamMisconfigured):
    """The outbound address policy refuses the upstream's address (``infra.outbound``); ``detail`` names it."""


class _IdleWatch:
    """The idle deadline between body chunks, with one timer per body instead of two per chunk.

    Per chunk the reader only sets ``holding`` and ``expires`` (plain attributes); the timer wakes
    up at ``expires`` at the earliest, re-arms itself while chunks keep coming or while the relay holds
    one, and otherwise cancels the reading task, which ``timed_out()`` tells apart from a client
    disconnect (the same bookkeeping as ``asyncio.timeout``). Rescheduling an ``asyncio.timeout`` per
    chunk cost ~7 us per chunk here (a cancelled and a new timer handle each time).
    """

    __slots__ = ("_loop", "_task", "_idle", "_cancelling", "_handle", "_fired", "expires", "holding")

    def __init__(self, idle: float) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "chunks() is iterated inside a task"
        self._task = task
        self._idle = idle
        self._cancelling = task.cancelling()
        self._fired = False
        self.holding = False
        self.expires = self._loop.time() + idle
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self.expires, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if self.holding:
            self._handle = self._loop.call_at(now + self._idle, self._check)
        elif now < self.expires:
            self._handle = self._loop.call_at(self.expires, self._check)
        else:
            self._handle = None
            self._fired = True
            self._task.cancel()

    def timed_out(self) -> bool:
        """True when the cancellation being handled is this deadline's own (then it is consumed)."""
        return self._fired and self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """An upstream answer the client asked again past: ``status``, capped ``body``, ``headers``,
    ``started`` / ``ended`` (monotonic seconds) of that call, and ``refused``: what it refused and the
    fixes of the next call (None for an answer audited as a plain HTTP error)."""

    status: int
    body: bytes
    headers: httpx.Headers
    started: float
    ended: float
    refused: refusals.Refused | None = None


@dataclass(slots=True)
class UpstreamResponse:
    """An open upstream response: ``status``, ``headers`` and an async iterator of raw body chunks.

    ``asked_usage``: the body that got this answer asked for a usage chunk (``stream_options``);
    ``refusals``: earlier answers of this call that the client asked again past, oldest first.
    """

    status: int
    headers: httpx.Headers
    _response: httpx.Response
    _idle: float
    asked_usage: bool = False
    refusals: tuple[Refusal, ...] = ()
    _prefetched: bytes | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        """Raw body chunks as they arrive (no re-chunking: ``aiter_raw()`` without ``chunk_size``).

        Raises ``UpstreamTimeout`` when ``idle_timeout`` passes between two chunks and
        ``UpstreamUnavailable`` when the connection breaks mid-body, when the body passes
        ``UPSTREAM_MAX_BODY_BYTES`` decoded, or when it does not decode. An upstream that compresses
        although it was asked for ``identity`` is decoded (the client must get bytes it can read), in
        bounded pieces (``proxy.upstreams.decoding``).
        """
        loop = asyncio.get_running_loop()
        watch = _IdleWatch(self._idle)
        try:
            body = BoundedBody(self.headers.get("content-encoding", "identity"), settings.UPSTREAM_MAX_BODY_BYTES)
            async for raw in self._response.aiter_raw():
                for chunk in body.feed(raw):
                    # No deadline while the consumer holds the chunk: a timeout must only ever
                    # interrupt the upstream read, never the relay's own work between reads.
                    watch.holding = True
                    yield chunk
                    watch.holding = False
                watch.expires = loop.time() + self._idle
            for chunk in body.flush():
                yield chunk
        except asyncio.CancelledError:
            if watch.timed_out():
                raise UpstreamTimeout("data", self._idle) from None
            raise
        except (BodyTooLarge, BodyUndecodable) as exc:
            raise UpstreamUnavailable(str(exc)) from None
        except httpx.TransportError as exc:
            raise UpstreamUnavailable(f"the upstream connection broke: {type(exc).__name__}") from exc
        finally:
            watch.close()

    async def read_capped(self, cap: int = ERROR_BODY_CAP) -> bytes:
        """Up to ``cap`` bytes of the body (for error answers)."""
        if self._prefetched is not None:
            return self._prefetched[:cap]
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            parts.append(chunk)
            size += len(chunk)
            if size >= cap:
                break
        return b"".join(parts)[:cap]


@functools.lru_cache(maxsize=256)
def _decrypted(token: str) -> str:
    return crypto.decrypt(token) if token else ""


@functools.lru_cache(maxsize=256)
def _decrypted_headers(token: str) -> tuple[tuple[str, str], ...]:
    return tuple(json.loads(crypto.decrypt(token)).items()) if token else ()


def secrets_of(target: UpstreamTarget) -> frozenset[str]:
    """The target's credentials (every key of its pool) and extra header values (decrypted), the strings
    that must never leave."""
    try:
        headers = _decrypted_headers(target.extra_headers_encrypted)
        values = [_decrypted(target.credential_encrypted), *(_decrypted(k[1]) for k in target.keys),
                  *(value for _, value in headers)]
    except crypto.CredentialError:
        return frozenset()  # never sent either: the call fails before any request (UpstreamMisconfigured)
    return frozenset(v for v in values if len(v) >= 4)


def request_headers(target: UpstreamTarget, *, stream: bool) -> dict[str, str]:
    """Headers for an upstream call: the stored extra headers first, then toolrelay's own over them (JSON,
    the decrypted credential as a Bearer token, the request's proxy hop count: ``proxy.upstreams.hops``).
    Reserved names (``infra.headers``) in a stored row saved before they were refused are dropped; a
    stored name equal to one of toolrelay's in another case is dropped too (one header per name)."""
    headers = {name.lower(): value for name, value in _decrypted_headers(target.extra_headers_encrypted)
               if not reserved_headers.reserved(name)}
    # identity: the bytes a pass-through forwards must be what the client can read (httpx asks for gzip
    # by default, and aiter_raw() does not decode it).
    headers.update({"content-type": "application/json", "user-agent": USER_AGENT, "accept-encoding": "identity",
                    "accept": "text/event-stream" if stream else "application/json", hops.HEADER: hops.outgoing()})
    credential = _decrypted(target.credential_encrypted)
    if credential:
        headers["authorization"] = f"Bearer {credential}"
    spans.inject(headers)  # W3C traceparent of the attempt's span (nothing with tracing off)
    return headers


def upstream_changes(request: ChatRequest, target: UpstreamTarget, *, ask_usage: bool, cap: int | None = None,
                     fixes: tuple[refusals.Fix, ...] = ()) -> tuple[dict[str, Any], bool]:
    """What ``upstream_body`` changes in the client's body (field -> value, None: left out) and whether the
    result asks for usage."""
    body = request.body
    changes: dict[str, Any] = {}
    if body.get("model") != target.model:
        changes["model"] = target.model
    for key in refusals.BUDGET_FIELDS:
        value = body.get(key)
        if cap and isinstance(value, int) and value > cap:
            changes[key] = cap
    if ask_usage and not request.include_usage:
        options = body.get("stream_options")
        changes["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    if fixes:
        changes.update(refusals.apply({**body, **changes}, fixes))
    options = changes["stream_options"] if "stream_options" in changes else body.get("stream_options")
    asked = isinstance(options, dict) and bool(options.get("include_usage"))
    return changes, asked and (request.include_usage or ask_usage)


def upstream_body(request: ChatRequest, target: UpstreamTarget, *, ask_usage: bool, cap: int | None = None,
                  fixes: tuple[refusals.Fix, ...] = ()) -> tuple[bytes, bool]:
    """The body for ``target`` and whether it asks for usage: model mapped, output tokens capped at
    ``cap``, ``stream_options.include_usage`` added when ``ask_usage`` (the guarded path accounts
    retries with it), then ``fixes`` applied (what the upstream was learned to refuse, ``proxy.upstreams.refusals``).

    The client's exact bytes are returned when nothing changes (a pass-through must stay
    byte-identical upstream too).
    """
    changes, asked = upstream_changes(request, target, ask_usage=ask_usage, cap=cap, fixes=fixes)
    return _encoded(request, changes), asked


def _encoded(request: ChatRequest, changes: dict[str, Any]) -> bytes:
    """The client's exact bytes when nothing changes, else the changed body as JSON."""
    if not changes and request.raw is not None:
        return request.raw
    return json.dumps(_merged(request.body, changes)).encode()


def _merged(body: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``body`` with ``changes`` (a None change leaves the field out)."""
    merged = {**body, **changes}
    return {k: v for k, v in merged.items() if v is not None or k not in changes}


async def _read_capped(response: httpx.Response, cap: int = ERROR_BODY_CAP) -> bytes:
    """Up to ``cap`` bytes of an error body, decoded when the upstream compressed it anyway."""
    parts: list[bytes] = []
    size = 0
    try:
        body = BoundedBody(response.headers.get("content-encoding", "identity"), cap + PIECE)
        async for raw in response.aiter_raw():
            for chunk in body.feed(raw):
                parts.append(chunk)
                size += len(chunk)
                if size >= cap:
                    return b"".join(parts)[:cap]
    except (httpx.TransportError, BodyTooLarge, BodyUndecodable):
        pass  # what arrived is enough to classify the refusal
    return b"".join(parts)[:cap]


class UpstreamClient:
    """The process-wide upstream client. ``transport`` may be injected (tests use ``httpx.MockTransport``)."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        limits = httpx.Limits(max_connections=settings.UPSTREAM_MAX_CONNECTIONS,
                              max_keepalive_connections=settings.UPSTREAM_MAX_KEEPALIVE, keepalive_expiry=30)
        # The pool timeout bounds waiting for a free connection; read deadlines are enforced per phase.
        timeout = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=30.0)
        # The outbound address policy is checked on every new connection (DNS rebinding cannot pass a check
        # made when the URL was saved); an injected transport (tests' MockTransport) replaces it. The pool
        # limits go to the transport: an AsyncClient given a transport ignores its own.
        self._client = httpx.AsyncClient(timeout=timeout, trust_env=False, follow_redirects=False,
                                         transport=transport or OutboundTransport(limits=limits))
        #: What each upstream was learned to refuse, per model (``proxy.upstreams.learned``), and its Redis share.
        self.learned = LearnedLimits()
        self._share: RedisShare | None = None
        self._following: asyncio.Future[None] | None = None

    @contextlib.asynccontextmanager
    async def open(self, target: UpstreamTarget, request: ChatRequest, *, ask_usage: bool = False,
                   max_output_tokens: int | None = None, first_byte: float | None = None,
                   idle: float | None = None) -> AsyncIterator[UpstreamResponse]:
        """POST ``request`` (``upstream_body``) to ``{base_url}/chat/completions``; yield the open response.

        ``first_byte`` / ``idle`` (seconds) shorten the upstream's own deadlines (the relay's request
        deadline and retry deadline); they never lengthen them.

        The body carries what the upstream was learned to refuse for ``target.model``. An answer that
        refuses a parameter (``proxy.upstreams.refusals.classify``) is asked again at once with it fixed, at most
        ``MAX_REASKS`` times, each fixing something new; the fixes that hold are remembered and shared
        (``proxy.upstreams.learned``), and ``UpstreamResponse.refusals`` holds the refused answers. The response is
        closed when the context exits, also on cancellation (client disconnect). Raises
        ``UpstreamTimeout`` (first byte), ``UpstreamUnavailable`` (connect errors), ``UpstreamBusy`` (the
        upstream's share of this process's connections stayed in use: ``proxy.upstreams.shares``) and
        ``UpstreamMisconfigured`` (stored secrets that do not decrypt).
        """
        headers = self._headers(target, stream=request.stream)
        slots = shares.SHARES.slots("upstream", target.upstream_id, settings.UPSTREAM_UPSTREAM_CONNECTIONS)
        wait = float(settings.LIMITS_CONCURRENCY_WAIT_SECONDS)
        if not await slots.acquire(wait):
            raise UpstreamBusy(f"the upstream {target.name!r} has all of its {slots.limit} connections of this "
                               f"server in use (waited {wait:g} s)")
        try:
            async with self._opened(target, request, headers, ask_usage=ask_usage,
                                    max_output_tokens=max_output_tokens, first_byte=first_byte,
                                    idle=idle) as response:
                yield response
        finally:
            slots.release()

    @contextlib.asynccontextmanager
    async def _opened(self, target: UpstreamTarget, request: ChatRequest, headers: dict[str, str], *,
                      ask_usage: bool, max_output_tokens: int | None, first_byte: float | None,
                      idle: float | None) -> AsyncIterator[UpstreamResponse]:
        """``open`` past the upstream's share."""
        if self._following is None and settings.REDIS_URL:
            await self._follow_shared()
        first_byte = min(target.first_byte_timeout, first_byte if first_byte is not None else target.first_byte_timeout)
        idle = min(target.idle_timeout, idle if idle is not None else target.idle_timeout)
        fixes = self.learned.fixes(target.upstream_id, target.model, target.learned)
        response, refused, prefetched, asked = await self._ask(
            target, headers, first_byte, request, lambda f: upstream_changes(
                request, target, ask_usage=ask_usage, cap=max_output_tokens, fixes=f), fixes)
        try:
            yield UpstreamResponse(response.status_code, response.headers, response, idle, asked, refused, prefetched)
        finally:
            await response.aclose()

    async def _ask(self, target: UpstreamTarget, headers: dict[str, str], first_byte: float, request: ChatRequest,
                   changes_for: Callable[[tuple[refusals.Fix, ...]], tuple[dict[str, Any], bool]],
                   fixes: tuple[refusals.Fix, ...]
                   ) -> tuple[httpx.Response, tuple[Refusal, ...], bytes | None, bool]:
        """Send, and ask again past each parameter refusal: ``(response, refused answers, the response's
        body when it was read to classify it, asks usage)``."""
        refused: list[Refusal] = []
        for reask in range(MAX_REASKS + 1):
            changes, asked = changes_for(fixes)
            started = time.monotonic()
            response = await self._send(target, headers, _encoded(request, changes), first_byte)
            if response.status_code not in refusals.STATUSES or reask == MAX_REASKS:
                return response, tuple(refused), None, asked
            try:
                body = await _read_capped(response)
            except BaseException:  # cancelled (the client left): the open response is ours to close
                await response.aclose()
                raise
            why = refusals.classify(response.status_code, body, _merged(request.body, changes))
            if why is None:
                return response, tuple(refused), body, asked
            await response.aclose()
            refused.append(Refusal(response.status_code, body, response.headers, started, time.monotonic(), why))
            self._remember(target, why)
            fixes = (*fixes, *why.fixes)
        raise AssertionError("unreachable: the last ask returns")

    def _remember(self, target: UpstreamTarget, refused: refusals.Refused) -> None:
        """Keep the fixes of ``refused`` that hold for later requests; journal and share them."""
        ttl = settings.UPSTREAM_LEARNED_TTL_SECONDS
        facts = [self.learned.learn(target.upstream_id, target.model, fix, ttl=ttl,
                                    detail=f"{refused.family}: {refused.message}") for fix in facts_of(refused)]
        if facts:
            record(facts, self._share)

    async def _follow_shared(self) -> None:
        """Start following the facts other processes learned (``REDIS_URL``): the first call of the process
        waits for one read of them (a round trip, bounded by a 0.5 s socket timeout), later ones never."""
        self._share = share = RedisShare(settings.REDIS_URL)
        self._following = asyncio.ensure_future(share.follow(self.learned, settings.UPSTREAM_LEARNED_SYNC_SECONDS))
        self.learned.absorb(await share.pull())

    def _headers(self, target: UpstreamTarget, *, stream: bool) -> dict[str, str]:
        try:
            return request_headers(target, stream=stream)
        except crypto.CredentialError:
            logger.warning("upstream %s (id %s): stored secrets do not decrypt with CREDENTIAL_KEYS",
                           target.name, target.upstream_id)
            raise UpstreamMisconfigured(f"the stored credential of upstream {target.name!r} cannot be decrypted "
                                        "with the configured CREDENTIAL_KEYS; an operator must re-enter it") from None

    async def _send(self, target: UpstreamTarget, headers: dict[str, str], body: bytes,
                    first_byte: float) -> httpx.Response:
        request = self._client.build_request(
            "POST", f"{target.base_url}/chat/completions", content=body, headers=headers,
            extensions={"timeout": {"connect": target.connect_timeout, "read": None, "write": 30.0, "pool": 30.0}},
        )
        try:
            async with asyncio.timeout(first_byte):
                return await self._client.send(request, stream=True)
        except TimeoutError:
            raise UpstreamTimeout("response", first_byte) from None
        except OutboundRefused as exc:  # the policy, not the network: no retry, an operator must act
            raise UpstreamRefusedByPolicy(exc.client_message, detail=str(exc)) from None
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout("connection", target.connect_timeout) from exc
        except httpx.TransportError as exc:
            raise UpstreamUnavailable(f"the upstream cannot be reached: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._following is not None:
            self._following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._following
        if self._share is not None:
            await self._share.aclose()
        await self._client.aclose()


_client: UpstreamClient | None = None


def get_client() -> UpstreamClient:
    """The process's UpstreamClient (created on first use, inside the running event loop)."""
    global _client
    if _client is None:
        _client = UpstreamClient()
    return _client


def set_client(client: UpstreamClient | None) -> None:
    """Replace the process client (tests inject one with a MockTransport)."""
    global _client
    _client = client
