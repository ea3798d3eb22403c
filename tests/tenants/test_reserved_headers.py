"""Reserved header names (issue 24 item 1, ``infra.headers``): a tenant's extra headers may not name
toolrelay's own ``x-toolrelay-*``, a hop-by-hop or framing header, ``Host`` or a credential header.
Refused in the admin and the services (what the management commands call) with a clear message;
dropped at request time from rows stored before the rule, toolrelay's own headers set last.

The self-loop over real sockets is in tests/e2e/test_hops.py."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.urls import reverse

from infra import headers
from proxy.upstreams import hops
from proxy.upstreams.client import request_headers
from tenants import crypto
from tenants.models import Upstream, validate_extra_headers
from tenants.principal import UpstreamTarget
from tenants.services import upstream_upsert
from tests.conftest import TenantWorld
from tests.tenants.test_security_admin import _post, _staff_login, _upstream_form

RESERVED = ["x-toolrelay-hops", "X-Toolrelay-Anything", "Connection", "keep-alive", "Transfer-Encoding",
            "Content-Length", "TE", "Trailer", "Upgrade", "Proxy-Authorization", "proxy-connection", "Host",
            "Authorization", "X-API-Key"]


@pytest.mark.parametrize("name", RESERVED)
def test_reserved_names_are_refused_by_the_validation(name: str) -> None:
    with pytest.raises(ValidationError, match="is reserved"):
        validate_extra_headers({"X-Org": "fine", name: "v"})


@pytest.mark.parametrize("name", ["X-Org", "api-key", "OpenAI-Organization", "x-toolrelay", "Hostname", "tex"])
def test_ordinary_names_are_not_reserved(name: str) -> None:
    assert not headers.reserved(name)
    validate_extra_headers({name: "v"})


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["x-toolrelay-hops", "Transfer-Encoding", "Host", "Authorization"])
def test_the_services_refuse_reserved_names(world_a: TenantWorld, name: str) -> None:
    with pytest.raises(ValidationError, match="is reserved"):
        upstream_upsert(tenant=world_a.tenant, name="probe", base_url="https://api.example.test/v1",
                        extra_headers={name: "0"})
    assert not Upstream.objects.filter(name="probe").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["x-toolrelay-hops", "Content-Length", "Proxy-Authorization", "x-api-key"])
def test_the_admin_refuses_reserved_names_with_a_clear_message(admin_a: User, world_a: TenantWorld,
                                                               name: str) -> None:
    client = _staff_login(admin_a)
    form = _upstream_form(world_a, new_extra_headers=json.dumps({name: "0"}))
    response = _post(client, reverse("admin:tenants_upstream_add"), form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["new_extra_headers"]
    assert any("is reserved" in error for error in errors)
    assert not Upstream.objects.filter(name="probe").exists()


def _target(stored: dict[str, str], credential: str = "sk-upstream-1234") -> UpstreamTarget:
    return UpstreamTarget(upstream_id=1, name="u", base_url="http://upstream.test/v1", model="",
                          credential_encrypted=crypto.encrypt(credential),
                          extra_headers_encrypted=crypto.encrypt(json.dumps(stored)), connect_timeout=1,
                          first_byte_timeout=1, idle_timeout=1)


def test_reserved_names_of_an_old_row_are_dropped_and_toolrelays_own_headers_win() -> None:
    hops.enter(0)
    stored = {"x-toolrelay-hops": "0", "X-TOOLRELAY-HOPS": "0", "Host": "other.test", "Content-Length": "5",
              "Transfer-Encoding": "chunked", "Authorization": "Bearer tenant-chosen", "Accept": "x/y",
              "User-Agent": "spoof", "X-Org": "kept"}
    sent = request_headers(_target(stored), stream=True)
    names = [name.lower() for name in sent]
    assert len(names) == len(set(names)), "one header per name"
    assert sent[hops.HEADER] == "1"
    assert sent["authorization"] == "Bearer sk-upstream-1234"
    assert sent["accept"] == "text/event-stream" and sent["user-agent"].startswith("toolrelay/")
    assert not {"host", "content-length", "transfer-encoding"} & set(names)
    assert sent["x-org"] == "kept"
