"""``credential_key``: print a new Fernet key; ``--rotate`` re-encrypts stored secrets under the newest key."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants import crypto
from tenants.services import upstream_credentials_rotate


class Command(BaseCommand):
    help = (
        "Print a new key for CREDENTIAL_KEYS. With --rotate, re-encrypt every stored upstream credential and "
        "extra-headers value under the first (newest) key of CREDENTIAL_KEYS."
    )
    # Generating the first key must work while the system checks still complain that there is none.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rotate", action="store_true",
                            help="Re-encrypt stored credentials under the newest key (put the new key first).")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["rotate"]:
            self.stdout.write(crypto.generate_key())
            return
        try:
            count = upstream_credentials_rotate()
        except crypto.CredentialError as exc:
            raise CommandError(f"{exc}; nothing was changed (is an old key missing from CREDENTIAL_KEYS?)") from exc
        self.stdout.write(f"Re-encrypted the secrets of {count} upstream(s) under the newest key. "
                          "Older keys can now be removed from CREDENTIAL_KEYS.")
