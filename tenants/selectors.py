"""The one door for tenant-owned rows (STYLE.md rule 6).

Admin views and services fetch tenant-owned rows only through the ``*_for_tenant`` / ``*_for_user``
helpers, which raise the same ``NotFound`` for "missing" and "someone else's". The proxy path's door
is ``tenants.auth.authorize`` (an API key -> a frozen, ORM-free ``Principal``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from tenants.models import ApiKey, Membership, ModelRoute, Tenant, Upstream


class NotFound(Exception):
    """The row does not exist or belongs to another tenant (deliberately indistinguishable)."""


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
