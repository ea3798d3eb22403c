"""Learned upstream limits in the admin: shown beside the route's own cap, editable by the tenant's
admins (an edit wins over what processes learned before it), forgotten by an action, and invisible to
other tenants."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tenants.auth import principal_for_key
from tenants.models import UpstreamLearnedLimit
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

Login = Callable[[User], Client]


def _limit(world: TenantWorld, **fields: Any) -> UpstreamLearnedLimit:
    values: dict[str, Any] = {"upstream": world.upstream, "model": world.route.upstream_model,
                              "parameter": "max_tokens", "value": 8192, "detail": "deepseek: Invalid max_tokens value",
                              "learned_at": timezone.now() - timedelta(hours=1),
                              "expires_at": timezone.now() + timedelta(days=6), **fields}
    return UpstreamLearnedLimit.objects.create(**values)


def _change(limit: UpstreamLearnedLimit) -> str:
    return reverse("admin:tenants_upstreamlearnedlimit_change", args=[limit.pk])


def test_the_route_page_shows_the_learned_limit_next_to_its_cap(login: Login, viewer_a: User,
                                                                world_a: TenantWorld) -> None:
    limit = _limit(world_a)
    _limit(world_a, model="another-model", parameter="stream_options", value=None)
    html = login(viewer_a).get(reverse("admin:tenants_modelroute_change", args=[world_a.route.pk])).content.decode()
    cap, learned = html.index("field-max_output_tokens"), html.index("field-learned_limits")
    assert cap < learned, "beside the route's own cap"
    assert "max_tokens &lt;= 8192" in html and _change(limit) in html
    assert "another-model" not in html, "only the route's upstream model"


def test_the_upstream_page_lists_every_model_it_was_learned_for(login: Login, admin_a: User,
                                                                 world_a: TenantWorld) -> None:
    _limit(world_a)
    _limit(world_a, model="another-model", parameter="stream_options", value=None)
    html = login(admin_a).get(reverse("admin:tenants_upstream_change", args=[world_a.upstream.pk])).content.decode()
    assert "max_tokens &lt;= 8192" in html and "another-model" in html and "stream_options left out" in html


def test_a_tenant_admin_raises_a_limit_and_the_next_principal_carries_it(login: Login, admin_a: User,
                                                                        world_a: TenantWorld) -> None:
    limit = _limit(world_a)
    expires = (timezone.now() + timedelta(days=3)).replace(microsecond=0)
    response = login(admin_a).post(_change(limit), {"value": "16000", "expires_at_0": expires.strftime("%Y-%m-%d"),
                                                    "expires_at_1": expires.strftime("%H:%M:%S")})
    assert response.status_code == 302, response.content.decode()[:2000]
    limit.refresh_from_db()
    assert limit.value == 16000 and limit.learned_at > timezone.now() - timedelta(minutes=1), "stamped: it wins"
    principal = principal_for_key(world_a.raw_key, refresh=True)
    assert principal is not None and principal.default_target is not None
    assert [(f.parameter, f.limit) for f in principal.default_target.learned] == [("max_tokens", 16000)]


def test_forgetting_expires_the_limit_now(login: Login, admin_a: User, world_a: TenantWorld) -> None:
    limit = _limit(world_a)
    changelist = reverse("admin:tenants_upstreamlearnedlimit_changelist")
    login(admin_a).post(changelist, {"action": "forget", "_selected_action": [limit.pk]})
    limit.refresh_from_db()
    assert not limit.is_live() and limit.learned_at > timezone.now() - timedelta(minutes=1)


def test_a_viewer_sees_but_cannot_change(login: Login, viewer_a: User, world_a: TenantWorld) -> None:
    limit = _limit(world_a)
    client = login(viewer_a)
    assert client.get(_change(limit)).status_code == 200
    client.post(_change(limit), {"value": "1"})
    limit.refresh_from_db()
    assert limit.value == 8192


def test_another_tenants_limits_look_missing(login: Login, outsider_b: User, world_a: TenantWorld,
                                            world_b: TenantWorld) -> None:
    limit = _limit(world_a)
    client = login(outsider_b)
    listing = client.get(reverse("admin:tenants_upstreamlearnedlimit_changelist")).content.decode()
    assert world_a.upstream.name not in listing
    assert client.get(_change(limit)).status_code == client.get(
        reverse("admin:tenants_upstreamlearnedlimit_change", args=[987654321])).status_code
    client.post(reverse("admin:tenants_upstreamlearnedlimit_changelist"),
                {"action": "forget", "_selected_action": [limit.pk]})
    limit.refresh_from_db()
    assert limit.is_live()
