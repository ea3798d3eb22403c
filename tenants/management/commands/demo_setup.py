"""``demo_setup``: first run of ``make run`` creates an admin user and a demo tenant; later runs change nothing.

The demo tenant's default upstream is ``$UPSTREAM_URL`` (with ``$UPSTREAM_API_KEY``) or, when unset,
the built-in simulator on ``http://127.0.0.1:${SIMULATOR_PORT:-8001}/v1`` that ``make run`` starts.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from config.env import envint, envstr
from tenants.management.commands._common import client_urls
from tenants.models import Tenant
from tenants.services import provision

DEMO_TENANT = "demo"
ADMIN_USER = "admin"


def demo_upstream() -> tuple[str, str | None]:
    """``(url, key)`` of the demo's upstream: ``$UPSTREAM_URL`` or the local simulator."""
    url = envstr("UPSTREAM_URL").strip()
    if url:
        return url, envstr("UPSTREAM_API_KEY").strip() or None
    return f"http://127.0.0.1:{envint('SIMULATOR_PORT', 8001)}/v1", None


class Command(BaseCommand):
    help = "Create the demo admin user and tenant on first run and print how to use them; later runs only print."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--admin-user", default=ADMIN_USER, help="Superuser name (default: admin).")

    def handle(self, *args: Any, **options: Any) -> None:
        if Tenant.objects.filter(name=DEMO_TENANT).exists():
            self._print_again()
            return
        url, key = demo_upstream()
        # One transaction: a failed first run leaves nothing behind, so the next run starts afresh
        # instead of finding an admin whose password was never printed.
        try:
            with transaction.atomic():
                login = self._create_admin(options["admin_user"])
                result = provision(tenant_name=DEMO_TENANT, upstream_url=url, upstream_key=key)
        except ValidationError as exc:
            raise CommandError(f"the demo upstream {url} is refused: {'; '.join(exc.messages)} "
                               "(`make run` allows its simulator with UPSTREAM_ALLOW_NETWORKS=127.0.0.1/32)") from None
        simulated = "   (the built-in simulator: it corrupts some tool calls on purpose)" if key is None and \
            not envstr("UPSTREAM_URL").strip() else ""
        self.stdout.write("\n".join([
            "",
            "toolrelay demo is set up (this is printed once).",
            "",
            f"Admin:    {settings.SITE_URL}/admin/   {login}",
            f"Upstream: {url}{simulated}",
            f"API key:  {result.raw_key}   (shown this once; not stored)",
            *client_urls(),
            "",
        ]))

    def _create_admin(self, username: str) -> str:
        user_model = get_user_model()
        if user_model.objects.filter(username=username).exists():
            return f"user {username!r} already exists (password unchanged)"
        password = secrets.token_urlsafe(12)
        user_model.objects.create_superuser(username=username, email="", password=password)
        return f"user {username!r}, password {password}"

    def _print_again(self) -> None:
        self.stdout.write("\n".join([
            "",
            f"toolrelay demo: admin at {settings.SITE_URL}/admin/ (user {ADMIN_USER!r}; password as printed on "
            "the first run, or `python manage.py changepassword admin`).",
            f"API keys are shown only when created; make a new one with: "
            f"python manage.py apikey create --tenant {DEMO_TENANT}",
            *client_urls(),
            "",
        ]))
