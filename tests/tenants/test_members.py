"""People in a tenant: memberships with the ``member`` role, keys that belong to a member, what the
``Principal`` and the audit row carry of them (issue 19 item 5: the data model)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from audit import records, services
from audit.journal import Journal, read_lines
from audit.models import ProxyRequest
from tenants import last_good
from tenants.auth import api_key_authenticate, principal_for_key
from tenants.limits import Limits
from tenants.models import ApiKey, Membership
from tenants.scoping import scope_for_user
from tenants.services import api_key_create
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _member(world: TenantWorld, username: str = "dev-a", **fields: object) -> Membership:
    user = User.objects.create_user(username=username, password="pw")
    return Membership.objects.create(user=user, tenant=world.tenant, role=Membership.MEMBER, **fields)


def test_a_members_key_carries_the_member_into_its_principal(world_a: TenantWorld) -> None:
    """The principal of a member's key names the member, their user name, models and limits."""
    member = _member(world_a, allowed_models=["tenant-a-model", "glm-*"], daily_tokens=1000)
    key, raw = api_key_create(tenant=world_a.tenant, name="laptop")
    ApiKey.objects.filter(pk=key.pk).update(member=member)
    principal = principal_for_key(raw)
    assert principal is not None
    assert (principal.member_id, principal.member_username) == (member.pk, "dev-a")
    assert principal.member_models == ("tenant-a-model", "glm-*")
    assert principal.member_limits == Limits(daily_tokens=1000)
    assert principal.allows("tenant-a-model") and principal.allows("glm-4.6")
    assert not principal.allows("deepseek-chat")


def test_a_tenant_key_has_no_member_and_allows_every_model(world_a: TenantWorld) -> None:
    """A key without a member: no member fields, every model allowed."""
    principal = principal_for_key(world_a.raw_key)
    assert principal is not None
    assert principal.member_id is None and principal.member_username == "" and principal.member_models == ()
    assert principal.allows("anything-at-all")


def test_the_last_good_copy_keeps_the_member(world_a: TenantWorld) -> None:
    """What the proxy serves while the database is down still restricts the member's models."""
    member = _member(world_a, allowed_models=["glm-*"], rpm=3)
    key, raw = api_key_create(tenant=world_a.tenant, name="laptop")
    ApiKey.objects.filter(pk=key.pk).update(member=member)
    principal = principal_for_key(raw)
    again = last_good.loads(last_good.dumps(principal))
    assert again == principal
    assert not again.allows("tenant-a-model")


def test_deleting_a_membership_revokes_its_keys_and_keeps_them(world_a: TenantWorld) -> None:
    """The person leaves: their keys stay (the audit points at them), unlinked and refused."""
    member = _member(world_a)
    key, raw = api_key_create(tenant=world_a.tenant, name="laptop")
    ApiKey.objects.filter(pk=key.pk).update(member=member)
    assert api_key_authenticate(raw) is not None
    member.delete()
    key.refresh_from_db()
    assert key.member_id is None and key.revoked_at is not None
    assert api_key_authenticate(raw) is None
    world_a.api_key.refresh_from_db()
    assert world_a.api_key.revoked_at is None  # the tenant's own key is untouched


def test_a_deactivated_users_key_is_refused(world_a: TenantWorld) -> None:
    """A person's key stops with their account."""
    member = _member(world_a)
    key, raw = api_key_create(tenant=world_a.tenant, name="laptop")
    ApiKey.objects.filter(pk=key.pk).update(member=member)
    User.objects.filter(pk=member.user_id).update(is_active=False)
    assert api_key_authenticate(raw) is None


def test_the_member_role_does_not_open_the_admin(world_a: TenantWorld) -> None:
    """A staff user whose only membership is ``member`` sees no tenant in the admin or usage pages."""
    member = _member(world_a, "staff-dev")
    User.objects.filter(pk=member.user_id).update(is_staff=True)
    user = User.objects.get(pk=member.user_id)
    scope = scope_for_user(user)
    assert list(scope.tenants()) == [] and not scope.sees() and not scope.manages()
    assert scope.role(world_a.tenant.pk) == Membership.MEMBER


@pytest.mark.parametrize("value", ["glm-*", [1], [""], ["x" * 201], ["m"] * 101])
def test_allowed_models_must_be_a_short_list_of_names(world_a: TenantWorld, value: object) -> None:
    """Bad ``allowed_models`` is refused by ``clean`` (the admin and services call it)."""
    member = _member(world_a)
    member.allowed_models = value
    with pytest.raises(ValidationError):
        member.clean()


def test_member_limits_fit_the_tenant(world_a: TenantWorld) -> None:
    """A member limit above the tenant's is refused."""
    world_a.tenant.rpm = 10
    world_a.tenant.save()
    member = _member(world_a)
    member.rpm = 11
    with pytest.raises(ValidationError):
        member.clean()
    member.rpm = 10
    member.clean()


def test_a_key_cannot_belong_to_another_tenants_member(world_a: TenantWorld, world_b: TenantWorld) -> None:
    """``ApiKey.clean`` refuses a member of another tenant."""
    member_b = _member(world_b, "dev-b")
    key = world_a.api_key
    key.member = member_b
    with pytest.raises(ValidationError):
        key.clean()


def test_the_audit_row_keeps_the_member_and_their_name(world_a: TenantWorld, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Journal -> row: the member and the user name snapshot; a member deleted meanwhile leaves the name."""
    journal = Journal(tmp_path, max_bytes=1 << 30)
    monkeypatch.setattr(records, "_journal_append", journal.append)
    member = _member(world_a)
    gone = _member(world_a, "dev-gone")
    ids = []
    for who in (member, gone):
        record = records.RequestRecord(id=uuid.uuid4(), tenant_id=world_a.tenant.pk, api_key_id=world_a.api_key.pk,
                                       model="m", path="pass-through", member_id=who.pk,
                                       member_username=who.user.username)
        records.request_finished(request=record, result=records.RequestResult(outcome="clean", status=200,
                                                                              attempts=1))
        ids.append(record.id)
    gone.delete()
    services.journal_batch_write(services.Batch.of(line.record for line in read_lines(journal.path, 0)))
    first, second = (ProxyRequest.objects.get(id=i) for i in ids)
    assert (first.member_id, first.member_username) == (member.pk, "dev-a")
    assert (second.member_id, second.member_username) == (None, "dev-gone")


def test_a_tenant_admin_sets_what_a_member_may_do_but_not_their_role(login: Any, admin_a: User,
                                                                     world_a: TenantWorld,
                                                                     world_b: TenantWorld) -> None:
    """The membership's page: max keys, models and limits change; the role stays (read-only); B's is not there."""
    member = _member(world_a)
    member_b = _member(world_b, "dev-b")
    client = login(admin_a)
    url = f"/admin/tenants/membership/{member.pk}/change/"
    assert client.get(url).status_code == 200
    response = client.post(url, {"max_keys": "3", "allowed_models": '["glm-*"]', "role": "admin", "rpm": "7",
                                 "tpm": "", "concurrency": "", "daily_tokens": "", "monthly_tokens": ""})
    assert response.status_code == 302, response.content.decode()[:3000]
    member.refresh_from_db()
    assert (member.max_keys, member.allowed_models, member.rpm, member.role) == (3, ["glm-*"], 7, Membership.MEMBER)
    assert client.get(f"/admin/tenants/membership/{member_b.pk}/change/").status_code in (302, 404)
    bad = client.post(url, {"max_keys": "3", "allowed_models": '"glm-*"', "rpm": "", "tpm": "", "concurrency": "",
                            "daily_tokens": "", "monthly_tokens": ""})
    assert bad.status_code == 200 and "A list of up to 100 model names" in bad.content.decode()


def test_the_member_command_adds_shows_and_removes(world_a: TenantWorld) -> None:
    """``member add`` (creating the user), ``show --json``, ``remove`` (revoking the keys)."""
    import json
    from io import StringIO

    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError):
        call_command("member", "add", "--tenant", "tenant-a", "--user", "alice", stdout=StringIO())
    call_command("member", "add", "--tenant", "tenant-a", "--user", "alice", "--create-user", "--max-keys", "2",
                 "--models", "glm-*, deepseek-chat", stdout=StringIO())
    out = StringIO()
    call_command("member", "show", "--tenant", "tenant-a", "--json", stdout=out)
    assert json.loads(out.getvalue())["members"] == [{
        "user": "alice", "role": "member", "max_keys": 2, "allowed_models": ["glm-*", "deepseek-chat"],
        "limits": {"rpm": None, "tpm": None, "concurrency": None, "daily_tokens": None, "monthly_tokens": None,
                   "daily_usd": None, "weekly_usd": None, "monthly_usd": None, "money_soft_percent": None,
                   "daily_usd_soft_percent": None, "weekly_usd_soft_percent": None,
                   "monthly_usd_soft_percent": None}}]
    member = Membership.objects.get(user__username="alice")
    assert not member.user.has_usable_password()
    key, raw = api_key_create(tenant=world_a.tenant, name="k", member=member)
    call_command("member", "remove", "--tenant", "tenant-a", "--user", "alice", stdout=StringIO())
    assert api_key_authenticate(raw) is None
    with pytest.raises(CommandError):
        call_command("member", "add", "--tenant", "tenant-a", "--user", "alice", "--models", "x" * 300,
                     stdout=StringIO())
