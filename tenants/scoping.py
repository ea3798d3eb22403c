"""Which tenants a person may see and manage: the one door for membership scoping (issue 26 item 9).

Every admin page, audit view, the live feed and the API's admin compute "whose rows" here and nowhere
else (``tests/test_architecture.py`` checks that no other module filters memberships by user):

- an active staff **superuser** sees and manages every tenant (``TenantScope.everything``);
- other **active staff** see the tenants where they are an ``admin`` or ``viewer`` member
  (``Membership.STAFF_ROLES``) and manage those where they are ``admin``; a ``member`` role opens nothing
  here (a member reaches only their own keys, ``/account/``, through ``tenants.selectors``);
- anyone else (inactive, not staff, anonymous) sees nothing.

``scope_for_user(user)`` reads the user's memberships in one query (none for superusers and for users who
see nothing); ``request_scope(request)`` does it once per request and user (admin pages ask many times).
The live feed calls ``scope_for_user`` again at every re-check, so lost memberships take effect then.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from tenants.models import Membership, Tenant
from tenants.selectors import NotFound

_M = TypeVar("_M", bound=models.Model)

#: The request attribute holding ``(user pk, TenantScope)`` for the rest of the request.
_CACHE = "_tenant_scope"


@dataclass(frozen=True)
class TenantScope:
    """One user's reach over tenants. ``everything``: every tenant, seen and managed (active staff
    superusers). Else ``roles`` maps tenant id -> the user's role there (``admin`` / ``viewer`` /
    ``member``; empty for users who see nothing)."""

    everything: bool = False
    roles: Mapping[int, str] = field(default_factory=dict)

    @property
    def seen(self) -> frozenset[int] | None:
        """Ids of the tenants the user sees (``admin`` or ``viewer``), or None for every tenant."""
        if self.everything:
            return None
        return frozenset(pk for pk, role in self.roles.items() if role in Membership.STAFF_ROLES)

    @property
    def managed(self) -> frozenset[int] | None:
        """Ids of the tenants the user may change (``admin``), or None for every tenant."""
        if self.everything:
            return None
        return frozenset(pk for pk, role in self.roles.items() if role == Membership.ADMIN)

    def sees(self, tenant_id: int | None = None) -> bool:
        """May the user see rows of ``tenant_id`` (None: of some tenant)?"""
        return self._covers(self.seen, tenant_id)

    def manages(self, tenant_id: int | None = None) -> bool:
        """May the user change rows of ``tenant_id`` (None: of some tenant)?"""
        return self._covers(self.managed, tenant_id)

    def role(self, tenant_id: int) -> str | None:
        """The user's role in ``tenant_id`` (``admin`` for ``everything``), None when not a member."""
        return Membership.ADMIN if self.everything else self.roles.get(tenant_id)

    def tenants(self, *, managed: bool = False) -> QuerySet[Tenant]:
        """The tenants seen (``managed``: those the user may change), by name."""
        return self.limit(Tenant.objects.all(), "pk", managed=managed)

    def tenant(self, tenant_id: Any, *, managed: bool = False) -> Tenant:
        """The tenant ``tenant_id`` if the user sees (or manages) it; else ``NotFound``, the same for a
        tenant that does not exist and one that is someone else's. Non-numeric ids are missing ones."""
        try:
            pk = int(tenant_id)
        except (TypeError, ValueError):
            pk = -1
        tenant = self.tenants(managed=managed).filter(pk=pk).first()
        if tenant is None:
            raise NotFound("tenant")
        return tenant

    def limit(self, rows: QuerySet[_M], path: str = "tenant", *, managed: bool = False) -> QuerySet[_M]:
        """``rows`` whose tenant (reached by the lookup ``path``, e.g. ``tenant_id_copy``,
        ``upstream__tenant``) the user sees (``managed``: may change); ``rows`` unchanged for ``everything``."""
        ids = self.managed if managed else self.seen
        return rows if ids is None else rows.filter(**{f"{path}__in": sorted(ids)})

    @staticmethod
    def _covers(ids: frozenset[int] | None, tenant_id: int | None) -> bool:
        if ids is None:
            return True
        return bool(ids) if tenant_id is None else tenant_id in ids


NOTHING = TenantScope()


def scope_for_user(user: Any) -> TenantScope:
    """``user``'s scope, read now (one query for staff who are not superusers, none otherwise)."""
    if not getattr(user, "is_active", False) or not getattr(user, "is_staff", False) or not getattr(user, "pk", None):
        return NOTHING
    if getattr(user, "is_superuser", False):
        return TenantScope(everything=True)
    rows = Membership.objects.filter(user_id=user.pk).values_list("tenant_id", "role")
    return TenantScope(roles=dict(rows))


def request_scope(request: HttpRequest) -> TenantScope:
    """The scope of ``request.user``, read once per request (again if the request's user changes)."""
    user = getattr(request, "user", None)
    key = getattr(user, "pk", None)
    cached = getattr(request, _CACHE, None)
    if cached is not None and cached[0] == key:
        return cached[1]  # type: ignore[no-any-return]
    scope = scope_for_user(user)
    setattr(request, _CACHE, (key, scope))
    return scope
