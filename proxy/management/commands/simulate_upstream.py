"""``manage.py simulate_upstream --port P``: run the fault-injecting upstream simulator.

A thin wrapper over :mod:`proxy.simulator.cli` (the server itself imports nothing from Django).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from proxy.simulator.cli import add_arguments, run


class Command(BaseCommand):
    help = "Run the fault-injecting OpenAI-compatible upstream simulator (see docs/simulator.md)."
    # The simulator needs no database or settings checks; the demo must start even before migrate.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run(options, out=self.stdout)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
