"""``demo_setup``: first run of ``make run`` creates an admin user and a demo tenant; later runs only print.

The demo tenant's default upstream is ``$UPSTREAM_URL`` (with ``$UPSTREAM_API_KEY``) or, when unset,
the built-in simulator on ``http://127.0.0.1:${SIMULATOR_PORT:-8001}/v1`` that ``make run`` starts (a
later run on another ``SIMULATOR_PORT`` moves the demo tenant to it). The first run's password and
key are printed once and also written to ``var/demo-credentials.txt`` (mode 600).
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from config.env import envint, envstr
from tenants.management.commands._common import client_urls
from tenants.models import Tenant
from tenants.services import provision, upstream_upsert

DEMO_TENANT = "demo"
ADMIN_USER = "admin"
CREDENTIALS_FILE = "demo-credentials.txt"
#: A demo upstream that is the local simulator (``make run`` starts it on ``SIMULATOR_PORT``).
SIMULATOR_URL = re.compile(r"^http://127\.0\.0\.1:(\d+)/v1$")


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
        parser.add_argument("--credentials-file", type=Path, default=None,
                            help=f"Where the first run also writes login and key (default var/{CREDENTIALS_FILE}).")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(name=DEMO_TENANT).select_related("default_upstream").first()
        if tenant is not None:
            self._follow_simulator(tenant)
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
        lines = [
            f"Admin:    {settings.SITE_URL}/admin/   {login}",
            f"Upstream: {url}{simulated}",
            f"API key:  {result.raw_key}   (shown this once; not stored)",
            *client_urls(),
        ]
        path = options["credentials_file"] or Path(settings.VAR_DIR) / CREDENTIALS_FILE
        write_private(path, "\n".join(["# toolrelay demo, first run. Store these elsewhere, then delete this file.",
                                       *lines, ""]))
        self.stdout.write("\n".join([
            "", "toolrelay demo is set up (this is printed once).", "", *lines, "",
            f"The login and the key are also in {path.resolve()} (mode 600; delete it once you have stored them).",
            "Try: .venv/bin/python scripts/tool_call_demo.py --key <the API key above>",
            "",
        ]))

    def _follow_simulator(self, tenant: Tenant) -> None:
        """Point the demo tenant at the simulator's current port when it runs on another one."""
        upstream = tenant.default_upstream
        match = SIMULATOR_URL.match(upstream.base_url) if upstream is not None else None
        url, key = demo_upstream()
        if upstream is None or match is None or envstr("UPSTREAM_URL").strip() or upstream.base_url == url:
            return
        upstream_upsert(tenant=tenant, name=upstream.name, base_url=url)
        self.stdout.write(f"The simulator now runs on port {envint('SIMULATOR_PORT', 8001)}: the demo tenant's "
                          f"upstream moved from {upstream.base_url} to {url}.")

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


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (mode 600, also when it existed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)
