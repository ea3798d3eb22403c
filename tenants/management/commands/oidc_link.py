"""``manage.py oidc_link --user NAME --subject SUB``: link an existing account to a single sign-on subject.

Single sign-on matches users on this link only (``tenants.oidc``), never by e-mail; superusers are never
signed in through it, so linking one is refused. ``--unlink`` removes a user's link.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.models import OidcIdentity


class Command(BaseCommand):
    help = "Link a user to the identity provider's subject (the `sub` claim) it signs in as."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True, help="The user name.")
        parser.add_argument("--subject", help="The identity provider's `sub` claim for this user.")
        parser.add_argument("--unlink", action="store_true", help="Remove the user's link instead.")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"no user {options['user']!r}")
        if options["unlink"]:
            OidcIdentity.objects.filter(user=user).delete()
            self.stdout.write(f"{user.username}: single sign-on link removed")
            return
        subject = (options.get("subject") or "").strip()
        if not subject or len(subject) > 255:
            raise CommandError("--subject is required (1 to 255 characters)")
        if user.is_superuser:
            raise CommandError("superusers never sign in through single sign-on: they log in with their password "
                               "and second factor")
        taken = OidcIdentity.objects.filter(subject=subject).exclude(user=user).first()
        if taken is not None:
            raise CommandError(f"that subject is already linked to {taken.user.username!r}")
        OidcIdentity.objects.update_or_create(user=user, defaults={"subject": subject})
        self.stdout.write(f"{user.username}: signs in as subject {subject!r}")
