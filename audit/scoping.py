"""Who may see which audit rows: a thin, per-request cached layer over ``tenants_for_user``.

``tenants.selectors.tenants_for_user`` stays the one door; this module only caches its answer on
the request, because an admin page asks many times.
"""

from __future__ import annotations

from typing import cast

from django.db.models import QuerySet
from django.http import HttpRequest

from tenants.models import Membership, Tenant
from tenants.selectors import tenants_for_user


def visible_tenants(request: HttpRequest) -> QuerySet[Tenant]:
    """The tenants the user may see (all for superusers, memberships for staff, none otherwise)."""
    return tenants_for_user(request.user)


def visible_tenant_ids(request: HttpRequest) -> frozenset[int] | None:
    """Ids of the tenants the user may see, or None for "every tenant" (active staff superusers)."""
    if hasattr(request, "_audit_tenant_ids"):
        return cast("frozenset[int] | None", request._audit_tenant_ids)
    user = request.user
    ids: frozenset[int] | None
    if user.is_active and user.is_staff and user.is_superuser:
        ids = None
    else:
        ids = frozenset(visible_tenants(request).values_list("pk", flat=True))
    request._audit_tenant_ids = ids  # type: ignore[attr-defined]
    return ids


def can_view_audit(request: HttpRequest) -> bool:
    """Active staff who are superusers or members of at least one tenant."""
    user = request.user
    if not (user.is_active and user.is_staff):
        return False
    ids = visible_tenant_ids(request)
    return ids is None or bool(ids)


def managed_tenant_ids(request: HttpRequest) -> frozenset[int] | None:
    """Ids of the tenants the user may act for (``admin`` members), or None for every tenant
    (active staff superusers). Viewers only read: reports are made by admins."""
    if hasattr(request, "_audit_managed_ids"):
        return cast("frozenset[int] | None", request._audit_managed_ids)
    ids: frozenset[int] | None
    if visible_tenant_ids(request) is None:
        ids = None
    else:
        ids = frozenset(Membership.objects.filter(user_id=cast(int, request.user.pk), role=Membership.ADMIN,
                                                  tenant__in=visible_tenants(request))
                        .values_list("tenant_id", flat=True))
    request._audit_managed_ids = ids  # type: ignore[attr-defined]
    return ids


def can_manage_audit(request: HttpRequest) -> bool:
    """May the user request or rebuild reports: superusers and ``admin`` members of some tenant."""
    if not can_view_audit(request):
        return False
    ids = managed_tenant_ids(request)
    return ids is None or bool(ids)
