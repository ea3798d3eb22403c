"""Single sign-on for the admin (mozilla-django-oidc), matched on a stored subject (issue 24 item 5).

mozilla-django-oidc's backend matches users by e-mail, ignores ``email_verified``, and the admin counted
every single sign-on session as second-factor verified: an identity-provider user with an unverified
``root@...`` address landed in the admin as the superuser. ``ToolrelayOIDCBackend``:

- requires ``sub`` and ``email_verified: true`` in the claims (else no login);
- matches the user whose ``OidcIdentity.subject`` is the claims' ``sub``, never by e-mail; an unknown
  subject gets a new user (no staff status, ``OIDC_CREATE_USER``) linked to it, never an existing account.
  An existing account is linked by an operator: ``manage.py oidc_link --user NAME --subject SUB``;
- never signs a superuser in: superusers log in with their password and second factor (the admin also
  refuses a single sign-on session of a user that has become a superuser: ``tenants.admin_site``).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.db import IntegrityError, transaction
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from tenants.models import OidcIdentity

logger = logging.getLogger(__name__)


class ToolrelayOIDCBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """The OIDC backend of ``AUTHENTICATION_BACKENDS`` (module docstring)."""

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        """A non-empty string ``sub`` and ``email_verified`` exactly ``true`` (a string "true" is not)."""
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject or len(subject) > 255:
            logger.warning("single sign-on refused: the claims carry no usable subject")
            return False
        if claims.get("email_verified") is not True:
            logger.warning("single sign-on refused for subject %r: its e-mail address is not verified", subject[:80])
            return False
        return bool(super().verify_claims(claims))

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        """The user linked to the claims' subject (none or one; never a match by e-mail)."""
        return self.UserModel.objects.filter(oidc_identity__subject=claims.get("sub"))

    def describe_user_by_claims(self, claims: dict[str, Any]) -> str:
        return f"subject {str(claims.get('sub'))[:80]!r}"

    def get_username(self, claims: dict[str, Any]) -> str:
        """``oidc-`` and a digest of the subject (unique per subject; the e-mail plays no part)."""
        return "oidc-" + hashlib.sha256(str(claims["sub"]).encode()).hexdigest()[:24]

    def create_user(self, claims: dict[str, Any]) -> Any:
        """A new user without staff status, linked to the claims' subject."""
        try:
            with transaction.atomic():
                user = self.UserModel.objects.create_user(self.get_username(claims), email=claims.get("email", ""))
                OidcIdentity.objects.create(user=user, subject=claims["sub"])
        except IntegrityError:
            logger.warning("single sign-on refused for %s: its user name is taken",
                           self.describe_user_by_claims(claims))
            return None
        return user

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        """mozilla-django-oidc's, then: a superuser is never signed in this way."""
        user = super().get_or_create_user(access_token, id_token, payload)
        if user is not None and user.is_superuser:
            logger.warning("single sign-on refused for superuser %s: superusers log in with their password and "
                           "second factor", user.get_username())
            return None
        return user
