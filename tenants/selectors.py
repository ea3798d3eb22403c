"""The one door for tenant-owned rows (STYLE.md rule 6).

Consumers authenticate with ``tenant_for_key`` (an API key -> an immutable ``TenantSnapshot`` that
resolves models without touching the database); admin views and services fetch tenant-owned rows
only through the ``*_for_tenant`` / ``*_for_user`` helpers, which raise the same ``NotFound`` for
"missing" and "someone else's".
"""

from __future__ import annotations

import fnmatch
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from proxy.guard.policy import GuardPolicy
from tenants.models import API_KEY_PREFIX, ApiKey, Membership, ModelRoute, Tenant, Upstream


class NotFound(Exception):
    """The row does not exist or belongs to another tenant (deliberately indistinguishable)."""


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """Where one attempt goes: the upstream (credential still encrypted) and the upstream model name.

    Timeouts in seconds.
    """

    upstream_id: int
    name: str
    base_url: str
    model: str
    credential_encrypted: str = field(repr=False)
    extra_headers_encrypted: str = field(repr=False)
    connect_timeout: float
    first_byte_timeout: float
    idle_timeout: float


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """A resolved model: ``targets[0]`` serves attempt 0, ``targets[k]`` retry k (the last repeats)."""

    public_model: str
    route_id: int | None
    targets: tuple[UpstreamTarget, ...]
    max_output_tokens: int | None
    policy: GuardPolicy

    def target(self, attempt: int) -> UpstreamTarget:
        """The target for 0-based ``attempt``: the primary, then fallbacks in order, then the last one again."""
        return self.targets[min(attempt, len(self.targets) - 1)]


@dataclass(frozen=True, slots=True)
class _RouteEntry:
    route_id: int
    public_name: str
    is_glob: bool
    upstream_model: str
    targets: tuple[tuple[Upstream, str], ...]
    max_output_tokens: int | None
    overrides: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TenantSnapshot:
    """What a request needs of its tenant, read once and cached briefly (``AUTH_CACHE_SECONDS``)."""

    tenant_id: int
    slug: str
    active: bool
    api_key_id: int
    routes: tuple[_RouteEntry, ...]
    default_upstream: Upstream | None
    tenant: Tenant

    def resolve(self, model: str) -> RoutePlan | None:
        """The plan for ``model``: an exact route, else the most specific matching glob (longest
        pattern), else the tenant's default upstream with the name unchanged, else None."""
        exact = [r for r in self.routes if not r.is_glob and r.public_name == model]
        globs = sorted((r for r in self.routes if r.is_glob and _glob(model, r.public_name)),
                       key=lambda r: -len(r.public_name))
        matches = exact or globs
        if matches:
            entry = matches[0]
            targets = tuple(_target(up, m or entry.upstream_model or model) for up, m in entry.targets if up.enabled)
            if targets:
                return RoutePlan(model, entry.route_id, targets, entry.max_output_tokens,
                                 self.tenant.policy(entry.overrides))
            return None
        if self.default_upstream is not None and self.default_upstream.enabled:
            return RoutePlan(model, None, (_target(self.default_upstream, model),), None, self.tenant.policy())
        return None

    def model_names(self) -> list[str]:
        """Public model names this tenant routes by exact name (a glob such as ``claude-*`` is no model id;
        names served only by the default upstream are not known here)."""
        return sorted(r.public_name for r in self.routes if not r.is_glob)


def _glob(model: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(model, pattern)


def _target(upstream: Upstream, model: str) -> UpstreamTarget:
    return UpstreamTarget(
        upstream_id=upstream.pk, name=upstream.name, base_url=upstream.base_url.rstrip("/"), model=model,
        credential_encrypted=upstream.credential_encrypted,
        extra_headers_encrypted=upstream.extra_headers_encrypted,
        connect_timeout=upstream.connect_timeout, first_byte_timeout=upstream.first_byte_timeout,
        idle_timeout=upstream.idle_timeout,
    )


def parse_api_key(raw: str) -> str | None:
    """The prefix of a well-formed ``tr-<prefix>-<secret>`` key, else None."""
    parts = raw.split("-", 2)
    if len(parts) != 3 or parts[0] != API_KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1]


def api_key_authenticate(raw: str) -> ApiKey | None:
    """The usable ApiKey for ``raw`` (looked up by prefix, compared in constant time), else None.

    Wrong secret, revoked and expired keys all give None.
    """
    prefix = parse_api_key(raw)
    if prefix is None:
        return None
    key = ApiKey.objects.select_related("tenant").filter(prefix=prefix).first()
    if key is None or not key.matches(raw) or not key.is_usable():
        return None
    return key


def _snapshot(key: ApiKey) -> TenantSnapshot:
    tenant = key.tenant
    routes = []
    for route in ModelRoute.objects.filter(tenant=tenant).select_related("upstream").prefetch_related(
            "fallbacks__upstream"):
        if route.upstream.tenant_id != tenant.pk:  # never another tenant's upstream (and credential)
            continue
        targets = ((route.upstream, route.upstream_model),
                   *((fb.upstream, fb.model or route.upstream_model) for fb in route.fallbacks.all()
                     if fb.upstream.tenant_id == tenant.pk))
        routes.append(_RouteEntry(route.pk, route.public_name, route.is_glob, route.upstream_model, targets,
                                  route.max_output_tokens, route.policy_overrides()))
    default = tenant.default_upstream if tenant.default_upstream_id else None
    if default is not None and default.tenant_id != tenant.pk:
        default = None
    return TenantSnapshot(tenant.pk, tenant.slug, tenant.active, key.pk, tuple(routes), default, tenant)


class _KeyCache:
    """A tiny TTL cache of snapshots keyed by the key's digest (the raw key is never kept).

    Refresh ahead: once an entry has lived half its lifetime, the next reader is told (once) to
    renew it in the background, so a key in steady use never waits for the database, while no entry
    is ever served past its expiry (the bound on how long a revoked key keeps working is unchanged).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, TenantSnapshot | None]] = {}
        self._refreshing: set[str] = set()

    def get(self, digest: str) -> tuple[bool, TenantSnapshot | None]:
        with self._lock:
            hit = self._entries.get(digest)
        if hit is None or hit[0] < time.monotonic():
            return False, None
        return True, hit[1]

    def claim_refresh(self, digest: str) -> bool:
        """True, for one caller, when ``digest``'s live entry is past half its lifetime."""
        with self._lock:
            hit = self._entries.get(digest)
            remaining = hit[0] - time.monotonic() if hit is not None else 0.0
            if not 0 < remaining <= settings.AUTH_CACHE_SECONDS / 2 or digest in self._refreshing:
                return False
            self._refreshing.add(digest)
            return True

    def put(self, digest: str, snapshot: TenantSnapshot | None) -> None:
        expires = time.monotonic() + settings.AUTH_CACHE_SECONDS
        with self._lock:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[digest] = (expires, snapshot)

    def release(self, digest: str) -> None:
        """A refresh of ``digest`` ended (renewed or failed): the next one may be claimed."""
        with self._lock:
            self._refreshing.discard(digest)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._refreshing.clear()


key_cache = _KeyCache()


def cached_tenant_for_key(raw: str) -> tuple[bool, TenantSnapshot | None, bool]:
    """``(True, snapshot_or_None, refresh)`` when ``raw`` is answered without the database (malformed, or
    in the cache), else ``(False, None, False)``: then call :func:`tenant_for_key` from a thread.

    ``refresh`` is True (for one caller) when the cached answer is past half its lifetime: the caller
    should run ``tenant_for_key(raw, refresh=True)`` in the background. Safe on the event loop (no
    ORM): the proxy consumers use it so that a key in use costs no thread hop and never waits behind
    the audit writes that share Channels' database thread.
    """
    if parse_api_key(raw) is None:
        return True, None, False
    digest = ApiKey.compute_digest(raw)
    found, snapshot = key_cache.get(digest)
    return found, snapshot, found and key_cache.claim_refresh(digest)


def tenant_for_key(raw: str, *, refresh: bool = False) -> TenantSnapshot | None:
    """Authenticate ``raw`` and return its tenant snapshot (cached for ``AUTH_CACHE_SECONDS``), else None.

    The cache bounds how long a revoked key or a changed route takes to apply on a running process.
    ``refresh=True`` reads the database even when cached and renews the entry (refresh ahead).
    """
    if parse_api_key(raw) is None:
        return None
    digest = ApiKey.compute_digest(raw)
    if not refresh:
        found, snapshot = key_cache.get(digest)
        if found:
            return snapshot
    try:
        key = api_key_authenticate(raw)
        snapshot = _snapshot(key) if key is not None else None
        if key is not None:
            from tenants.services import api_key_touch

            api_key_touch(key=key)
        key_cache.put(digest, snapshot)
    finally:
        if refresh:
            key_cache.release(digest)
    return snapshot


# ----- tenant-scoped reads for admin, services and tests -----

def tenants_for_user(user: Any) -> QuerySet[Tenant]:
    """Tenants ``user`` may see: all for superusers, their memberships' for staff, none otherwise."""
    if not getattr(user, "is_active", False) or not getattr(user, "is_staff", False):
        return Tenant.objects.none()
    if user.is_superuser:
        return Tenant.objects.all()
    return Tenant.objects.filter(memberships__user=user).distinct()


def tenant_for_user(user: Any, tenant_id: Any) -> Tenant:
    """The tenant ``tenant_id`` if ``user`` may see it; else ``NotFound``."""
    tenant = tenants_for_user(user).filter(pk=_pk(tenant_id)).first()
    if tenant is None:
        raise NotFound("tenant")
    return tenant


def role_for_user(user: Any, tenant: Tenant) -> str | None:
    """``admin`` / ``viewer`` for a member, ``admin`` for superusers, else None."""
    if getattr(user, "is_superuser", False):
        return Membership.ADMIN
    membership = Membership.objects.filter(user=user, tenant=tenant).first()
    return membership.role if membership else None


def upstreams_for_tenant(tenant: Tenant) -> QuerySet[Upstream]:
    return Upstream.objects.filter(tenant=tenant)


def upstream_for_tenant(tenant: Tenant, upstream_id: Any) -> Upstream:
    """The tenant's upstream ``upstream_id``; ``NotFound`` when missing or another tenant's."""
    upstream = upstreams_for_tenant(tenant).filter(pk=_pk(upstream_id)).first()
    if upstream is None:
        raise NotFound("upstream")
    return upstream


def routes_for_tenant(tenant: Tenant) -> QuerySet[ModelRoute]:
    return ModelRoute.objects.filter(tenant=tenant).select_related("upstream")


def route_for_tenant(tenant: Tenant, route_id: Any) -> ModelRoute:
    """The tenant's route ``route_id``; ``NotFound`` when missing or another tenant's."""
    route = routes_for_tenant(tenant).filter(pk=_pk(route_id)).first()
    if route is None:
        raise NotFound("route")
    return route


def api_keys_for_tenant(tenant: Tenant) -> QuerySet[ApiKey]:
    return ApiKey.objects.for_tenant(tenant)


def api_key_for_tenant(tenant: Tenant, key_id: Any) -> ApiKey:
    """The tenant's key ``key_id``; ``NotFound`` when missing or another tenant's."""
    key = api_keys_for_tenant(tenant).filter(pk=_pk(key_id)).first()
    if key is None:
        raise NotFound("api key")
    return key


def _pk(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1
