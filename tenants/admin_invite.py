"""The admin's "add a person" page for a tenant's admins (``MembershipAdmin.add_view`` for non-superusers).

A tenant admin adds a **new** account to a tenant they manage, with the ``member`` role, and sets what the
person may do: how many keys (``max_keys``), which models or routes (``allowed_models``), their limits and
money budgets (within the tenant's). The page then shows the invitation link once (``/account/invite/...``,
where the person sets a password; ``tenants.services.member_invite``) and e-mails it when an address is
given (``invitation_mail``). A person who has not taken their invitation gets a new link from their
membership's page (``MembershipAdmin.reinvite_view``: the older links stop working, ``member_reinvite``).
Existing accounts and roles that see the admin are a superuser's to grant (the ordinary add form). The new
membership is a row of that tenant only: another tenant's admin neither lists it nor reaches its pages
(``TenantScopedAdmin``).
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from tenants.limits import HOLDER_NAMES
from tenants.models import Membership, Tenant
from tenants.services import Invited, invitation_mail, member_invite


class MemberInviteForm(forms.ModelForm):  # type: ignore[type-arg]
    """A new person: user name and e-mail (a new account), the tenant, and what they may do."""

    username = forms.CharField(max_length=150, help_text="The person's name (letters, digits, .+-_); the account "
                                                        "is <name>@<tenant slug>.")
    email = forms.EmailField(required=False, help_text="Optional: the invitation is e-mailed there; shown to the "
                                                       "tenant's admins only.")

    class Meta:
        model = Membership
        fields = ("tenant", "max_keys", "allowed_models", *HOLDER_NAMES)

    def __init__(self, *args: Any, tenants: QuerySet[Tenant], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].queryset = tenants  # type: ignore[attr-defined]
        self.order_fields(["username", "email", "tenant", "max_keys", "allowed_models"])

    def _post_clean(self) -> None:
        """The membership is validated by ``member_invite`` (with its user); nothing here."""

    def invite(self) -> Invited:
        """Create the account and membership (``member_invite``); a ``ValidationError`` becomes form errors."""
        data = self.cleaned_data
        limits = {n: data[n] for n in HOLDER_NAMES if data.get(n) is not None}
        models = data.get("allowed_models") or []
        if isinstance(models, str):
            models = json.loads(models)
        return member_invite(tenant=data["tenant"], username=data["username"], email=data.get("email") or "",
                             max_keys=data["max_keys"], allowed_models=models, limits=limits)


def invite_or_errors(form: MemberInviteForm) -> Invited | None:
    """The invitation when the form is valid and the service accepts it; else None, with the form's errors."""
    if not form.is_valid():
        return None
    try:
        return form.invite()
    except ValidationError as exc:
        if hasattr(exc, "error_dict"):
            for name, errors in exc.error_dict.items():
                form.add_error(name if name in form.fields else None, errors)
        else:
            form.add_error(None, exc)
        return None


def invite_link(request: HttpRequest, invited: Invited) -> str:
    """The absolute invitation URL (``SITE_URL`` when set, else this request's host)."""
    base = str(getattr(settings, "SITE_URL", "") or "").rstrip("/")
    return f"{base}{invited.invite_path}" if base else request.build_absolute_uri(invited.invite_path)


def invitation_context(request: HttpRequest, invited: Invited, *, again: bool = False) -> dict[str, Any]:
    """What the invitation page shows once: the link, whether it was e-mailed (sent now), and its wording."""
    link = invite_link(request, invited)
    person = invited.membership.user.get_username()
    hours = settings.PASSWORD_RESET_TIMEOUT // 3600
    voided = " (the links sent before no longer work)" if again else ""
    return {"invited": invited, "link": link, "emailed": invitation_mail(invited=invited, url=link),
            "secret_label": f"Invitation for {person} ({invited.membership.tenant.name})",
            "secret_note": f"This invitation link is shown once{voided}. Send it to {person}: on it they choose a "
                           f"password (it works once, for {hours} hours), then sign in at /account/login/ as "
                           f"{person} and create their own keys."}
