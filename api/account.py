"""The self-service key page: a person signed in (password with the admin's throttling and second factor,
or single sign-on) creates, names, lists and revokes their own keys in each tenant they belong to.

Rows are reached only through ``tenants.selectors`` (``memberships_for_user``, ``api_keys_for_member``):
a key id of anyone else gives the same 404 as a missing one. Creating a key goes through
``tenants.services.member_key_create`` (the member's ``max_keys``; the key serves only the member's
``allowed_models``). The new key is shown once: POST/redirect/GET, the raw key waiting in the session
encrypted (``tenants.crypto``) until the next page load, as the admin does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse, reverse_lazy
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from audit.people import key_tokens, member_totals
from tenants import crypto
from tenants.admin_site import LoginForm
from tenants.models import Membership
from tenants.selectors import (
    NotFound,
    api_key_for_member,
    api_keys_for_member,
    membership_for_user,
    memberships_for_user,
)
from tenants.services import api_key_revoke, member_key_create

NEW_KEY_SESSION = "toolrelay_account_new_key"
LOGIN_URL = reverse_lazy("account:login")
#: The usage shown beside the keys covers this many days.
USAGE_DAYS = 30


class AccountLoginForm(LoginForm):
    """The admin's login form (axes throttling, the one-time code for users with a device) for any active
    user, staff or not: the page itself shows only the user's own keys."""

    def confirm_login_allowed(self, user: Any) -> None:
        AuthenticationForm.confirm_login_allowed(self, user)


class KeyForm(forms.Form):
    """A new key: which membership (tenant), its name, and an optional lifetime in days."""

    membership = forms.IntegerField(widget=forms.HiddenInput)
    name = forms.CharField(max_length=100, label="Name", help_text="What it is for, e.g. 'laptop' or 'ci'.")
    days = forms.IntegerField(required=False, min_value=1, max_value=3650, label="Expires after (days)",
                              help_text="Empty: never.")


class AccountLoginView(auth_views.LoginView):
    """``/account/login/``: the admin's login, for people; single sign-on offered when configured."""

    template_name = "account/login.html"
    authentication_form = AccountLoginForm
    redirect_authenticated_user = True
    next_page = "/account/keys/"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {**super().get_context_data(**kwargs), "oidc_enabled": settings.OIDC_ENABLED,
                "site_header": "toolrelay", "title": "Sign in"}


class AccountInviteView(auth_views.PasswordResetConfirmView):
    """``/account/invite/<uid>/<token>/``: a person a tenant admin added (``tenants.services.member_invite``)
    sets their password, then signs in. Django's password-reset token: it expires after
    ``PASSWORD_RESET_TIMEOUT`` seconds and once a password is set (the token hashes the password); the
    password validators apply. An invalid or used link says so and sets nothing."""

    template_name = "account/invite.html"
    success_url = reverse_lazy("account:login")
    post_reset_login = False

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {**super().get_context_data(**kwargs), "site_header": "toolrelay", "title": "Set your password"}


def _context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {"site_header": "toolrelay", "site_title": "toolrelay", "title": "Your API keys",
            "base_url": f"{settings.SITE_URL}/v1", "site_url": settings.SITE_URL, **extra}


def _panel(request: HttpRequest, membership: Membership, form: KeyForm | None) -> dict[str, Any]:
    """One tenant's section of the page: the member's keys with their recent use, limits and the create form."""
    now = timezone.now()
    since = now - timedelta(days=USAGE_DAYS)
    used = key_tokens(membership.pk, membership.tenant_id, since=since)
    keys = list(api_keys_for_member(membership))
    usable = sum(1 for k in keys if k.is_usable(now))
    return {"membership": membership, "usable": usable, "can_create": usable < membership.max_keys,
            "keys": [{"key": k, "status": "revoked" if k.revoked_at else "active" if k.is_usable(now) else "expired",
                      "use": used.get(k.pk, {"requests": 0, "tokens": 0})} for k in keys],
            "totals": member_totals(membership.pk, membership.tenant_id, since=since, until=now),
            "form": form if form is not None and form.data.get("membership") == str(membership.pk)
            else KeyForm(initial={"membership": membership.pk}, auto_id=f"id_{membership.pk}_%s"),
            "models": membership.allowed_models or [], "limits": membership.limits().as_json()}


@never_cache
@login_required(login_url=LOGIN_URL)
def keys(request: HttpRequest, form: KeyForm | None = None) -> HttpResponse:
    """``GET /account/keys/``: every membership of the user with its keys; a key just created, once."""
    new_key = None
    pending = request.session.pop(NEW_KEY_SESSION, None)
    if isinstance(pending, dict):
        new_key = {"name": str(pending.get("name", ""))[:100], "tenant": str(pending.get("tenant", ""))[:100],
                   "raw": crypto.decrypt(str(pending.get("token", "")))}
    panels = [_panel(request, m, form) for m in memberships_for_user(request.user)]
    response = TemplateResponse(request, "account/keys.html", _context(request, panels=panels, new_key=new_key,
                                                                      usage_days=USAGE_DAYS),
                                status=400 if form is not None else 200)
    response["Cache-Control"] = "no-store"
    return response


@never_cache
@login_required(login_url=LOGIN_URL)
@require_POST
def create(request: HttpRequest) -> HttpResponse:
    """``POST /account/keys/create/``: a new key of one of the user's memberships (within its ``max_keys``)."""
    form = KeyForm(request.POST)
    if not form.is_valid():
        return keys(request, form)
    try:
        membership = membership_for_user(request.user, form.cleaned_data["membership"])
    except NotFound:
        raise Http404("No such membership.") from None
    days = form.cleaned_data.get("days")
    try:
        key, raw = member_key_create(membership=membership, name=form.cleaned_data["name"],
                                     expires=timezone.now() + timedelta(days=days) if days else None)
    except ValidationError as exc:
        form.add_error(None, exc)
        return keys(request, form)
    request.session[NEW_KEY_SESSION] = {"name": key.name, "tenant": membership.tenant.name,
                                        "token": crypto.encrypt(raw)}
    return HttpResponseRedirect(reverse("account:keys"))


@never_cache
@login_required(login_url=LOGIN_URL)
@require_POST
def revoke(request: HttpRequest, membership_id: int, key_id: int) -> HttpResponse:
    """``POST /account/keys/<membership>/<key>/revoke/``: revoke one of the user's own keys (404 otherwise)."""
    try:
        key = api_key_for_member(membership_for_user(request.user, membership_id), key_id)
    except NotFound:
        raise Http404("No such key.") from None
    api_key_revoke(key=key)
    messages.success(request, f"Revoked {key.display} ({key.name}).")
    return HttpResponseRedirect(reverse("account:keys"))
