"""The outbound address policy: which addresses toolrelay connects to on a tenant's behalf.

A tenant admin chooses upstream base URLs (and, later, webhook and model-listing URLs); without a
policy that is server-side request forgery with read-back (issue 15, item 2). Refused, unless the
operator's allow-list ``settings.UPSTREAM_ALLOW_NETWORKS`` (CIDRs, environment only) names them:
loopback, unspecified, link-local (incl. the cloud metadata addresses ``169.254.169.254`` and
``fd00:ec2::254``), private (RFC 1918, unique-local), shared CGNAT space (``100.64.0.0/10``),
multicast, reserved / documentation / benchmarking ranges, and the IPv6 forms that embed one of
those IPv4 addresses (IPv4-mapped ``::ffff:a.b.c.d``, SIIT ``::ffff:0:a.b.c.d``, IPv4-compatible ``::a.b.c.d``, NAT64
``64:ff9b::/96``, 6to4 ``2002::/16``). Ranges from the IANA special-purpose address registries
(RFC 6890, https://www.iana.org/assignments/iana-ipv4-special-registry and -ipv6-); anything else
the standard library does not call global is refused too.

URLs are refused when they carry credentials (``user:pass@``: they belong in the credential field),
are not http(s), or spell a host ambiguously. Numeric IPv4 spellings (``2130706433``, ``0x7f.1``,
``0177.0.0.1``, ``127.1``) are parsed as the WHATWG URL standard (section 3.5, "IPv4 parser") and
``inet_aton(3)`` do, so they are judged as the address they are.

This module checks at save time (``check_url``, which resolves host names when it can); the httpx
transports in ``infra.outbound_http`` check every resolved address at connect time, so DNS
rebinding does not pass. No Django model imports; settings are read lazily.
"""

from __future__ import annotations

import concurrent.futures
import functools
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from urllib.parse import SplitResult, urlsplit

import httpx

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

#: The setting (and environment variable) holding the operator's allow-list.
ALLOW_SETTING = "UPSTREAM_ALLOW_NETWORKS"
#: How long a save-time check waits for DNS (seconds); an unanswered name is left to connect time.
SAVE_RESOLVE_SECONDS = 2.0

_V4_REFUSED: tuple[tuple[IPv4Network, str], ...] = tuple((IPv4Network(net), why) for net, why in (
    ("0.0.0.0/8", "unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata)"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "reserved (IETF protocol assignments)"),
    ("192.0.2.0/24", "reserved (documentation)"),
    ("192.88.99.0/24", "reserved (6to4 relay)"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "reserved (benchmarking)"),
    ("198.51.100.0/24", "reserved (documentation)"),
    ("203.0.113.0/24", "reserved (documentation)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved (incl. broadcast)"),
))
_V6_REFUSED: tuple[tuple[IPv6Network, str], ...] = tuple((IPv6Network(net), why) for net, why in (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("64:ff9b:1::/48", "private (local-use NAT64)"),
    ("100::/64", "reserved (discard-only)"),
    ("2001::/23", "reserved (IETF protocol assignments, incl. Teredo)"),
    ("2001:db8::/32", "reserved (documentation)"),
    ("3fff::/20", "reserved (documentation)"),
    ("fc00::/7", "private (unique-local, incl. fd00:ec2::254 cloud metadata)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "private (site-local)"),
    ("ff00::/8", "multicast"),
))
_V4_COMPATIBLE = IPv6Network("::/96")
_NAT64 = IPv6Network("64:ff9b::/96")
#: SIIT's IPv4-translated addresses ``::ffff:0:a.b.c.d`` (RFC 2765 section 2.1).
_IPV4_TRANSLATED = IPv6Network("::ffff:0:0:0/96")
#: Names that always mean this host (RFC 6761 section 6.3), whatever a resolver says.
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


class OutboundRefused(httpx.ConnectError):
    """The outbound address policy refused ``url``: ``address`` (may be empty for a malformed URL)
    is not allowed because of ``reason`` (e.g. ``"loopback"``).

    A subclass of ``httpx.ConnectError``, so code that treats transport errors as "unreachable"
    stays correct; callers that can say more catch it first. ``str()`` is for operators and the
    audit; ``client_message`` leaves out the address (a resolved internal address is not the
    key holder's business). ``url`` never carries userinfo or a query string.
    """

    def __init__(self, url: str, address: str, reason: str) -> None:
        self.url = safe_url(url)
        self.address = address
        self.reason = reason
        super().__init__(self._describe())

    def _describe(self) -> str:
        where = f"{self.url} -> {self.address}" if self.address else self.url
        allow = f"; an operator can allow it with {ALLOW_SETTING}" if self.address else ""
        return f"outbound address policy refused {where}: {self.reason}{allow}"

    @property
    def client_message(self) -> str:
        """What a client may be told: the policy and the kind of address, not the address."""
        return f"the upstream's address is refused by toolrelay's outbound address policy ({self.reason})"

    def with_url(self, url: str) -> OutboundRefused:
        """The same refusal naming ``url`` (the transport knows the URL, the resolver only the host)."""
        return OutboundRefused(url, self.address, self.reason)


def safe_url(url: str) -> str:
    """``url`` without userinfo, query or fragment (for messages and logs)."""
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        return SplitResult(parts.scheme, host, parts.path, "", "").geturl()
    except ValueError:
        return "(malformed URL)"


# ----- addresses -----

def parse_networks(values: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDR strings (``"127.0.0.0/8"``, a bare address = one host) -> networks; ``ValueError`` on junk."""
    return tuple(ipaddress.ip_network(value.strip(), strict=False) for value in values if value.strip())


def _embedded_ipv4(address: IPv6Address) -> tuple[IPv4Address, str] | None:
    """The IPv4 address an IPv6 address stands for, and the name of the form, or None."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped, "IPv4-mapped"
    if address in _NAT64:
        return IPv4Address(int(address) & 0xFFFFFFFF), "NAT64"
    if address in _IPV4_TRANSLATED:
        return IPv4Address(int(address) & 0xFFFFFFFF), "IPv4-translated"
    if address.sixtofour is not None:
        return address.sixtofour, "6to4"
    if address in _V4_COMPATIBLE and int(address) > 1:
        return IPv4Address(int(address) & 0xFFFFFFFF), "IPv4-compatible"
    return None


@dataclass(frozen=True, slots=True)
class OutboundPolicy:
    """The allow-list and the verdict on an address. ``allowed`` names networks the operator opened."""

    allowed: tuple[IPNetwork, ...] = ()

    def is_allowed(self, address: IPAddress) -> bool:
        return any(address.version == net.version and address in net for net in self.allowed)

    def refusal(self, address: IPAddress) -> str | None:
        """Why ``address`` may not be connected to (``"loopback"``, …), or None when it may."""
        if self.is_allowed(address):
            return None
        if isinstance(address, IPv6Address):
            if address.scope_id:
                return "link-local (zone index)"
            if int(address) > 1:
                embedded = _embedded_ipv4(address)
                if embedded is not None:
                    inner, form = embedded
                    why = self.refusal(inner)
                    return None if why is None else f"{form} form of {inner}, {why}"
        table: Sequence[tuple[IPNetwork, str]] = _V4_REFUSED if address.version == 4 else _V6_REFUSED
        for network, why in table:
            if address in network:
                return why
        return None if address.is_global else "not globally routable"


@functools.lru_cache(maxsize=8)
def _policy_for(values: tuple[str, ...]) -> OutboundPolicy:
    return OutboundPolicy(parse_networks(values))


def current_policy() -> OutboundPolicy:
    """The policy of ``settings.UPSTREAM_ALLOW_NETWORKS``, read now (so settings overrides apply)."""
    from django.conf import settings

    return _policy_for(tuple(getattr(settings, ALLOW_SETTING, ()) or ()))


# ----- URLs and host names -----

def _ipv4_part(text: str) -> int | None:
    """One dotted part as ``inet_aton`` reads it: ``0x`` hex, leading ``0`` octal, else decimal."""
    try:
        if text[:2].lower() == "0x":
            return int(text[2:] or "0", 16)
        if len(text) > 1 and text.startswith("0"):
            return int(text[1:], 8)
        return int(text, 10) if text.isdigit() else None
    except ValueError:
        return None


def parse_ipv4_number(host: str) -> IPv4Address | None:
    """``host`` as an IPv4 address in any numeric spelling (``2130706433``, ``0x7f.1``), else None.

    Raises ``ValueError`` when the host ends in a number but is no valid address (``1.2.3.4.5``,
    ``1.2.3.999``): the WHATWG URL parser fails such hosts, resolvers disagree about them.
    """
    parts = host.split(".")
    last = parts[-1]
    if not (last.isdigit() or (last[:2].lower() == "0x" and all(c in "0123456789abcdefABCDEF" for c in last[2:]))):
        return None
    numbers = [_ipv4_part(part) for part in parts]
    if len(parts) > 4 or any(n is None for n in numbers):
        raise ValueError(f"{host!r} is not a valid IPv4 address")
    values = [n for n in numbers if n is not None]
    if any(n > 255 for n in values[:-1]) or values[-1] >= 256 ** (5 - len(values)):
        raise ValueError(f"{host!r} is not a valid IPv4 address")
    number = values[-1]
    for position, value in enumerate(values[:-1]):
        number += value << (8 * (3 - position))
    return IPv4Address(number)


@dataclass(frozen=True, slots=True)
class Target:
    """A checked URL's connection end: ``host`` (lowercase, IDNA), ``port``, and ``literal`` when
    the host is an address."""

    scheme: str
    host: str
    port: int
    literal: IPAddress | None


def _host_literal(host: str) -> IPAddress | None:
    if ":" in host:
        return ipaddress.ip_address(host)
    return parse_ipv4_number(host)


def parse_url(url: str) -> Target:
    """Split ``url`` into its connection end; ``OutboundRefused`` when it is malformed, not http(s),
    carries userinfo or names a host ambiguously. No DNS."""
    if any(ch.isspace() or ord(ch) < 32 or ch == "\\" for ch in url):
        raise OutboundRefused(url, "", "the URL contains whitespace, control characters or backslashes")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise OutboundRefused(url, "", "not a valid URL") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise OutboundRefused(url, "", "only http and https URLs are allowed")
    if "@" in parts.netloc:
        raise OutboundRefused(url, "", "credentials in the URL (user:pass@) are not allowed; "
                                       "use the credential field")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise OutboundRefused(url, "", "the URL has no host")
    try:
        host = host.encode("idna").decode("ascii").lower() if not host.isascii() else host.lower()
        literal = _host_literal(host)
    except (UnicodeError, ValueError) as exc:
        raise OutboundRefused(url, "", f"not a valid host: {exc}") from None
    default = 443 if parts.scheme.lower() == "https" else 80
    return Target(parts.scheme.lower(), host, port or default, literal)


def is_loopback_name(host: str) -> bool:
    """``localhost`` and names under ``.localhost`` (RFC 6761): this host, whatever DNS says."""
    host = host.lower().rstrip(".")
    return host in _LOOPBACK_NAMES or host.endswith(".localhost")


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (TCP), in resolver order. Raises ``OSError`` (gaierror)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return unique_addresses(str(info[4][0]) for info in infos)


def unique_addresses(raw: Iterable[str]) -> list[IPAddress]:
    """Parsed addresses of ``raw`` without repeats, in order."""
    seen: list[IPAddress] = []
    for text in raw:
        address = ipaddress.ip_address(text)
        if address not in seen:
            seen.append(address)
    return seen


_SAVE_RESOLVER = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="outbound-resolve")


def _resolve_for_save(host: str, port: int, seconds: float) -> list[IPAddress]:
    """``resolve`` bounded in time; [] when the name does not resolve (now) or DNS is slow."""
    future = _SAVE_RESOLVER.submit(resolve, host, port)
    try:
        return future.result(timeout=seconds)
    except (OSError, concurrent.futures.TimeoutError, UnicodeError, ValueError):
        return []


def allowed_addresses(url: str, addresses: Iterable[IPAddress], policy: OutboundPolicy) -> list[IPAddress]:
    """The addresses of ``addresses`` the policy allows, in order; ``OutboundRefused`` (naming the
    first refused one) when there were addresses and none is allowed. A name that resolves to a
    public and an internal address is only ever connected to at the public one."""
    allowed: list[IPAddress] = []
    first_refusal: tuple[IPAddress, str] | None = None
    for address in addresses:
        why = policy.refusal(address)
        if why is None:
            allowed.append(address)
        elif first_refusal is None:
            first_refusal = (address, why)
    if not allowed and first_refusal is not None:
        raise OutboundRefused(url, str(first_refusal[0]), first_refusal[1])
    return allowed


def check_url(url: str, *, policy: OutboundPolicy | None = None, resolve_names: bool = True,
              resolve_seconds: float = SAVE_RESOLVE_SECONDS) -> Target:
    """The save-time check of an outbound URL (upstream base URLs, webhooks, model listing).

    Refuses what ``parse_url`` refuses, an address literal the policy refuses, ``localhost`` names
    (unless loopback is allowed), and (``resolve_names``) a host name none of whose current
    addresses the policy allows. A name
    that does not resolve now is accepted: the connect-time check (``infra.outbound_http``) still
    applies to whatever it resolves to later. Raises ``OutboundRefused``; returns the ``Target``.
    """
    policy = policy or current_policy()
    target = parse_url(url)
    if target.literal is not None:
        allowed_addresses(url, [target.literal], policy)
    elif is_loopback_name(target.host):
        allowed_addresses(url, [IPv4Address("127.0.0.1"), IPv6Address("::1")], policy)
    elif resolve_names:
        allowed_addresses(url, _resolve_for_save(target.host, target.port, resolve_seconds), policy)
    return target
