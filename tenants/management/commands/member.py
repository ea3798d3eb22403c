"""``member add|show|remove --tenant T --user U``: people of a tenant from the shell (docs/people.md).

``add --tenant T --user U [--role member|viewer|admin] [--max-keys N] [--models a,b*]`` creates the
membership (an existing user; ``--create-user`` makes one with no usable password, for single sign-on)
or updates it; ``show --tenant T [--json]`` lists the tenant's people; ``remove`` deletes a membership,
which revokes the person's keys.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from tenants.management.commands._common import tenant_named
from tenants.models import Membership
from tenants.selectors import NotFound, member_for_tenant, members_for_tenant
from tenants.services import membership_save


class Command(BaseCommand):
    help = "Add, show or remove the people (memberships) of a tenant."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{add,show,remove}")
        add = actions.add_parser("add", help="Add a person to the tenant, or change their membership.")
        add.add_argument("--tenant", required=True)
        add.add_argument("--user", required=True, help="User name.")
        add.add_argument("--role", choices=[Membership.MEMBER, Membership.VIEWER, Membership.ADMIN])
        add.add_argument("--max-keys", type=int, help="Usable keys the person may hold (default 5).")
        add.add_argument("--models", help="Comma-separated model names or globs their keys may use ('' = all).")
        add.add_argument("--create-user", action="store_true",
                         help="Create the user if missing (no usable password: single sign-on or a reset).")
        show = actions.add_parser("show", help="List the tenant's people.")
        show.add_argument("--tenant", required=True)
        show.add_argument("--json", action="store_true")
        remove = actions.add_parser("remove", help="Remove a person (their keys are revoked).")
        remove.add_argument("--tenant", required=True)
        remove.add_argument("--user", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_named(options["tenant"])
        if options["action"] == "show":
            rows: list[dict[str, Any]] = [{"user": m.user.get_username(), "role": m.role, "max_keys": m.max_keys,
                     "allowed_models": list(m.allowed_models or []), "limits": m.limits().as_json()}
                    for m in members_for_tenant(tenant)]
            if options["json"]:
                self.stdout.write(json.dumps({"tenant": tenant.name, "members": rows}))
            for row in [] if options["json"] else rows:
                models = ", ".join(row["allowed_models"]) or "every model"
                self.stdout.write(f"{row['user']}\t{row['role']}\tmax {row['max_keys']} keys\t{models}")
            return
        if options["action"] == "remove":
            try:
                member_for_tenant(tenant, options["user"]).delete()
            except NotFound:
                raise CommandError(f"{options['user']!r} is not a member of {tenant.name}") from None
            self.stdout.write(f"removed {options['user']} from {tenant.name}; their keys are revoked")
            return
        self._add(tenant, options)

    @transaction.atomic
    def _add(self, tenant: Any, options: dict[str, Any]) -> None:
        users = get_user_model()
        user = users.objects.filter(username=options["user"]).first()
        if user is None:
            if not options["create_user"]:
                raise CommandError(f"no user {options['user']!r} (add --create-user to create one)")
            user = users.objects.create_user(username=options["user"], password=None)
        membership = Membership.objects.filter(user=user, tenant=tenant).first() or Membership(
            user=user, tenant=tenant, role=Membership.MEMBER)
        if options["role"]:
            membership.role = options["role"]
        if options["max_keys"] is not None:
            membership.max_keys = options["max_keys"]
        if options["models"] is not None:
            membership.allowed_models = [m.strip() for m in options["models"].split(",") if m.strip()]
        try:
            membership_save(membership=membership)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stdout.write(f"{user.get_username()} is {membership.role} of {tenant.name}; may hold "
                          f"{membership.max_keys} key(s) for {', '.join(membership.allowed_models) or 'every model'}")
