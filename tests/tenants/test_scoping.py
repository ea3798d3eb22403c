"""The one door for membership scoping (``tenants.scoping``): who sees and manages which tenants, once a request."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tenants.models import Membership
from tenants.scoping import request_scope, scope_for_user
from tenants.selectors import NotFound
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

MISSING = 987654321
Login = Callable[[User], Client]


def test_it_scopes_tenants_to_the_users_memberships(admin_a: User, viewer_a: User, outsider_b: User,
                                                    superuser: User, world_a: TenantWorld,
                                                    world_b: TenantWorld) -> None:
    """Members see their tenants, superusers all, non-staff and inactive users none."""
    assert list(scope_for_user(admin_a).tenants()) == [world_a.tenant]
    assert list(scope_for_user(viewer_a).tenants()) == [world_a.tenant]
    assert list(scope_for_user(outsider_b).tenants()) == [world_b.tenant]
    assert set(scope_for_user(superuser).tenants()) == {world_a.tenant, world_b.tenant}
    assert scope_for_user(superuser).everything and scope_for_user(superuser).seen is None
    admin_a.is_staff = False
    assert list(scope_for_user(admin_a).tenants()) == [] and not scope_for_user(admin_a).sees()
    admin_a.is_staff, admin_a.is_active = True, False
    assert scope_for_user(admin_a).seen == frozenset()
    superuser.is_staff = False
    assert not scope_for_user(superuser).everything and scope_for_user(superuser).seen == frozenset()
    assert scope_for_user(AnonymousUser()).seen == frozenset()


def test_viewers_see_and_admins_manage(admin_a: User, viewer_a: User, world_a: TenantWorld,
                                       world_b: TenantWorld) -> None:
    """``admin`` manages its tenant, ``viewer`` only sees it; neither reaches tenant B."""
    admin, viewer = scope_for_user(admin_a), scope_for_user(viewer_a)
    a, b = world_a.tenant.pk, world_b.tenant.pk
    assert admin.seen == admin.managed == frozenset({a})
    assert viewer.seen == frozenset({a}) and viewer.managed == frozenset()
    assert admin.manages(a) and admin.manages() and not admin.manages(b) and not admin.sees(b)
    assert viewer.sees(a) and viewer.sees() and not viewer.manages(a) and not viewer.manages()
    assert list(viewer.tenants(managed=True)) == []
    assert list(admin.limit(Membership.objects.all())) == list(Membership.objects.filter(tenant_id=a))


@pytest.mark.parametrize("persona", ["admin_a", "viewer_a"])
def test_it_answers_another_tenant_like_a_missing_one(request: pytest.FixtureRequest, persona: str,
                                                      world_a: TenantWorld, world_b: TenantWorld) -> None:
    """``TenantScope.tenant`` raises the same NotFound for tenant B as for a tenant that does not exist."""
    scope = scope_for_user(request.getfixturevalue(persona))
    assert scope.tenant(world_a.tenant.pk) == world_a.tenant
    with pytest.raises(NotFound) as not_yours:
        scope.tenant(world_b.tenant.pk)
    with pytest.raises(NotFound) as missing:
        scope.tenant(MISSING)
    with pytest.raises(NotFound):
        scope.tenant("1 or 1=1")
    assert str(not_yours.value) == str(missing.value)


def test_a_request_reads_the_scope_once(admin_a: User) -> None:
    """``request_scope`` asks the database once per request and user, however often it is called."""
    request = RequestFactory().get("/")
    request.user = admin_a
    with CaptureQueriesContext(connection) as queries:
        first = request_scope(request)
        assert all(request_scope(request) is first for _ in range(5))
    assert len(queries) == 1


def _membership_queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, url
    return sum('"tenants_membership"' in q["sql"] for q in queries.captured_queries)


@pytest.mark.parametrize("url", ["admin:index", "admin:tenants_upstream_changelist", "admin:tenants_apikey_add",
                                 "admin:audit_dashboard", "admin:audit_proxyrequest_changelist",
                                 "admin:audit_report_add"])
def test_an_admin_page_does_one_scoping_query(login: Login, admin_a: User, url: str) -> None:
    """Every permission check, queryset and choice list of a page shares the request's one scope."""
    assert _membership_queries(login(admin_a), reverse(url)) == 1
