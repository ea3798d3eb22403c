"""The one door for tenant-owned rows (STYLE.md rule 6).

Admin views and services fetch tenant-owned rows only through the ``*_for_tenant`` / ``*_for_member``
helpers, which raise the same ``NotFound`` for "missing" and "someone else's"; which tenants a person
may see or manage is ``tenants.scoping``'s (``TenantScope``). The proxy path's door
is ``tenants.auth.authorize`` (an API key -> a frozen, ORM-free ``Principal``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from tenants.models import ApiKey, Membership, ModelRoute, Tenant, Upstream


class NotFound(Exception):
    """The row does not exist or belongs to another tenant (deliberately indistinguishable)."""


# ----- tenant-scoped reads for admin, services and tests -----

def upstreams_for_tenant(tenant: Tenant) -> QuerySet[Upstream]:
    return Upstream.objects.filter(tenant=tenant)


def upstream_for_tenant(tenant: Tenant, upstream_id: Any) -> Upstream:
    """The tenant's upstream ``upstream_id``; ``NotFound`` when missing or another tenant's."""
    upstream = upstreams_for_tenant(tenant).filter(pk=_pk(upstream_id)).first()
    if upstream is None:
        raise NotFound("upstream")
    return upstream


def pool_keys(upstream: Upstream) -> list[tuple[str, str, int, bool]]:
    """``(key id, masked hint, weight, enabled)`` of every key of ``upstream``'s credential pool, its own
    credential first (id ``"0"``, weight 1, when set)."""
    from tenants.models import UpstreamCredential

    own = [("0", upstream.credential_hint, 1, True)] if upstream.credential_encrypted else []
    rows = UpstreamCredential.objects.filter(upstream=upstream).order_by("pk")
    return own + [(str(r.pk), r.hint, r.weight, r.enabled) for r in rows]


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


# ----- a person's own memberships and keys (the self-service page, ``tenants.account``) -----

def memberships_for_user(user: Any) -> QuerySet[Membership]:
    """The memberships of an active ``user`` in active tenants (any role; superusers get only their own)."""
    if not getattr(user, "is_active", False) or not getattr(user, "pk", None):
        return Membership.objects.none()
    return (Membership.objects.filter(user_id=user.pk, tenant__active=True).select_related("tenant", "user")
            .order_by("tenant__name"))


def membership_for_user(user: Any, membership_id: Any) -> Membership:
    """``user``'s own membership ``membership_id``; ``NotFound`` when missing or someone else's."""
    membership = memberships_for_user(user).filter(pk=_pk(membership_id)).first()
    if membership is None:
        raise NotFound("membership")
    return membership


def members_for_tenant(tenant: Tenant) -> QuerySet[Membership]:
    """Every membership of ``tenant`` with its user."""
    return Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username")


def member_for_tenant(tenant: Tenant, username: str) -> Membership:
    """The membership of user ``username`` in ``tenant`` (an account name, or a person's handle in the tenant:
    ``alice`` for ``alice@<tenant slug>``, ``tenants.services.tenant_username``); ``NotFound`` when none (or
    another tenant's)."""
    name = str(username)[:150]
    members = members_for_tenant(tenant)
    membership = members.filter(user__username=name).first() \
        or members.filter(user__username=f"{name}@{tenant.slug}"[:150]).first()
    if membership is None:
        raise NotFound("member")
    return membership


def api_keys_for_member(membership: Membership) -> QuerySet[ApiKey]:
    """The keys of ``membership`` (within its own tenant only), newest first."""
    return ApiKey.objects.filter(tenant_id=membership.tenant_id, member=membership)


def api_key_for_member(membership: Membership, key_id: Any) -> ApiKey:
    """``membership``'s key ``key_id``; ``NotFound`` when missing or anyone else's."""
    key = api_keys_for_member(membership).filter(pk=_pk(key_id)).first()
    if key is None:
        raise NotFound("api key")
    return key


def _pk(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1
