"""httpx transports that enforce the outbound address policy (``infra.outbound``) at connect time.

The check sits in the httpcore network backend, the one place that turns a host name into a
socket: ``connect_tcp(host, port)`` resolves ``host`` itself, keeps the addresses the policy
allows, and connects to those (the first that answers) by address. Nothing resolves the name a
second time, so a DNS answer that changes between the check and the connect (rebinding) cannot
pass. The URL, the ``Host`` header and TLS stay as they were: httpcore starts TLS on the returned
stream with ``server_hostname`` = the URL's host, so SNI and certificate verification use the
name, and pooled connections are keyed by the name (httpcore ``_async/connection.py``).

Redirects are not followed: ``outbound_client`` sets ``follow_redirects=False`` (httpx's default
too), and a transport never follows them.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpcore
import httpx

from infra.outbound import (
    IPAddress,
    OutboundPolicy,
    OutboundRefused,
    allowed_addresses,
    current_policy,
    is_loopback_name,
    parse_url,
    unique_addresses,
)
from infra.outbound import resolve as resolve_sync

#: ``resolver(host, port) -> addresses``; tests inject one to play DNS (e.g. rebinding).
AsyncResolver = Callable[[str, int], Awaitable[list[IPAddress]]]
SyncResolver = Callable[[str, int], list[IPAddress]]
PolicySource = Callable[[], OutboundPolicy]


async def resolve_async(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (the event loop's ``getaddrinfo``, in a thread)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return unique_addresses(str(info[4][0]) for info in infos)


def _literal_or_none(host: str) -> list[IPAddress] | None:
    try:
        target = parse_url(f"http://[{host}]/" if ":" in host else f"http://{host}/")
    except OutboundRefused:
        return None
    return [target.literal] if target.literal is not None else None


def _checked(host: str, port: int, addresses: Iterable[IPAddress], policy: OutboundPolicy) -> list[IPAddress]:
    """The allowed addresses of ``host``; a loopback name is loopback whatever a resolver says."""
    addresses = list(addresses)
    if is_loopback_name(host) and any(not a.is_loopback for a in addresses):
        addresses = [a for a in addresses if a.is_loopback]
    if not addresses:
        raise httpcore.ConnectError(f"{host} has no address")
    return allowed_addresses(f"http://{host}:{port}", addresses, policy)


class PolicyNetworkBackend(httpcore.AsyncNetworkBackend):
    """An async httpcore network backend that connects only to addresses the policy allows."""

    def __init__(self, *, policy: PolicySource = current_policy, resolver: AsyncResolver = resolve_async,
                 inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._policy = policy
        self._resolver = resolver
        self._inner = inner or httpcore.AnyIOBackend()

    async def _addresses(self, host: str, port: int, timeout: float | None) -> list[IPAddress]:  # noqa: ASYNC109
        literal = _literal_or_none(host)
        if literal is not None:
            return literal
        try:
            async with asyncio.timeout(timeout):
                return await self._resolver(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} took longer than {timeout:g} s") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"{host} cannot be resolved: {exc}") from exc

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,  # noqa: ASYNC109 - httpcore's API
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        """Resolve ``host``, check every address, connect to the first allowed one that answers.

        Raises ``OutboundRefused`` when no address is allowed, else httpcore's ``ConnectError`` /
        ``ConnectTimeout`` (mapped to httpx's by the transport)."""
        allowed = _checked(host, port, await self._addresses(host, port, timeout), self._policy())
        error: Exception | None = None
        for address in allowed:
            try:
                return await self._inner.connect_tcp(str(address), port, timeout=timeout,
                                                      local_address=local_address, socket_options=socket_options)
            except httpcore.ConnectError as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(self, path: str, timeout: float | None = None,  # noqa: ASYNC109 - httpcore's API
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise OutboundRefused(f"unix:{path}", path, "unix sockets are not outbound destinations")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class SyncPolicyNetworkBackend(httpcore.NetworkBackend):
    """The blocking twin of ``PolicyNetworkBackend`` (for Celery tasks: webhooks, model listing)."""

    def __init__(self, *, policy: PolicySource = current_policy, resolver: SyncResolver = resolve_sync,
                 inner: httpcore.NetworkBackend | None = None) -> None:
        self._policy = policy
        self._resolver = resolver
        self._inner = inner or httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        """As ``PolicyNetworkBackend.connect_tcp``; resolution is not bounded by ``timeout`` here."""
        literal = _literal_or_none(host)
        try:
            found = literal if literal is not None else self._resolver(host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"{host} cannot be resolved: {exc}") from exc
        error: Exception | None = None
        for address in _checked(host, port, found, self._policy()):
            try:
                return self._inner.connect_tcp(str(address), port, timeout=timeout, local_address=local_address,
                                               socket_options=socket_options)
            except httpcore.ConnectError as exc:
                error = exc
        assert error is not None
        raise error

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise OutboundRefused(f"unix:{path}", path, "unix sockets are not outbound destinations")


def _check_request_url(request: httpx.Request) -> None:
    """Refuse before any connect what the URL alone gives away (userinfo, scheme, junk hosts)."""
    url = request.url
    if url.userinfo:
        raise OutboundRefused(str(url), "", "credentials in the URL (user:pass@) are not allowed; "
                                            "use the credential field")
    _check_origin(url.scheme, url.host, url.port)


@functools.lru_cache(maxsize=1024)
def _check_origin(scheme: str, host: str, port: int | None) -> None:
    """``parse_url`` of an origin, once per origin (a pooled upstream is asked thousands of times a minute;
    building and parsing its URL each time cost ~0.4 ms per request). Refusals raise and are not cached."""
    shown = f"[{host}]" if ":" in host else host
    parse_url(f"{scheme}://{shown}{f':{port}' if port is not None else ''}/")


class OutboundTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` whose connections obey the outbound address policy.

    ``limits`` as for httpx (an ``AsyncClient`` given a ``transport=`` ignores its own ``limits=``).
    ``verify`` is an ``ssl.SSLContext`` or bool. ``policy`` returns the policy to apply (default:
    the settings, read on every new connection); ``resolver`` resolves names (default: the OS).
    Raises ``OutboundRefused`` (an ``httpx.ConnectError``) with the request's URL.
    """

    def __init__(self, *, limits: httpx.Limits = httpx.Limits(), verify: ssl.SSLContext | bool = True,  # noqa: B008
                 http2: bool = False, policy: PolicySource = current_policy,
                 resolver: AsyncResolver = resolve_async) -> None:
        # Not super().__init__(): it builds its pool without a network backend parameter.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections, max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, http1=True, http2=http2,
            network_backend=PolicyNetworkBackend(policy=policy, resolver=resolver),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        _check_request_url(request)
        try:
            return await super().handle_async_request(request)
        except OutboundRefused as exc:
            raise exc.with_url(str(request.url)) from None


class SyncOutboundTransport(httpx.HTTPTransport):
    """The blocking twin of ``OutboundTransport`` (same arguments, a sync ``resolver``)."""

    def __init__(self, *, limits: httpx.Limits = httpx.Limits(), verify: ssl.SSLContext | bool = True,  # noqa: B008
                 policy: PolicySource = current_policy, resolver: SyncResolver = resolve_sync) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections, max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=SyncPolicyNetworkBackend(policy=policy, resolver=resolver),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        _check_request_url(request)
        try:
            return super().handle_request(request)
        except OutboundRefused as exc:
            raise exc.with_url(str(request.url)) from None


def outbound_client(**kwargs: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for any tenant-chosen URL (webhooks, model listing): the policy
    transport, no redirects, no proxy/SSL settings from the environment. ``limits`` and ``verify``
    go to the transport; other keyword arguments to the client."""
    transport = OutboundTransport(limits=kwargs.pop("limits", httpx.Limits()), verify=kwargs.pop("verify", True))
    return httpx.AsyncClient(transport=transport, follow_redirects=False, trust_env=False, **kwargs)


def sync_outbound_client(**kwargs: Any) -> httpx.Client:
    """The blocking twin of ``outbound_client`` (Celery tasks)."""
    transport = SyncOutboundTransport(limits=kwargs.pop("limits", httpx.Limits()), verify=kwargs.pop("verify", True))
    return httpx.Client(transport=transport, follow_redirects=False, trust_env=False, **kwargs)
