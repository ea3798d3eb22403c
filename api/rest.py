"""The management REST API (``/api/v1/``, django-ninja): keys, members, usage and budgets of one tenant.

Authenticated by an admin token (``Authorization: Bearer tra-…``, ``api.models.AdminToken``, created by
``manage.py apitoken --tenant T``): the token's tenant is the only one any call sees; a key or member of
another tenant is the same 404 as a missing one (rows through ``tenants.selectors``). The OpenAPI schema
is generated from these signatures (``/api/v1/openapi.json``; the docs page ``/api/v1/docs``).

Budgets: ``PUT /budgets/...`` stores token limits, money budgets (USD per day, week, month) and the money
budgets' soft threshold (``tenants.limits.HOLDER_NAMES``) through ``tenants.services.limits_set``. People:
``POST /members`` adds a new person as a ``member`` (account ``<username>@<tenant slug>``: a name taken in
another tenant is neither refused nor revealed) with what they may do and returns their invitation link
once, also e-mailed when an address is given (``tenants.services.member_invite``, ``invitation_mail``);
``POST /members/{username}/invite`` sends a new link and voids the old (``member_reinvite``);
``DELETE /members/{username}`` removes a member (keys revoked). ``{username}`` is the account name or the
person's handle in the tenant.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, NinjaAPI, Schema
from ninja.errors import HttpError
from ninja.security import HttpBearer

from api.models import AdminToken
from api.tokens import admin_token_authenticate
from audit.models import Finding, ProxyRequest
from audit.people import member_rows_of
from billing.spend import spend
from tenants.limits import HOLDER_NAMES
from tenants.models import ApiKey, Membership, Tenant
from tenants.selectors import (
    NotFound,
    api_key_for_tenant,
    api_keys_for_tenant,
    member_for_tenant,
    members_for_tenant,
)
from tenants.services import (
    Invited,
    api_key_create,
    api_key_revoke,
    invitation_mail,
    limits_set,
    member_invite,
    member_key_create,
    member_reinvite,
    member_remove,
    membership_save,
)

#: The longest usage period one call may ask for (days).
MAX_USAGE_DAYS = 400


class AdminTokenAuth(HttpBearer):
    """``Authorization: Bearer tra-<prefix>-<secret>`` -> the ``AdminToken`` (``request.auth``), else 401."""

    def authenticate(self, request: HttpRequest, token: str) -> AdminToken | None:
        return admin_token_authenticate(token)


api = NinjaAPI(title="toolrelay management API", version="1", auth=AdminTokenAuth(), urls_namespace="api-v1",
               description="Keys, members, usage and budgets of the token's tenant (docs/people.md).")


@api.exception_handler(NotFound)
def _not_found(request: HttpRequest, exc: NotFound) -> Any:
    return api.create_response(request, {"detail": f"no such {exc} in this tenant"}, status=404)


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> Any:
    return api.create_response(request, {"detail": "; ".join(exc.messages)[:2000]}, status=422)


def _tenant(request: HttpRequest) -> Tenant:
    token: AdminToken = request.auth  # type: ignore[attr-defined]
    return token.tenant


# ----- schemas -----

class LimitsSchema(Schema):
    """Token limits and money budgets (None: no limit; 0 blocks); docs/money.md."""

    rpm: int | None = Field(None, ge=0)
    tpm: int | None = Field(None, ge=0)
    concurrency: int | None = Field(None, ge=0)
    daily_tokens: int | None = Field(None, ge=0)
    monthly_tokens: int | None = Field(None, ge=0)
    daily_usd: float | None = Field(None, ge=0, le=10**9, description="USD per UTC day.")
    weekly_usd: float | None = Field(None, ge=0, le=10**9, description="USD per ISO week (from Monday, UTC).")
    monthly_usd: float | None = Field(None, ge=0, le=10**9, description="USD per UTC calendar month.")
    money_soft_percent: int | None = Field(
        None, ge=1, le=100, description="Percent of each money budget past which the tenant's alert webhooks "
                                        "fire, once per budget and period (null: 80).")
    daily_usd_soft_percent: int | None = Field(
        None, ge=1, le=100, description="The daily budget's own soft threshold (null: money_soft_percent).")
    weekly_usd_soft_percent: int | None = Field(
        None, ge=1, le=100, description="The weekly budget's own soft threshold (null: money_soft_percent).")
    monthly_usd_soft_percent: int | None = Field(
        None, ge=1, le=100, description="The monthly budget's own soft threshold (null: money_soft_percent).")


class KeyOut(Schema):
    """A key as it may be shown (never its secret)."""

    id: int
    key: str = Field(description="tr-<prefix>-… (the shown form)")
    name: str
    member: str | None = Field(None, description="User name of the person owning it; null: a tenant key.")
    status: str = Field(description="active, expired or revoked")
    created: datetime
    last_used: datetime | None
    expires: datetime | None
    limits: LimitsSchema


class KeyCreated(KeyOut):
    """A new key: ``secret`` is the whole key, returned once."""

    secret: str


class KeyIn(Schema):
    """A new key: for ``member`` (a user name: within their ``max_keys``) or the tenant (null)."""

    name: str = Field(min_length=1, max_length=100)
    member: str | None = Field(None, max_length=150)
    expires_days: int | None = Field(None, ge=1, le=3650)


class MemberOut(Schema):
    """A person of the tenant and what they may do."""

    id: int
    username: str
    role: str
    max_keys: int
    allowed_models: list[str] = Field(description="Names or globs; empty: every model.")
    limits: LimitsSchema
    keys: int = Field(description="Usable keys held now.")


class MemberNew(Schema):
    """A new person (a new account, role ``member``) and what they may do; ``limits`` within the tenant's."""

    username: str = Field(min_length=1, max_length=150,
                          description="The person's name in the tenant (letters, digits, . + - _); the account is "
                                      "<username>@<tenant slug>.")
    email: str = Field("", max_length=254, description="Where the invitation is e-mailed (empty: not sent).")
    max_keys: int = Field(5, ge=0, le=1000)
    allowed_models: list[str] = Field(default_factory=list, max_length=100,
                                      description="Names or globs of the models (routes) their keys may use.")
    limits: LimitsSchema | None = None


class MemberInvited(MemberOut):
    """The person invited: ``invite_url`` is where they set their password, returned this once (the newest
    link only works); ``emailed`` whether it was also e-mailed to them."""

    invite_url: str
    emailed: bool


class MemberIn(Schema):
    """What a tenant admin sets of a member (fields left out stay as they are)."""

    max_keys: int | None = Field(None, ge=0, le=1000)
    allowed_models: list[str] | None = Field(None, max_length=100)


class BudgetIn(LimitsSchema):
    """Limits to set: only the fields given change (null removes a limit)."""


class BudgetOut(Schema):
    """A holder's limits after the change."""

    holder: str = Field(description="tenant, key tr-<prefix> or member <username>")
    limits: LimitsSchema


class UsageRow(Schema):
    """One member's (or the tenant keys', ``member_id`` null) usage over the period (``audit.people``)."""

    member_id: int | None
    member: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    wasted_prompt_tokens: int
    wasted_completion_tokens: int
    #: Requests whose wasted usage is unknown (a failed attempt reported none): the wasted figures count only
    #: the others, so they are a lower bound when this is above 0 (``audit.display.wasted_usage_unknown``).
    wasted_unknown_requests: int
    wasted_seconds: float
    exhausted: int
    recovered: int
    loops_broken: int
    limits_hit: int
    incidents: int


class ModelSpend(Schema):
    """One model's cost over the period."""

    model: str
    requests: int
    cost_usd: float
    wasted_usd: float


class MemberSpend(Schema):
    """One member's cost over the period."""

    member: str
    requests: int
    cost_usd: float
    wasted_usd: float


class SpendOut(Schema):
    """What the period cost (``billing.spend``, as ``manage.py usage --json``): USD, unpriced requests apart."""

    requests: int
    cost_usd: float
    delivered_usd: float
    wasted_usd: float
    unpriced_requests: int
    estimated_requests: int
    by_model: list[ModelSpend]
    by_member: list[MemberSpend]


class UsageOut(Schema):
    """Usage of the tenant over ``[since, until)``: totals and ``by_member``; ``money`` what it cost."""

    tenant: str
    since: datetime
    until: datetime
    requests: int
    prompt_tokens: int
    completion_tokens: int
    wasted_completion_tokens: int
    wasted_unknown_requests: int
    by_member: list[UsageRow]
    money: SpendOut


# ----- keys -----

def _key_out(key: ApiKey) -> dict[str, Any]:
    status = "revoked" if key.revoked_at else "active" if key.is_usable() else "expired"
    return {"id": key.pk, "key": key.display, "name": key.name, "status": status, "created": key.created,
            "last_used": key.last_used, "expires": key.expires, "limits": key.limits().as_json(),
            "member": key.member.user.get_username() if key.member_id and key.member else None}


@api.get("/keys", response=list[KeyOut], tags=["keys"])
def keys_list(request: HttpRequest, member: str | None = None, revoked: bool = False) -> list[dict[str, Any]]:
    """The tenant's keys, newest first (``member``: only that person's; ``revoked``: include revoked keys)."""
    rows = api_keys_for_tenant(_tenant(request)).select_related("member__user")
    if member is not None:
        rows = rows.filter(member=member_for_tenant(_tenant(request), member))
    if not revoked:
        rows = rows.filter(revoked_at__isnull=True)
    return [_key_out(k) for k in rows[:1000]]


@api.post("/keys", response={201: KeyCreated}, tags=["keys"])
def keys_create(request: HttpRequest, body: KeyIn) -> dict[str, Any]:
    """A new key; ``secret`` in the answer is the whole key, shown this once. A member's key counts against
    their ``max_keys`` (422 at the limit) and serves only their ``allowed_models``."""
    tenant = _tenant(request)
    expires = timezone.now() + timedelta(days=body.expires_days) if body.expires_days else None
    if body.member is not None:
        key, raw = member_key_create(membership=member_for_tenant(tenant, body.member), name=body.name,
                                     expires=expires)
    else:
        key, raw = api_key_create(tenant=tenant, name=body.name.strip()[:100] or "api", expires=expires)
    return {**_key_out(key), "secret": raw}  # 201: the only response declared


@api.post("/keys/{key_id}/revoke", response=KeyOut, tags=["keys"])
def keys_revoke(request: HttpRequest, key_id: int) -> dict[str, Any]:
    """Revoke a key now (idempotent); every proxy process refuses it at once."""
    key = api_key_for_tenant(_tenant(request), key_id)
    return _key_out(api_key_revoke(key=key))


# ----- members -----

def _member_out(m: Membership) -> dict[str, Any]:
    return {"id": m.pk, "username": m.user.get_username(), "role": m.role, "max_keys": m.max_keys,
            "allowed_models": list(m.allowed_models or []), "limits": m.limits().as_json(),
            "keys": m.api_keys.active().count()}


@api.get("/members", response=list[MemberOut], tags=["members"])
def members_list(request: HttpRequest) -> list[dict[str, Any]]:
    """The tenant's people (memberships of every role)."""
    return [_member_out(m) for m in members_for_tenant(_tenant(request))[:1000]]


@api.patch("/members/{username}", response=MemberOut, tags=["members"])
def members_update(request: HttpRequest, username: str, body: MemberIn) -> dict[str, Any]:
    """Set how many keys a person may hold and which models their keys may use."""
    member = member_for_tenant(_tenant(request), username)
    if body.max_keys is not None:
        member.max_keys = body.max_keys
    if body.allowed_models is not None:
        member.allowed_models = body.allowed_models
    return _member_out(membership_save(membership=member))


def _invited(request: HttpRequest, invited: Invited) -> dict[str, Any]:
    url = request.build_absolute_uri(invited.invite_path)
    return {**_member_out(invited.membership), "invite_url": url,
            "emailed": invitation_mail(invited=invited, url=url)}


@api.post("/members", response={201: MemberInvited}, tags=["members"])
def members_invite(request: HttpRequest, body: MemberNew) -> dict[str, Any]:
    """Add a new person to the tenant (a new account ``<username>@<tenant slug>``, role ``member``: their own
    keys on ``/account/keys/``) with how many keys they may hold, which models their keys may use and their
    limits and budgets. ``invite_url`` (returned once, and e-mailed when ``email`` is given) is where they set
    a password. 422 for an invalid request, or a name this tenant already gave."""
    limits = body.limits.model_dump(exclude_none=True) if body.limits is not None else {}
    invited = member_invite(tenant=_tenant(request), username=body.username, email=body.email,
                            max_keys=body.max_keys, allowed_models=body.allowed_models, limits=limits)
    return _invited(request, invited)  # 201: the only response declared


@api.post("/members/{username}/invite", response=MemberInvited, tags=["members"])
def members_reinvite(request: HttpRequest, username: str) -> dict[str, Any]:
    """A new invitation link for a person who has not taken theirs (lost or expired): every older link stops
    working; returned once and e-mailed when their account has an address. 422 once they signed in or set a
    password (or the account is in use elsewhere)."""
    return _invited(request, member_reinvite(membership=member_for_tenant(_tenant(request), username)))


@api.delete("/members/{username}", response={204: None}, tags=["members"])
def members_remove(request: HttpRequest, username: str) -> None:
    """Remove a ``member`` from the tenant now: their keys are revoked (and stay listed for the audit); the
    account stays. Admins and viewers are a superuser's to remove (422)."""
    member = member_for_tenant(_tenant(request), username)
    if member.role != Membership.MEMBER:
        raise HttpError(422, "only people with the member role are removed here; ask a superuser")
    member_remove(membership=member)


# ----- usage -----

@api.get("/usage", response=UsageOut, tags=["usage"])
def usage(request: HttpRequest, since: datetime | None = None, until: datetime | None = None) -> dict[str, Any]:
    """Usage of the tenant over ``[since, until)`` (default: the last 30 days), by member."""
    tenant = _tenant(request)
    until = until or timezone.now()
    since = since or until - timedelta(days=30)
    if since.tzinfo is None or until.tzinfo is None:
        raise HttpError(422, "since and until need a UTC offset (e.g. 2026-01-01T00:00:00Z)")
    if not since < until or until - since > timedelta(days=MAX_USAGE_DAYS):
        raise HttpError(422, f"since must be before until, at most {MAX_USAGE_DAYS} days apart")
    requests = ProxyRequest.objects.filter(tenant=tenant, created__gte=since, created__lt=until)
    findings = Finding.objects.filter(tenant_id_copy=tenant.pk, request__created__gte=since,
                                      request__created__lt=until)
    rows = member_rows_of(requests, findings)
    money = spend(tenant, since=since, until=until)
    return {"tenant": tenant.slug, "since": since, "until": until, "by_member": rows, "money": money,
            **{name: sum(r[name] for r in rows) for name in ("requests", "prompt_tokens", "completion_tokens",
                                                              "wasted_completion_tokens", "wasted_unknown_requests")}}


# ----- budgets -----

def _budget_set(tenant: Tenant, body: BudgetIn, *, key: ApiKey | None = None,
                member: Membership | None = None) -> dict[str, Any]:
    given = body.model_dump(exclude_unset=True)
    values = {name: given[name] for name in HOLDER_NAMES if name in given}
    limits = limits_set(tenant=tenant, key=key, member=member, values=values)
    holder = f"key tr-{key.prefix}" if key else f"member {member.user.get_username()}" if member else "tenant"
    return {"holder": holder, "limits": limits.as_json()}


class BudgetsOut(Schema):
    """Every holder's limits: the tenant's, then each usable key's and each member's."""

    tenant: BudgetOut
    keys: list[BudgetOut]
    members: list[BudgetOut]


@api.get("/budgets", response=BudgetsOut, tags=["budgets"])
def budgets_show(request: HttpRequest) -> dict[str, Any]:
    """The limits of the tenant, of its keys not revoked and of its members."""
    tenant = _tenant(request)
    return {"tenant": {"holder": "tenant", "limits": tenant.limits().as_json()},
            "keys": [{"holder": f"key tr-{k.prefix}", "limits": k.limits().as_json()}
                     for k in api_keys_for_tenant(tenant).filter(revoked_at__isnull=True)[:1000]],
            "members": [{"holder": f"member {m.user.get_username()}", "limits": m.limits().as_json()}
                        for m in members_for_tenant(tenant)[:1000]]}


@api.put("/budgets/tenant", response=BudgetOut, tags=["budgets"])
def budgets_tenant(request: HttpRequest, body: BudgetIn) -> dict[str, Any]:
    """Set the tenant's limits (fields left out stay as they are; null removes one)."""
    return _budget_set(_tenant(request), body)


@api.put("/budgets/keys/{key_id}", response=BudgetOut, tags=["budgets"])
def budgets_key(request: HttpRequest, key_id: int, body: BudgetIn) -> dict[str, Any]:
    """Set one key's limits, within the tenant's."""
    tenant = _tenant(request)
    return _budget_set(tenant, body, key=api_key_for_tenant(tenant, key_id))


@api.put("/budgets/members/{username}", response=BudgetOut, tags=["budgets"])
def budgets_member(request: HttpRequest, username: str, body: BudgetIn) -> dict[str, Any]:
    """Set one person's limits (over all their keys), within the tenant's."""
    tenant = _tenant(request)
    return _budget_set(tenant, body, member=member_for_tenant(tenant, username))
