"""Writes to tenant-owned rows: keyword-only, typed, named ``<entity>_<action>`` (STYLE.md rule 7)."""

from __future__ import annotations

import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from tenants import crypto, revocation
from tenants.limits import HOLDER_NAMES, MAX_USD, MONEY_NAMES, SOFT_NAMES, Limits
from tenants.models import (
    API_KEY_PREFIX,
    ApiKey,
    Membership,
    ModelRoute,
    RouteFallback,
    Tenant,
    Upstream,
    UpstreamCredential,
    UpstreamLearnedLimit,
    validate_extra_headers,
    validate_header_value,
)

_PREFIX_ALPHABET = string.ascii_lowercase + string.digits


def new_raw_api_key() -> tuple[str, str]:
    """A fresh ``(prefix, raw_key)``: ``tr-<12 lowercase alphanumerics>-<43 urlsafe chars>``."""
    prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(12))
    return prefix, f"{API_KEY_PREFIX}-{prefix}-{secrets.token_urlsafe(32)}"


def api_key_create(*, tenant: Tenant, name: str, expires: datetime | None = None,
                   member: Membership | None = None) -> tuple[ApiKey, str]:
    """Create a key for ``tenant`` (``member``'s when given: it must be a membership of ``tenant``); return
    the row and the raw key (shown once, never stored). ``member_key_create`` also checks the member's
    ``max_keys``."""
    if member is not None and member.tenant_id != tenant.pk:
        raise ValidationError("the member belongs to another tenant")
    prefix, raw = new_raw_api_key()
    key = ApiKey.objects.create(tenant=tenant, name=name[:100], prefix=prefix, digest=ApiKey.compute_digest(raw),
                                expires=expires, member=member)
    return key, raw


class KeyQuotaReached(ValidationError):
    """The member already holds ``Membership.max_keys`` usable keys."""


def member_key_create(*, membership: Membership, name: str, expires: datetime | None = None) -> tuple[ApiKey, str]:
    """A new key of ``membership`` (a person's own), within their ``max_keys`` usable keys; the membership row
    is locked meanwhile, so two requests at once cannot both pass the count. ``KeyQuotaReached`` at the
    limit; ``ValidationError`` for an empty name. Returns the row and the raw key (shown once)."""
    name = name.strip()[:100]
    if not name:
        raise ValidationError("a key needs a name")
    with transaction.atomic():
        locked = Membership.objects.select_for_update().select_related("tenant").get(pk=membership.pk)
        held = ApiKey.objects.filter(member=locked).active().count()
        if held >= locked.max_keys:
            raise KeyQuotaReached(f"you hold {held} usable key(s), the most your tenant allows you "
                                  f"({locked.max_keys}); revoke one first")
        return api_key_create(tenant=locked.tenant, name=name, expires=expires, member=locked)


def membership_save(*, membership: Membership) -> Membership:
    """Validate (``Membership.clean``) and save an edited membership; running processes see its keys' new
    models and limits at once (``tenants.revocation``). ``ValidationError`` when invalid."""
    membership.full_clean()
    with transaction.atomic():
        membership.save()
        revocation.tenant_changed(membership.tenant_id)
    return membership


@dataclass(frozen=True, slots=True)
class Invited:
    """A person a tenant admin added (or invited again): the membership, and the path
    (``/account/invite/<uid>/<token>/``) on which they set their password, valid ``PASSWORD_RESET_TIMEOUT``
    seconds, once, and only while it is the newest invitation (``member_reinvite`` voids the older ones)."""

    membership: Membership
    invite_path: str


#: Between the person's name in their tenant and the tenant's slug in the account name (``alice@acme``).
HANDLE_SEPARATOR = "@"


def member_invite(*, tenant: Tenant, username: str, email: str = "", max_keys: int = 5,
                  allowed_models: list[str] | None = None,
                  limits: Mapping[str, int | float | Decimal | None] | None = None) -> Invited:
    """Add a new person to ``tenant`` as a tenant admin may: a new account (no usable password; they set one
    on the invite path, or sign in by single sign-on) with the ``member`` role (their own keys only, no admin
    pages), at most ``max_keys`` usable keys, serving ``allowed_models`` (names or globs; empty: every model),
    with ``limits`` (names of ``HOLDER_NAMES``, within the tenant's).

    The account is named in the tenant's own namespace: ``username`` is the person's handle (letters,
    digits and ``.+-_``; a trailing ``@<tenant slug>`` is accepted) and the account ``<handle>@<tenant
    slug>`` (``tenant_username``), as GitHub's managed users are ``handle_shortcode``. So a name taken in
    another tenant neither fails nor tells this tenant's admin it exists; a ``ValidationError`` says "taken"
    only for a name of this tenant's own namespace. A tenant admin cannot take an existing account
    (superusers add existing accounts, ``manage.py member add``). An invalid handle or e-mail, bad models and
    limits above the tenant's are ``ValidationError`` too. All or nothing."""
    from django.contrib.auth import get_user_model
    from django.core.validators import validate_email

    users = get_user_model()
    username = _new_username(tenant_username(tenant, username))
    if email:
        validate_email(email)
    with transaction.atomic():
        user = users._default_manager.create_user(username=username, email=email)
        user.set_unusable_password()
        user.save(update_fields=["password"])
        membership = Membership(user=user, tenant=tenant, role=Membership.MEMBER, max_keys=max_keys,
                                allowed_models=list(allowed_models or []))
        membership.full_clean()
        membership.save()
        if limits:
            limits_set(tenant=tenant, member=membership, values=limits)
        revocation.tenant_changed(tenant.pk)
    return Invited(membership, _invite_path(user))


def tenant_username(tenant: Tenant, handle: str) -> str:
    """The account name of ``handle`` in ``tenant``: ``<handle>@<tenant slug>`` (a handle that already ends
    in ``@<tenant slug>`` as it is). ``ValidationError`` for an empty handle, one with another ``@``, or an
    account name past 150 characters."""
    handle = str(handle).strip()
    suffix = f"{HANDLE_SEPARATOR}{tenant.slug}"
    if handle.lower().endswith(suffix.lower()):
        handle = handle[:-len(suffix)]
    if not handle or HANDLE_SEPARATOR in handle:
        raise ValidationError({"username": "A person's name here is letters, digits and . + - _ (toolrelay names "
                                           f"the account <name>{suffix})."})
    if len(handle) + len(suffix) > 150:
        raise ValidationError({"username": f"A person's name here has at most {150 - len(suffix)} characters."})
    return f"{handle}{suffix}"


def _invite_path(user: Any) -> str:
    """``/account/invite/<uid>/<token>/`` for ``user`` (Django's password-reset token of its state now)."""
    from django.contrib.auth.tokens import default_token_generator
    from django.urls import reverse
    from django.utils.encoding import force_bytes
    from django.utils.http import urlsafe_base64_encode

    token = default_token_generator.make_token(user)
    return reverse("account:invite", args=[urlsafe_base64_encode(force_bytes(user.pk)), token])


class InvitationAccepted(ValidationError):
    """The person already took their invitation (signed in or set a password), or the account is not only
    this tenant's: a new invitation would let the tenant admin set the password of an account in use."""


def member_reinvite(*, membership: Membership) -> Invited:
    """A new invitation for a person whose invitation is still open (lost, expired or never sent): a new
    one-time link, and every older link of theirs stops working (the account's unusable password is drawn
    again; Django's token hashes it). Only for an account that was never used: no usable password, never
    signed in, no staff rights, a member of this one tenant; else ``InvitationAccepted`` (the person signs
    in as they do, or a superuser resets them)."""
    user = membership.user
    with transaction.atomic():
        user = type(user)._default_manager.select_for_update().get(pk=user.pk)
        others = Membership.objects.filter(user=user).exclude(tenant_id=membership.tenant_id).exists()
        if membership.role != Membership.MEMBER:
            raise InvitationAccepted("invitations are for people with the member role; a superuser manages others")
        if user.has_usable_password() or user.last_login is not None or user.is_staff or user.is_superuser \
                or others or not user.is_active:
            raise InvitationAccepted(f"{user.get_username()} has already taken their invitation (or the account "
                                     "is in use elsewhere): they sign in as they do; a superuser can reset them")
        user.set_unusable_password()
        user.save(update_fields=["password"])
    membership.user = user
    return Invited(membership, _invite_path(user))


def invitation_mail(*, invited: Invited, url: str) -> bool:
    """E-mail ``url`` (the absolute invitation link) to the invited person through Django's mail framework
    (``EMAIL_BACKEND``; the console in the embedded setup), when their account has an e-mail address.
    True when sent; False without an address or when sending fails (logged: the admin still has the link)."""
    import logging

    from django.core.mail import send_mail

    user = invited.membership.user
    address = str(getattr(user, "email", "") or "")
    if not address:
        return False
    hours = settings.PASSWORD_RESET_TIMEOUT // 3600
    tenant = invited.membership.tenant
    body = (f"You have been added to {tenant.name} on toolrelay.\n\n"
            f"Choose your password here (the link works once, for {hours} hours):\n{url}\n\n"
            f"Then sign in at {settings.SITE_URL}/account/login/ as {user.get_username()} and create your own "
            f"API keys.\n")
    try:
        send_mail(f"Your toolrelay invitation ({tenant.name})", body, None, [address])
    except Exception:  # noqa: BLE001 - SMTP down or refused: the link is still shown to the admin
        logging.getLogger(__name__).warning("invitation e-mail for %s not sent", user.get_username(), exc_info=True)
        return False
    return True


def _new_username(username: str) -> str:
    """``username`` stripped, when it is a valid user name no account has (case-insensitively); else
    ``ValidationError``."""
    from django.contrib.auth import get_user_model

    users = get_user_model()
    username = username.strip()
    if not username or len(username) > 150:
        raise ValidationError({"username": "A user name has 1 to 150 characters."})
    users.username_validator(username)
    if users._default_manager.filter(username__iexact=username).exists():
        raise ValidationError({"username": f"{username} is taken in this tenant; choose another name."})
    return username


def member_remove(*, membership: Membership) -> None:
    """Remove a person from their tenant: the membership is deleted and their keys revoked at once
    (``tenants.models.revoke_member_keys``); the account itself stays (it may belong to other tenants)."""
    with transaction.atomic():
        tenant_id = membership.tenant_id
        membership.delete()
        revocation.tenant_changed(tenant_id)


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke ``key`` now (idempotent). Every running process is told at once (``tenants.revocation``:
    Redis pub/sub when ``REDIS_URL`` is set); without the broadcast they refuse it within
    ``AUTH_CACHE_SECONDS``."""
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    revocation.key_revoked(key.digest)
    return key


def limits_set(*, tenant: Tenant, key: ApiKey | None = None, member: Membership | None = None,
               values: Mapping[str, int | float | Decimal | None]) -> Limits:
    """Set some of the limits of ``tenant`` (``key`` and ``member`` None), of its ``key`` or of its ``member``
    (a membership: the person's limits over all their keys); return the holder's limits.

    ``values`` maps names of ``HOLDER_NAMES`` to a whole number (0 blocks) or, for ``MONEY_NAMES``, an amount
    in USD, or for ``money_soft_percent`` the soft threshold of the holder's money budgets (a whole percent,
    1-100), for ``daily_usd_soft_percent`` ... ``monthly_usd_soft_percent`` one budget's own; None removes it;
    names not given are left as they are. ``ValidationError`` for an unknown name, a negative number, a percent
    outside 1-100, or a key's or member's limit above its tenant's. Running processes see the change at once
    (``tenants.revocation``).
    """
    unknown = sorted(set(values) - set(HOLDER_NAMES))
    if unknown:
        raise ValidationError(f"unknown limit(s): {', '.join(unknown)}")
    for soft in (values.get(n) for n in SOFT_NAMES):
        if soft is not None and (not isinstance(soft, int) or isinstance(soft, bool) or not 1 <= soft <= 100):
            raise ValidationError("a soft threshold is a whole percent from 1 to 100, or none")
    if any(v is not None and (v < 0 or (n in MONEY_NAMES and v > MAX_USD)) for n, v in values.items()):
        raise ValidationError(f"a limit is >= 0 (0 blocks; USD at most {MAX_USD:,}) or none")
    row: Tenant | ApiKey | Membership = key if key is not None else member if member is not None else tenant
    if key is not None and key.tenant_id != tenant.pk:
        raise ValidationError("no such key in this tenant")
    if member is not None and (key is not None or member.tenant_id != tenant.pk):
        raise ValidationError("no such member in this tenant")
    for name, value in values.items():
        setattr(row, name, Decimal(str(value)).quantize(Decimal("1e-6")) if name in MONEY_NAMES and value is not None
                else value)
    if isinstance(row, ApiKey | Membership):
        row.clean()
    with transaction.atomic():
        row.save(update_fields=list(values) or None)
        revocation.tenant_changed(tenant.pk)
    return row.limits()


def api_key_touch(*, key: ApiKey) -> None:
    """Record use of ``key`` at most once per ``API_KEY_TOUCH_SECONDS`` (one UPDATE, no read-modify-write)."""
    now = timezone.now()
    if key.last_used is None or now - key.last_used > timedelta(seconds=settings.API_KEY_TOUCH_SECONDS):
        ApiKey.objects.filter(pk=key.pk).update(last_used=now)
        key.last_used = now


def learned_limit_save(*, limit: UpstreamLearnedLimit) -> UpstreamLearnedLimit:
    """Save an operator's edit of a learned limit, stamped now so it wins over what proxy processes
    learned before it; with ``REDIS_URL`` it reaches every process within ``UPSTREAM_LEARNED_SYNC_SECONDS``,
    else with their next key lookup (``AUTH_CACHE_SECONDS``)."""
    from tenants.learned import publish_now

    limit.learned_at = timezone.now()
    limit.save()
    if settings.REDIS_URL:
        publish_now(limit.fact(), settings.REDIS_URL)
    return limit


def learned_limit_forget(*, limit: UpstreamLearnedLimit) -> UpstreamLearnedLimit:
    """Expire a learned limit now: the next request sends the parameter as the client asked (and learns it
    again if the upstream still refuses it)."""
    limit.expires_at = timezone.now()
    return learned_limit_save(limit=limit)


def tenant_ensure(*, name: str) -> tuple[Tenant, bool]:
    """The tenant called ``name`` (slug derived), created if missing; returns ``(tenant, created)``."""
    tenant = Tenant.objects.filter(name=name).first()
    if tenant is not None:
        return tenant, False
    slug = slugify(name) or "tenant"
    base, n = slug, 1
    while Tenant.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return Tenant.objects.create(name=name, slug=slug), True


def upstream_upsert(*, tenant: Tenant, name: str, base_url: str, credential: str | None = None,
                    extra_headers: dict[str, str] | None = None) -> Upstream:
    """Create or update the tenant's upstream ``name``; ``credential`` None keeps the stored one.

    Raises ``ValidationError`` when the base URL fails the outbound address policy (an internal
    address, ``user:pass@``) or a secret cannot be a header value (CR, LF, NUL, surrounding spaces).
    """
    if credential:
        validate_header_value(credential, what="The credential")
    if extra_headers:
        validate_extra_headers(extra_headers)
    upstream = Upstream.objects.filter(tenant=tenant, name=name).first() or Upstream(tenant=tenant, name=name)
    upstream.base_url = base_url.rstrip("/")
    if credential is not None:
        upstream.set_credential(credential)
    if extra_headers is not None:
        upstream.set_extra_headers(extra_headers)
    upstream.full_clean()
    upstream.save()
    return upstream


def upstream_key_add(*, upstream: Upstream, raw: str, weight: int | None = None) -> tuple[str, bool]:
    """Add ``raw`` to ``upstream``'s credential pool, once: ``(key id, added)``. A key already in the pool
    (the upstream's own credential, id ``"0"``, or a pool row) is not added again; ``weight`` (>= 1)
    updates a pool row's. An upstream without its own credential takes the first key as it (id ``"0"``).
    Raises ``ValidationError`` for a key that cannot be a header value, or a weight below 1."""
    validate_header_value(raw, what="The key")
    if weight is not None and weight < 1:
        raise ValidationError("A key's weight is at least 1.")
    with transaction.atomic():
        upstream = Upstream.objects.select_for_update().get(pk=upstream.pk)
        try:
            own = upstream.credential()
        except crypto.CredentialError:
            own = None
        if own == raw:
            return "0", False
        if not upstream.credential_encrypted and (weight is None or weight == 1):
            upstream.set_credential(raw)
            upstream.save(update_fields=["credential_encrypted", "credential_hint"])
            return "0", True
        row = UpstreamCredential.objects.filter(upstream=upstream,
                                                fingerprint=UpstreamCredential.fingerprint_of(raw)).first()
        if row is not None:
            if weight is not None and row.weight != weight:
                row.weight = weight
                row.save(update_fields=["weight"])
            return row.key_id, False
        row = UpstreamCredential(upstream=upstream, weight=weight or 1)
        row.set_secret(raw)
        row.save()
        return row.key_id, True


def route_upsert(*, tenant: Tenant, public_name: str, upstream: Upstream, upstream_model: str = "",
                 max_output_tokens: int | None = None) -> ModelRoute:
    """Create or update the tenant's route for ``public_name``."""
    if upstream.tenant_id != tenant.pk:
        raise ValueError("the upstream belongs to another tenant")
    route, _ = ModelRoute.objects.update_or_create(
        tenant=tenant, public_name=public_name,
        defaults={"upstream": upstream, "upstream_model": upstream_model, "max_output_tokens": max_output_tokens},
    )
    return route


def route_set(*, tenant: Tenant, public_name: str, targets: list[tuple[Upstream, str]], prefer: str = "order",
              retry_target: str = "", continue_text: bool | None = None) -> ModelRoute:
    """Set the tenant's route ``public_name`` (an exact name or a glob) to ``targets`` in order (``(upstream,
    upstream model or '' for the client's)``: the first is the route's upstream, the others its fallbacks,
    replaced as a whole), with ``prefer`` (``order`` | ``quality``), ``retry_target`` (``''`` | ``next`` |
    ``same``) and ``continue_text`` (cut text streams continued; None: as it was, off for a new route).
    Idempotent. Raises ``ValidationError`` for no target, another tenant's upstream, a bad value
    or a name or model past 200 characters."""
    if not targets or len(targets) > 20:
        raise ValidationError("A route has 1 to 20 targets.")
    if prefer not in ("order", "quality") or retry_target not in ("", "next", "same"):
        raise ValidationError("prefer is order or quality; retry_target is next or same.")
    if not public_name or len(public_name) > 200 or any(len(m) > 200 for _, m in targets):
        raise ValidationError("A route's model name and upstream models have 1 to 200 characters.")
    if any(u.tenant_id != tenant.pk for u, _ in targets):
        raise ValidationError("A route's upstreams belong to its tenant.")
    (first, model), *rest = targets
    with transaction.atomic():
        route, _ = ModelRoute.objects.update_or_create(
            tenant=tenant, public_name=public_name,
            defaults={"upstream": first, "upstream_model": model, "prefer": prefer, "retry_target": retry_target,
                      **({} if continue_text is None else {"continue_text": continue_text})})
        route.fallbacks.all().delete()
        RouteFallback.objects.bulk_create(RouteFallback(route=route, position=i, upstream=u, model=m)
                                          for i, (u, m) in enumerate(rest, start=1))
    return route


@dataclass(frozen=True, slots=True)
class Provisioned:
    """What ``provision`` did: the tenant, its default upstream, whether it was new, and a new key."""

    tenant: Tenant
    upstream: Upstream
    created: bool
    api_key: ApiKey | None
    raw_key: str | None


#: The name of the key ``provision`` makes; later ones get ``-2``, ``-3`` ... (``distinct_key_name``).
PROVISIONED_KEY_NAME = "provisioned"


def distinct_key_name(*, tenant: Tenant, name: str) -> str:
    """``name``, or ``name-2``, ``name-3`` ... : the first no key of ``tenant`` has (revoked ones count)."""
    taken = set(ApiKey.objects.filter(tenant=tenant, name__startswith=name).values_list("name", flat=True))
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    return candidate


@transaction.atomic
def provision(*, tenant_name: str, upstream_url: str | None, upstream_key: str | None = None,
              routes: dict[str, str] | None = None, new_key: bool | None = True,
              key_name: str = PROVISIONED_KEY_NAME) -> Provisioned:
    """Create or update a tenant, its ``default`` upstream and routes, idempotently.

    ``upstream_url`` None keeps the stored default upstream's URL (to rotate ``upstream_key`` alone);
    a tenant without one then raises ``ValidationError``. ``routes`` maps public model names to upstream
    model names. ``new_key``: True makes a fresh API key, False none, None one only when the tenant has
    no usable key (a new tenant). The key is called ``key_name``, made distinct (``key_name-2`` ...), and
    returned raw, once.
    """
    tenant, created = tenant_ensure(name=tenant_name)
    existing = Upstream.objects.filter(tenant=tenant, name="default").first()
    if upstream_url is None:
        if existing is None:
            raise ValidationError(f"tenant {tenant_name!r} has no upstream yet: give its URL (--upstream-url)")
        upstream_url = existing.base_url
    upstream = upstream_upsert(tenant=tenant, name="default", base_url=upstream_url, credential=upstream_key)
    if tenant.default_upstream_id != upstream.pk:
        tenant.default_upstream = upstream
        tenant.save(update_fields=["default_upstream"])
    for public, target in (routes or {}).items():
        route_upsert(tenant=tenant, public_name=public, upstream=upstream, upstream_model=target)
    if new_key is None:
        new_key = not ApiKey.objects.for_tenant(tenant).active().exists()
    key, raw = None, None
    if new_key:
        key, raw = api_key_create(tenant=tenant, name=distinct_key_name(tenant=tenant, name=key_name))
    return Provisioned(tenant, upstream, created, key, raw)


@transaction.atomic
def upstream_credentials_rotate() -> int:
    """Re-encrypt every stored credential and extra-headers blob under the newest ``CREDENTIAL_KEYS`` key.

    All or nothing: a row no configured key opens raises ``crypto.CredentialError`` and nothing is
    changed. Returns the number of upstreams rewritten.
    """
    count = 0
    for upstream in Upstream.objects.select_for_update().exclude(credential_encrypted="", extra_headers_encrypted=""):
        if upstream.credential_encrypted:
            upstream.credential_encrypted = crypto.rotate(upstream.credential_encrypted)
        if upstream.extra_headers_encrypted:
            upstream.extra_headers_encrypted = crypto.rotate(upstream.extra_headers_encrypted)
        upstream.save(update_fields=["credential_encrypted", "extra_headers_encrypted"])
        count += 1
    return count
