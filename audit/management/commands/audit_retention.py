"""``audit_retention``: purge raw fragments past each tenant's retention days now (what beat runs daily)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from audit.report_services import retention_purge


class Command(BaseCommand):
    help = "Delete raw fragments older than each tenant's retention days (default 30); counts and kinds stay."

    def handle(self, *args: Any, **options: Any) -> None:
        result = retention_purge()
        self.stdout.write(f"deleted {result.fragments} attempt bodies, cleared {result.finding_fragments} "
                          "finding fragments")
